"""The pure core stays type-clean under mypy's strict settings (setup.cfg [mypy-...])."""

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
STRICT = ["pipeswift_slurm/core/model.py", "pipeswift_slurm/core/megatron.py", "pipeswift_slurm/core/megatron_rules.py",
          "pipeswift_slurm/core/megatron_render.py", "pipeswift_slurm/core/costmodel.py",
          "pipeswift_slurm/policy"]


@pytest.mark.skipif(shutil.which("mypy") is None, reason="mypy not installed (the dev extra)")
def test_strict_modules_pass_mypy():
    out = subprocess.run([sys.executable, "-m", "mypy", *STRICT], cwd=ROOT, capture_output=True, text=True)
    assert out.returncode == 0, out.stdout[-3000:]
