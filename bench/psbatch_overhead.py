"""psbatch overhead: median wall time of N submissions with sbatch and with psbatch, for a
Megatron script (enriched: parsed, validated, rewritten) and a plain one (passed through).

Needs a Slurm controller (tests/slurm/testbed.sh up; source its env.sh). Jobs are
submitted held (-H) and cancelled at the end. Prints JSON; never passes or fails on time.

    python bench/psbatch_overhead.py [-n 30] [--psbatch "python3 -m pipeswift_slurm.psbatch"]
"""

from __future__ import annotations

import argparse
import json
import re
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

MEGATRON = """#!/bin/bash
#SBATCH --gpus=4
#SBATCH --time=10
ARGS="--num-layers 24 --hidden-size 1024 --num-attention-heads 16 --seq-length 2048"
torchrun --nproc-per-node 4 pretrain_gpt.py $ARGS --micro-batch-size 2 --global-batch-size 64 \\
    --pipeline-model-parallel-size 2 --train-iters 1000 --bf16
"""
PLAIN = "#!/bin/bash\n#SBATCH --gpus=1\n#SBATCH --time=10\nsrun hostname\n"


def _time(cmd: list[str], cwd: Path, ids: list[str]) -> float:
    start = time.perf_counter()
    done = subprocess.run(cmd, capture_output=True, text=True, cwd=cwd, check=False)
    elapsed = time.perf_counter() - start
    if done.returncode:
        sys.exit("submission failed: %s" % done.stderr.strip())
    ids.extend(re.findall(r"\d+", done.stdout)[:1])
    return elapsed


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-n", type=int, default=30, help="submissions per variant")
    default = shutil.which("psbatch") or "%s -m pipeswift_slurm.psbatch" % sys.executable
    ap.add_argument("--psbatch", default=default, help="psbatch command line (default: %(default)s)")
    args = ap.parse_args()
    psbatch = shlex.split(args.psbatch)
    ids: list[str] = []
    result: dict[str, object] = {"n": args.n, "psbatch": args.psbatch}
    with tempfile.TemporaryDirectory() as tmp:
        cwd = Path(tmp)
        for name, text in (("megatron", MEGATRON), ("plain", PLAIN)):
            (cwd / (name + ".sh")).write_text(text)
            times: dict[str, list[float]] = {"sbatch": [], "psbatch": []}
            for _ in range(args.n):  # interleaved, so drift hits both alike
                times["sbatch"].append(_time(["sbatch", "-H", name + ".sh"], cwd, ids))
                times["psbatch"].append(_time(psbatch + ["-H", name + ".sh"], cwd, ids))
            sb, ps = statistics.median(times["sbatch"]), statistics.median(times["psbatch"])
            result[name] = {"sbatch_median_s": round(sb, 5), "psbatch_median_s": round(ps, 5),
                            "ratio": round(ps / sb, 3), "goal_ratio": 1.2}
        for chunk in range(0, len(ids), 200):
            subprocess.run(["scancel", *ids[chunk:chunk + 200]], capture_output=True, check=False)
    json.dump(result, sys.stdout, indent=2)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
