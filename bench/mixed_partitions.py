#!/usr/bin/env python3
"""A mixed A100 + H100 cluster on real-trace windows (issue 26, item 3): pipeswift, which
may move a job that allows several partitions to the one where it finishes first, against
the baselines, which keep each job in the partition it was submitted to.

Windows: those of ``bench/policy_windows.py`` (7-day windows of each Philly virtual
cluster of ``../shared/workloads/philly_dev.csv.gz``; one line and exit 0 when absent),
``--quick`` (default) 2 per VC near its median size, ``--all`` every one. Cluster per VC:
its GPUs as policy_windows.py sizes it, split into an ``a100`` partition (A100-80GB,
the larger half of its 8-GPU nodes) and an ``h100`` partition (H100-80GB, the rest).
Each job is submitted to one partition it fits in, drawn in proportion to the
partitions' GPUs; ``--partition-flex`` (default 1.0) of them allow both
(``sim/mixed.py``). Load 0.9 over the whole cluster, flex 1.0, the users' layouts, seed 1,
wait bound 48 h.

The truth is the cost model unless ``--truth-noise``/``--truth-shape-noise`` (per job and
per config shape) or ``--h100-truth`` (every config on H100 really takes this many times
its predicted iteration time: the model's A100/H100 speed ratio wrong) say otherwise: the
decisions are made with the model, so a truth that differs from it is the honest test.

Prints JSON: per window the mean JCT of every policy, pipeswift over the best baseline
(``vs_best``), pipeswift with moves off (``pipeswift:stay``) over the best baseline, jobs
moved, and the worst and median ``vs_best`` over the windows (goal: <= 0.8). Each window's
line also goes to stderr as it ends (a long ``--all`` run stopped early keeps them).

Usage: python bench/mixed_partitions.py [--all] [--vc 11cb48,...] [--partition-flex 1.0]
       [--truth-noise 0.3] [--truth-shape-noise 0.15] [--h100-truth 1.3] [--workers 2]
       [--max-jobs 5000]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout's code
sys.path.insert(0, str(Path(__file__).resolve().parent))

from policy_windows import DEFAULT_TRACE, WAIT_BOUND_S, WINDOW_DAYS, quick_subset, windows  # noqa: E402

from pipeswift_slurm.core.hardware import get_gpu_type  # noqa: E402
from pipeswift_slurm.sim.mixed import SimPartition  # noqa: E402
from pipeswift_slurm.sim.runner import RunSpec, run_comparison  # noqa: E402
from pipeswift_slurm.sim.workload import read_trace  # noqa: E402

BASELINES = ("fifo", "slurm", "sjf", "tiresias")
POLICIES = BASELINES + ("pipeswift", "pipeswift:stay")
GOAL = 0.8


def partitions(gpus: int) -> tuple[SimPartition, ...]:
    """The VC's 8-GPU nodes split: a100 the larger half, h100 the rest."""
    nodes = gpus // 8
    return (SimPartition("a100", get_gpu_type("A100-80GB"), nodes - nodes // 2, 8),
            SimPartition("h100", get_gpu_type("H100-80GB"), nodes // 2, 8))


def run_window(task: dict[str, Any]) -> dict[str, Any]:
    t0 = time.perf_counter()
    spec = RunSpec(workload=task["trace"], cluster_filter=task["vc"], start_day=task["start_day"],
                   window_days=WINDOW_DAYS, load=0.9, flex=1.0, policies=POLICIES, seed=1,
                   noise_sigma=task["truth_noise"], shape_sigma=task["truth_shape_noise"],
                   wait_bound_s=WAIT_BOUND_S, drop_oversized=True, partitions=partitions(task["gpus"]),
                   partition_flex=task["partition_flex"],
                   partition_truth=(("h100", task["h100_truth"]),) if task["h100_truth"] != 1.0 else (),
                   policy_knobs={"pipeswift:stay": {"move_partitions": False}})
    comp = run_comparison(spec)
    jct = {m["policy"]: m["mean_jct_s"] for m in comp.metrics}
    best = min(jct[b] for b in BASELINES)
    return {"vc": task["vc"], "start_day": task["start_day"], "gpus": task["gpus"], "jobs": comp.workload["jobs"],
            "multi_partition_jobs": comp.workload["multi_partition_jobs"],
            "mean_jct_s": {k: round(v, 1) for k, v in jct.items()},
            "best_baseline": min(BASELINES, key=lambda b: jct[b]),
            "vs_best": round(jct["pipeswift"] / best, 3), "stay_vs_best": round(jct["pipeswift:stay"] / best, 3),
            "moved": next(m["moved_partition_jobs"] for m in comp.metrics if m["policy"] == "pipeswift"),
            "wall_s": round(time.perf_counter() - t0, 1)}


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--workload", default=str(DEFAULT_TRACE))
    parser.add_argument("--all", action="store_true", help="every window (default: 2 per VC)")
    parser.add_argument("--vc", help="comma-separated virtual clusters (default: all)")
    parser.add_argument("--partition-flex", type=float, default=1.0)
    parser.add_argument("--truth-noise", type=float, default=0.0)
    parser.add_argument("--truth-shape-noise", type=float, default=0.0)
    parser.add_argument("--h100-truth", type=float, default=1.0)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--max-jobs", type=int, default=0,
                        help="skip windows with more jobs than this (named in the output; 0: none)")
    args = parser.parse_args()
    if not Path(args.workload).exists():
        print(json.dumps({"skipped": "workload %s not found" % args.workload}))
        return 0
    wins, _ = windows(read_trace(args.workload), args.vc.split(",") if args.vc else None)
    wins = wins if args.all else quick_subset(wins)
    too_big = [[w["vc"], w["start_day"], w["jobs"]] for w in wins if args.max_jobs and w["jobs"] > args.max_jobs]
    wins = [w for w in wins if not (args.max_jobs and w["jobs"] > args.max_jobs)]
    tasks = [dict(w, trace=args.workload, partition_flex=args.partition_flex, truth_noise=args.truth_noise,
                  truth_shape_noise=args.truth_shape_noise, h100_truth=args.h100_truth)
             for w in sorted(wins, key=lambda w: -w["jobs"])]
    t0 = time.perf_counter()
    runs = []
    with ProcessPoolExecutor(max_workers=args.workers) as pool:
        for future in as_completed([pool.submit(run_window, t) for t in tasks]):
            runs.append(future.result())
            print(json.dumps(runs[-1]), file=sys.stderr, flush=True)  # progress: each window as it ends
    runs.sort(key=lambda r: (r["vc"], r["start_day"]))
    ratios = [r["vs_best"] for r in runs]
    stay = [r["stay_vs_best"] for r in runs]
    out = {"settings": {k: v for k, v in vars(args).items()}, "windows": runs,
           "vs_best": {"worst": max(ratios), "median": statistics.median(ratios),
                       "behind_goal": [[r["vc"], r["start_day"], r["vs_best"]] for r in runs if r["vs_best"] > GOAL]},
           "stay_vs_best": {"worst": max(stay), "median": statistics.median(stay)},
           "skipped_windows": too_big,
           "goal": "pipeswift mean JCT <= %.1f x the best baseline that keeps each job in its partition" % GOAL,
           "wall_s": round(time.perf_counter() - t0, 1)}
    print(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
