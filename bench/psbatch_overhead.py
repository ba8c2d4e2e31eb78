"""psbatch overhead against sbatch, side by side in one run: median wall time of N
submissions each of a plain job (passed straight through) and a Megatron job (enriched:
parsed, validated, rewritten), with ``sbatch`` and with ``psbatch`` exactly as a user gets
it from ``pip install .`` (the compiled front end when a C compiler was there). Goals
(issue 22): plain <= 1.1 x sbatch; Megatron <= sbatch's median + 50 ms.

Needs a Slurm controller (tests/slurm/testbed.sh up; source its env.sh) and an installed
psbatch (``--psbatch PATH``; default: a fresh venv in a temporary folder, ``pip install``
of this checkout). Jobs are submitted held (-H) and cancelled at the end. Submissions are
interleaved, in a new random order each round (seeded), so drift hits every variant
alike. Prints JSON; never passes or fails on time.

    python bench/psbatch_overhead.py [-n 100] [--psbatch PATH] [--seed S]
"""

from __future__ import annotations

import argparse
import json
import random
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Optional

ROOT = Path(__file__).resolve().parents[1]
MEGATRON = """#!/bin/bash
#SBATCH --gpus=4
#SBATCH --time=10
ARGS="--num-layers 24 --hidden-size 1024 --num-attention-heads 16 --seq-length 2048"
torchrun --nproc-per-node 4 pretrain_gpt.py $ARGS --micro-batch-size 2 --global-batch-size 64 \\
    --pipeline-model-parallel-size 2 --train-iters 1000 --bf16
"""
PLAIN = "#!/bin/bash\n#SBATCH --gpus=1\n#SBATCH --time=10\nsrun hostname\n"
PLAIN_GOAL_RATIO = 1.1
MEGATRON_GOAL_ADDED_MS = 50.0


def _time(cmd: list[str], cwd: Path, ids: list[str]) -> float:
    start = time.perf_counter()
    done = subprocess.run(cmd, capture_output=True, text=True, cwd=cwd, check=False)
    elapsed = time.perf_counter() - start
    if done.returncode:
        sys.exit("submission failed (%s): %s" % (" ".join(cmd), done.stderr.strip()))
    ids.extend(re.findall(r"\d+", done.stdout)[:1])
    return elapsed


def install(folder: Path) -> str:
    """``python3 -m venv`` + ``pip install`` of this checkout; the venv's psbatch."""
    subprocess.run([sys.executable, "-m", "venv", str(folder)], check=True)
    subprocess.run([str(folder / "bin" / "pip"), "install", "-q", str(ROOT)], check=True)
    return str(folder / "bin" / "psbatch")


def kind(path: str) -> str:
    """What the installed psbatch is: the compiled front end or the Python script."""
    with open(path, "rb") as fh:
        return "compiled front end" if fh.read(4) == b"\x7fELF" else "Python entry point"


def run(n: int, psbatch: str, work: Path, seed: int) -> dict[str, object]:
    """Time n rounds of the four variants, interleaved; medians in ms and the goals."""
    sbatch = shutil.which("sbatch") or "sbatch"
    (work / "plain.sh").write_text(PLAIN)
    (work / "meg.sh").write_text(MEGATRON)
    variants = {"sbatch_plain": [sbatch, "-H", "plain.sh"], "psbatch_plain": [psbatch, "-H", "plain.sh"],
                "sbatch_megatron": [sbatch, "-H", "meg.sh"], "psbatch_megatron": [psbatch, "-H", "meg.sh"]}
    times: dict[str, list[float]] = {name: [] for name in variants}
    ids: list[str] = []
    rng = random.Random(seed)
    try:
        for name in variants:  # warm-up, not counted
            _time(variants[name], work, ids)
        for _ in range(n):
            order = list(variants)
            rng.shuffle(order)
            for name in order:
                times[name].append(_time(variants[name], work, ids))
    finally:
        for start in range(0, len(ids), 500):
            subprocess.run(["scancel", *ids[start:start + 500]], check=False)
    ms = {name: round(statistics.median(t) * 1e3, 2) for name, t in times.items()}
    plain_ratio = ms["psbatch_plain"] / ms["sbatch_plain"]
    added_ms = ms["psbatch_megatron"] - ms["sbatch_megatron"]
    return {"n": n, "psbatch": psbatch, "psbatch_is": kind(psbatch), "median_ms": ms,
            "plain_ratio": round(plain_ratio, 3), "plain_goal_met": plain_ratio <= PLAIN_GOAL_RATIO,
            "megatron_added_ms": round(added_ms, 2), "megatron_goal_met": added_ms <= MEGATRON_GOAL_ADDED_MS}


def main(argv: Optional[list[str]] = None) -> int:
    """Command line: see the module docstring."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("-n", type=int, default=100, help="rounds (submissions per variant)")
    ap.add_argument("--psbatch", help="installed psbatch to time (default: pip install into a fresh venv)")
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="psbatch-bench-") as tmp:
        psbatch = args.psbatch or install(Path(tmp) / "venv")
        work = Path(tmp) / "work"
        work.mkdir()
        print(json.dumps(run(args.n, psbatch, work, args.seed), indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
