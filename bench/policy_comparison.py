#!/usr/bin/env python3
"""Policy comparison on real-trace windows: every policy on the same workload, cluster
and seed, side by side, for several windows and loads of the Philly trace.

Prints JSON: per (window, load) the metrics of each policy and the ratios the goals are
stated in (pipeswift / slurm, / sjf, / tiresias mean JCT; P99 JCT of large jobs vs
slurm; max wait vs the bound), plus medians over windows and in how many runs each goal
holds. ``pipeswift`` runs as shipped (non-preemptive) and as ``pipeswift:preempt``
(its switch-cost-gated changes to running jobs on, ``preempt`` and ``reshape_running``,
as a site that allows requeue would run it). Reads
``../shared/workloads/philly_dev.csv.gz`` when present (or ``--workload``).

Usage: python bench/policy_comparison.py [--windows 10,30,50] [--days 7] [--loads 0.8,0.9]
       [--gpus 128] [--jobs-per-process 2] [--knobs '{"pipeswift": {...}}']
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout's code, not an installed one

from pipeswift_slurm.policy import PRESETS  # noqa: E402
from pipeswift_slurm.sim.runner import ALL_POLICIES, RunSpec, run_comparison  # noqa: E402

DEFAULT_TRACE = Path(__file__).resolve().parents[1].parent / "shared" / "workloads" / "philly_dev.csv.gz"


# pipeswift with its switch-cost-gated changes to running jobs on: preemption and reshaping
# (both off by default, like requeue at a site)
PREEMPT = "pipeswift:preempt"  # a preset (policy.PRESETS); --knobs adds to it
assert PREEMPT in PRESETS
GOALS = {"mean_jct_vs_slurm": 0.5, "mean_jct_vs_sjf": 0.75, "mean_jct_vs_tiresias": 0.75, "p99_large_vs_slurm": 1.2}


def ratios_of(ps: dict, by: dict) -> dict:
    ratios = {"mean_jct_vs_" + name: ps["mean_jct_s"] / by[name]["mean_jct_s"] for name in ALL_POLICIES
              if name != "pipeswift"}
    ratios["p99_large_vs_slurm"] = (ps["p99_jct_s_large"] / by["slurm"]["p99_jct_s_large"]
                                    if ps["p99_jct_s_large"] and by["slurm"]["p99_jct_s_large"] else None)
    return ratios


def one(args: tuple[str, float, float, float, int, dict]) -> dict:
    trace, start_day, days, load, gpus, knobs = args
    t0 = time.perf_counter()
    spec = RunSpec(gpus=gpus, workload=trace, start_day=start_day, window_days=days, load=load,
                   policies=ALL_POLICIES + (PREEMPT,), policy_knobs=knobs, drop_oversized=True)
    comp = run_comparison(spec)
    by = {m["policy"]: m for m in comp.metrics}
    ps, pre = by["pipeswift"], by[PREEMPT]
    return {"start_day": start_day, "days": days, "load": load, "gpus": gpus, "workload": comp.workload,
            "ratios": ratios_of(ps, by), "ratios_preempt": ratios_of(pre, by),
            "pipeswift_jobs_over_wait_bound": ps["jobs_over_wait_bound"],
            "pipeswift_max_wait_h": ps["max_wait_s"] / 3600,
            "preempt_jobs_over_wait_bound": pre["jobs_over_wait_bound"],
            "preempt_max_wait_h": pre["max_wait_s"] / 3600, "policies": comp.metrics,
            "wall_s": time.perf_counter() - t0}


def summarize(runs: list[dict], key: str) -> dict:
    """Median ratio over runs, and in how many runs each goal holds."""
    names = runs[0][key].keys() if runs else []
    out: dict = {k: statistics.median(r[key][k] for r in runs if r[key][k] is not None) for k in names}
    out["runs_meeting_goal"] = {k: "%d/%d" % (sum(1 for r in runs if r[key][k] is not None and r[key][k] <= goal),
                                              len(runs)) for k, goal in GOALS.items()}
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workload", default=str(DEFAULT_TRACE))
    parser.add_argument("--windows", default="10,30,50", help="start days")
    parser.add_argument("--days", type=float, default=7.0)
    parser.add_argument("--loads", default="0.8,0.9")
    parser.add_argument("--gpus", type=int, default=128)
    parser.add_argument("--processes", type=int, default=2)
    parser.add_argument("--knobs", default="{}", help="JSON: policy name -> knobs")
    args = parser.parse_args()
    if not Path(args.workload).exists():
        print(json.dumps({"skipped": "workload %s not found" % args.workload}))
        return 0
    tasks = [(args.workload, float(w), args.days, float(load), args.gpus, json.loads(args.knobs))
             for w in args.windows.split(",") for load in args.loads.split(",")]
    t0 = time.perf_counter()
    with ProcessPoolExecutor(max_workers=args.processes) as pool:
        runs = list(pool.map(one, tasks))
    summary = summarize(runs, "ratios")
    summary["max_pipeswift_jobs_over_wait_bound"] = max(r["pipeswift_jobs_over_wait_bound"] for r in runs)
    preempt = summarize(runs, "ratios_preempt")
    preempt["max_jobs_over_wait_bound"] = max(r["preempt_jobs_over_wait_bound"] for r in runs)
    json.dump({"summary_median_over_windows": summary, "summary_preempt_median_over_windows": preempt,
               "runs": runs, "wall_s": time.perf_counter() - t0}, sys.stdout, indent=2)
    print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
