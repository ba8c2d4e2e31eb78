"""The sbatch scripts in ``examples/``: ``psbatch --pipeswift=check`` (nothing submitted,
no cluster needed) recognises each as a Megatron job of the shape and layout it is
written for, and its predicted run time fits its own ``#SBATCH --time``."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"

# script -> (layers, hidden, heads, query groups or None, swiglu, world, nodes x GPUs per node, tp, pp)
EXPECTED = {
    "gpt_1.3b.sbatch": (24, 2048, 16, None, False, 8, "1x8", 2, 1),
    "llama_7b.sbatch": (32, 4096, 32, 8, True, 8, "1x8", 4, 2),
    "gpt_multinode.sbatch": (44, 6144, 48, None, False, 16, "2x8", 8, 2),
}
_UNITS_S = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def _check(script: Path) -> str:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    env.pop("PIPESWIFT_GPU_TYPE", None)
    done = subprocess.run([sys.executable, "-m", "pipeswift_slurm.submit.psbatch", "--pipeswift=check", str(script)],
                          capture_output=True, text=True, env=env, timeout=120, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def test_every_example_is_listed() -> None:
    assert sorted(p.name for p in EXAMPLES.glob("*.sbatch")) == sorted(EXPECTED)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_example_is_recognised_as_the_megatron_job_it_describes(name: str) -> None:
    layers, hidden, heads, groups, swiglu, world, shape, tp, pp = EXPECTED[name]
    out = _check(EXAMPLES / name)
    assert out.startswith("psbatch: this Megatron job would be opted in to PipeSwift")
    model = next(line for line in out.splitlines() if line.strip().startswith("model "))
    assert "%d layers, hidden %d, %d heads" % (layers, hidden, heads) in model
    assert ("query groups" in model) == (groups is not None)
    assert groups is None or "(%d query groups)" % groups in model
    assert ("SwiGLU" in model) == swiglu
    mine = next(line for line in out.splitlines() if line.strip().startswith("your config "))
    assert re.search(r"\b%dgpu=%s tp%d pp%d\b" % (world, shape, tp, pp), mine), mine


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_example_fits_its_own_time_limit(name: str) -> None:
    text = (EXAMPLES / name).read_text()
    hours, minutes, seconds = (int(x) for x in re.search(r"^#SBATCH --time=(\d+):(\d+):(\d+)$", text, re.M).groups())
    limit_s = 3600 * hours + 60 * minutes + seconds
    out = _check(EXAMPLES / name)
    value, unit = re.search(r"your config: ([\d.]+)([smhd]) on", out).groups()
    assert float(value) * _UNITS_S[unit] < limit_s, out
