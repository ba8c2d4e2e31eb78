#!/usr/bin/env python3
"""Wall time of a large replay: every policy on a synthetic workload of ``--jobs`` jobs
(default 40,000) on ``--gpus`` GPUs at ``--load``. Prints JSON: per policy the simulation
wall time, ticks and mean decide time, and the total. Goal: 40,000 jobs x 5 policies in
under 5 minutes on a 2-core machine.

Usage: python bench/replay_scale.py [--jobs 40000] [--gpus 512] [--load 0.8] [--processes 2]
"""

import argparse
import json
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout's code, not an installed one

from pipeswift_slurm.sim.runner import ALL_POLICIES, RunSpec, run_comparison  # noqa: E402


def one(args):
    jobs, gpus, load, policy = args
    comp = run_comparison(RunSpec(gpus=gpus, synthetic_jobs=jobs, load=load, policies=(policy,)))
    m = comp.metrics[0]
    return {"policy": policy, "sim_wall_s": round(m["wall_s"], 1), "ticks": m["ticks"],
            "decide_ms_mean": m["decide_ms_mean"], "mean_jct_s": m["mean_jct_s"]}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=40000)
    parser.add_argument("--gpus", type=int, default=512)
    parser.add_argument("--load", type=float, default=0.8)
    parser.add_argument("--processes", type=int, default=2)
    args = parser.parse_args()
    t0 = time.perf_counter()
    tasks = [(args.jobs, args.gpus, args.load, p) for p in ALL_POLICIES]
    with ProcessPoolExecutor(max_workers=args.processes) as pool:
        rows = list(pool.map(one, tasks))
    json.dump({"jobs": args.jobs, "gpus": args.gpus, "load": args.load, "processes": args.processes,
               "total_wall_s": round(time.perf_counter() - t0, 1), "goal_s": 300, "policies": rows},
              sys.stdout, indent=2)
    print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
