"""psbatch overhead: median wall time of N submissions with sbatch, the Python psbatch,
the compiled psbatch front end (pipeswift_slurm/fast) with its resident helper off, and
with it on (pipeswift_slurm/psbatch_helper), for a Megatron script (enriched: parsed,
validated, rewritten) and a plain one (passed through). With the helper on, the front end
decides a Megatron job itself (decide.c), both for the same script each time
(``fast_helper``) and for a script never submitted before each time
(``fast_helper_new_script``: as in a sweep, its ``--train-iters`` differs). The same two
with that decision turned off (``PIPESWIFT_PSBATCH_FAST=off``), as the previous release
ran them: ``asked_memo`` (answered from the helper's memo) and ``asked_new_script`` (the
helper decides afresh). Also the time of a Megatron submission that finds no helper
running, with the decision in C (it starts a helper for later clean-up) and without it
(the Python psbatch, which also starts one).

Needs a Slurm controller (tests/slurm/testbed.sh up; source its env.sh) and, for the
compiled front end, a C compiler (it is built into a temporary folder). Jobs are submitted
held (-H) and cancelled at the end. Submissions are interleaved, in a new random order
each round (seeded), so drift, order and what ran just before hit every variant alike (a
fixed rotation would keep each variant behind the same neighbour every round). Besides
the ratio of medians, each variant's ``paired_ratio`` is the median over rounds of its
time over sbatch's in the same round. Prints JSON; never passes or fails on time.

    python bench/psbatch_overhead.py [-n 30] [--psbatch "python3 -m pipeswift_slurm.submit.psbatch"]
                                     [--psbatch-fast PATH | --no-fast] [--cc CC] [--no-python]
                                     [--seed S]
"""

from __future__ import annotations

import argparse
import json
import os
import random
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

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from pipeswift_slurm.submit.helper import SHARED_MEMORY, shared_memory_usable  # noqa: E402

MEGATRON = """#!/bin/bash
#SBATCH --gpus=4
#SBATCH --time=10
ARGS="--num-layers 24 --hidden-size 1024 --num-attention-heads 16 --seq-length 2048"
torchrun --nproc-per-node 4 pretrain_gpt.py $ARGS --micro-batch-size 2 --global-batch-size 64 \\
    --pipeline-model-parallel-size 2 --train-iters 1000 --bf16
"""
PLAIN = "#!/bin/bash\n#SBATCH --gpus=1\n#SBATCH --time=10\nsrun hostname\n"
GOAL_RATIO = 1.2


def _time(cmd: list[str], cwd: Path, ids: list[str], env: Optional[dict[str, str]] = None) -> float:
    start = time.perf_counter()
    done = subprocess.run(cmd, capture_output=True, text=True, cwd=cwd, env=env, check=False)
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
    from pipeswift_slurm.submit.fast.build import BuildError, build

    try:
        return str(build(folder / "psbatch", cc=args.cc))
    except BuildError as exc:
        sys.exit("cannot build the compiled psbatch: %s (or pass --no-fast)" % exc)


def _helper(command: str, folder: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pipeswift_slurm.submit.helper", command, "--dir", str(folder)],
                          capture_output=True, text=True, check=False)


def _wait_until(check, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while not check() and time.monotonic() < deadline:  # no Python started per poll
        time.sleep(0.02)


def _stop_helper(folder: Path) -> None:
    _helper("stop", folder)
    _wait_until(lambda: not (folder / "psbatch.sock").exists(), 30)


def _first_submissions(fast: str, cwd: Path, ids: list[str], env: dict[str, str], folder: Path,
                       rounds: int = 5) -> dict[str, float]:
    """A Megatron submission that finds no helper: it starts one (in the background). Leaves
    a helper running."""
    times = []
    for _ in range(rounds):
        _stop_helper(folder)
        times.append(_time([fast, "-H", "megatron.sh"], cwd, ids, env))
        _wait_until((folder / "psbatch.sock").exists, 60)
    return {"median_s": round(statistics.median(times), 5), "rounds": rounds}


def _compare(variants: dict[str, tuple[list[str], dict[str, str], bool]], name: str, text: str, n: int,
             cwd: Path, ids: list[str], order: random.Random) -> dict[str, object]:
    """Medians and ratios to sbatch; a variant marked ``new`` submits ``new/<name>.sh``,
    written afresh before each submission (another ``--train-iters``, or for a script
    without one, another last comment line)."""
    times: dict[str, list[float]] = {v: [] for v in variants}
    names = list(variants)
    (cwd / "new").mkdir(exist_ok=True)
    for k in range(n):  # interleaved and shuffled, so drift and neighbours hit every variant alike
        order.shuffle(names)
        for variant in names:
            cmd, env, new = variants[variant]
            script = name + ".sh"
            if new:
                script = "new/" + script
                fresh = text.replace("--train-iters 1000", "--train-iters %d" % (1001 + k))
                (cwd / script).write_text(fresh if fresh != text else text + "# submission %d\n" % k)
            times[variant].append(_time(cmd + ["-H", script], cwd, ids, env))
    medians = {v: statistics.median(t) for v, t in times.items()}
    sb = medians["sbatch"]
    deciles = statistics.quantiles(times["sbatch"], n=10) if n > 1 else [sb]
    row: dict[str, object] = {"sbatch_median_s": round(sb, 5),
                              "sbatch_p10_p90_s": [round(deciles[0], 5), round(deciles[-1], 5)]}
    if "psbatch" in medians:
        row.update({"psbatch_median_s": round(medians["psbatch"], 5),
                    "ratio": round(medians["psbatch"] / sb, 3)})
    for variant, key in (("psbatch_fast", "fast"), ("psbatch_fast_helper", "fast_helper"),
                         ("psbatch_fast_helper_new_script", "fast_helper_new_script"),
                         ("psbatch_fast_asked", "asked_memo"), ("psbatch_fast_asked_new_script", "asked_new_script")):
        if variant in medians:
            # also per round: this variant's time over sbatch's in the same round (a
            # paired estimate, steadier than a ratio of medians when the machine drifts)
            paired = [mine / theirs for mine, theirs in zip(times[variant], times["sbatch"])]
            row.update({variant + "_median_s": round(medians[variant], 5),
                        key + "_ratio": round(medians[variant] / sb, 3),
                        key + "_paired_ratio": round(statistics.median(paired), 3),
                        key + "_overhead_ms": round(1000 * (medians[variant] - sb), 2)})
    row["goal_ratio"] = GOAL_RATIO
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("-n", type=int, default=30, help="submissions per variant")
    default = shutil.which("psbatch") or "%s -m pipeswift_slurm.submit.psbatch" % sys.executable
    ap.add_argument("--psbatch", default=default, help="Python psbatch command line (default: %(default)s)")
    ap.add_argument("--psbatch-fast", help="a compiled psbatch to use (default: build one in a temp folder)")
    ap.add_argument("--no-fast", action="store_true", help="leave the compiled front end out")
    ap.add_argument("--no-python", action="store_true",
                    help="leave the Python psbatch out: the other submissions then follow each other "
                    "without its 0.1-0.2 s pauses, as in a loop of submissions")
    ap.add_argument("--seed", type=int, default=0, help="seed of the submission order (default: %(default)s)")
    ap.add_argument("--cc", help="C compiler for the build (default: $CC, else cc)")
    args = ap.parse_args()
    ids: list[str] = []
    with tempfile.TemporaryDirectory() as tmp:
        cwd = Path(tmp)
        fast = _fast_front_end(args, cwd)
        # the helper's folder where psbatch puts it by default (psbatch_helper.helper_dir):
        # on a tmpfs (/dev/shm, as $XDG_RUNTIME_DIR is on a login node) when there is one
        helper_parent = tempfile.mkdtemp(prefix="psbatch-bench-", dir=SHARED_MEMORY if shared_memory_usable() else cwd)
        helper_dir = Path(helper_parent) / "helper"
        plain_env = dict(os.environ, PIPESWIFT_PSBATCH_HELPER="off")
        helped_env = dict(os.environ, PIPESWIFT_PSBATCH_HELPER="on", PIPESWIFT_PSBATCH_HELPER_DIR=str(helper_dir),
                          PIPESWIFT_PSBATCH_FAST="on")
        asked_env = dict(helped_env, PIPESWIFT_PSBATCH_FAST="off")
        variants = {"sbatch": (["sbatch"], plain_env, False)}
        if not args.no_python:
            variants["psbatch"] = (shlex.split(args.psbatch), plain_env, False)
        if fast:
            if not args.no_python:  # a Megatron job without the helper is the Python psbatch
                variants["psbatch_fast"] = ([fast], plain_env, False)
            variants["psbatch_fast_helper"] = ([fast], helped_env, False)
            variants["psbatch_fast_helper_new_script"] = ([fast], helped_env, True)
            variants["psbatch_fast_asked"] = ([fast], asked_env, False)
            variants["psbatch_fast_asked_new_script"] = ([fast], asked_env, True)
        result: dict[str, object] = {"n": args.n, "seed": args.seed, "psbatch": args.psbatch, "psbatch_fast": fast,
                                     "helper_dir": str(helper_dir)}
        scripts = {"megatron": MEGATRON, "plain": PLAIN}
        for name, text in scripts.items():
            (cwd / (name + ".sh")).write_text(text)
        order = random.Random(args.seed)
        try:
            if fast:
                result["megatron_no_helper_yet_s"] = _first_submissions(fast, cwd, ids, helped_env, helper_dir)
                result["megatron_no_helper_yet_asked_s"] = _first_submissions(fast, cwd, ids, asked_env, helper_dir)
            for name, text in scripts.items():
                result[name] = _compare(variants, name, text, args.n, cwd, ids, order)
        finally:
            if fast:
                _stop_helper(helper_dir)
            shutil.rmtree(helper_parent, ignore_errors=True)
            for chunk in range(0, len(ids), 200):
                subprocess.run(["scancel", *ids[chunk:chunk + 200]], capture_output=True, check=False)
    json.dump(result, sys.stdout, indent=2)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
