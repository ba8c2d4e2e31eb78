"""psbatch overhead: median wall time of N submissions with sbatch, the Python psbatch and
the compiled psbatch front end (pipeswift_slurm/fast), for a Megatron script (enriched:
parsed, validated, rewritten) and a plain one (passed through).

Needs a Slurm controller (tests/slurm/testbed.sh up; source its env.sh) and, for the
compiled front end, a C compiler (it is built into a temporary folder). Jobs are submitted
held (-H) and cancelled at the end. Submissions are interleaved and the order rotates,
so drift and order effects hit every variant alike. Prints JSON; never passes or fails on time.

    python bench/psbatch_overhead.py [-n 30] [--psbatch "python3 -m pipeswift_slurm.psbatch"]
                                     [--psbatch-fast PATH | --no-fast] [--cc CC]
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
from typing import Optional

MEGATRON = """#!/bin/bash
#SBATCH --gpus=4
#SBATCH --time=10
ARGS="--num-layers 24 --hidden-size 1024 --num-attention-heads 16 --seq-length 2048"
torchrun --nproc-per-node 4 pretrain_gpt.py $ARGS --micro-batch-size 2 --global-batch-size 64 \\
    --pipeline-model-parallel-size 2 --train-iters 1000 --bf16
"""
PLAIN = "#!/bin/bash\n#SBATCH --gpus=1\n#SBATCH --time=10\nsrun hostname\n"
GOAL_RATIO = 1.2


def _time(cmd: list[str], cwd: Path, ids: list[str]) -> float:
    start = time.perf_counter()
    done = subprocess.run(cmd, capture_output=True, text=True, cwd=cwd, check=False)
    elapsed = time.perf_counter() - start
    if done.returncode:
        sys.exit("submission failed (%s): %s" % (" ".join(cmd), done.stderr.strip()))
    ids.extend(re.findall(r"\d+", done.stdout)[:1])
    return elapsed


def _fast_front_end(args: argparse.Namespace, folder: Path) -> Optional[str]:
    if args.no_fast:
        return None
    if args.psbatch_fast:
        return str(args.psbatch_fast)
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from pipeswift_slurm.fast.build import BuildError, build

    try:
        return str(build(folder / "psbatch", cc=args.cc))
    except BuildError as exc:
        sys.exit("cannot build the compiled psbatch: %s (or pass --no-fast)" % exc)


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("-n", type=int, default=30, help="submissions per variant")
    default = shutil.which("psbatch") or "%s -m pipeswift_slurm.psbatch" % sys.executable
    ap.add_argument("--psbatch", default=default, help="Python psbatch command line (default: %(default)s)")
    ap.add_argument("--psbatch-fast", help="a compiled psbatch to use (default: build one in a temp folder)")
    ap.add_argument("--no-fast", action="store_true", help="leave the compiled front end out")
    ap.add_argument("--cc", help="C compiler for the build (default: $CC, else cc)")
    args = ap.parse_args()
    ids: list[str] = []
    with tempfile.TemporaryDirectory() as tmp:
        cwd = Path(tmp)
        fast = _fast_front_end(args, cwd)
        variants = {"sbatch": ["sbatch"], "psbatch": shlex.split(args.psbatch)}
        if fast:
            variants["psbatch_fast"] = [fast]
        result: dict[str, object] = {"n": args.n, "psbatch": args.psbatch, "psbatch_fast": fast}
        for name, text in (("megatron", MEGATRON), ("plain", PLAIN)):
            (cwd / (name + ".sh")).write_text(text)
            times: dict[str, list[float]] = {v: [] for v in variants}
            names = list(variants)
            for k in range(args.n):  # interleaved and rotated, so drift and order hit every variant alike
                for variant in names[k % len(names):] + names[:k % len(names)]:
                    times[variant].append(_time(variants[variant] + ["-H", name + ".sh"], cwd, ids))
            medians = {v: statistics.median(t) for v, t in times.items()}
            sb = medians["sbatch"]
            row: dict[str, object] = {"sbatch_median_s": round(sb, 5),
                                      "psbatch_median_s": round(medians["psbatch"], 5),
                                      "ratio": round(medians["psbatch"] / sb, 3)}
            if fast:
                row.update({"psbatch_fast_median_s": round(medians["psbatch_fast"], 5),
                            "fast_ratio": round(medians["psbatch_fast"] / sb, 3),
                            "fast_overhead_ms": round(1000 * (medians["psbatch_fast"] - sb), 2)})
            row["goal_ratio"] = GOAL_RATIO
            result[name] = row
        for chunk in range(0, len(ids), 200):
            subprocess.run(["scancel", *ids[chunk:chunk + 200]], capture_output=True, check=False)
    json.dump(result, sys.stdout, indent=2)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
