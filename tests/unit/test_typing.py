"""The pure core and the policies stay type-clean under mypy's strict settings (setup.cfg [mypy-...])."""

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
STRICT = ["pipeswift_slurm/core", "pipeswift_slurm/policy"]


# The test runs mypy as a module of this interpreter, so that is where it must be installed
# (a mypy on PATH from another environment says nothing about this one).
@pytest.mark.skipif(importlib.util.find_spec("mypy") is None, reason="mypy not installed (the dev extra)")
def test_strict_modules_pass_mypy():
    out = subprocess.run([sys.executable, "-m", "mypy", *STRICT], cwd=ROOT, capture_output=True, text=True,
                         check=False)
    assert out.returncode == 0, out.stdout[-3000:]
