#!/usr/bin/env python3
"""Do no harm, measured: every policy on one trace window with the planner's rule on (a
user's layout is replaced on a GPU count only when the predicted gain exceeds the error
band, ``core.planner.keep_user_layout``) and off (the fastest layout always).

Prints JSON: per policy, with the rule on and off, the mean JCT, the mean JCT over slurm's,
the jobs run in a layout other than their user's (``relayout_jobs``) and the jobs run on
another GPU count (``reconfigured_jobs``). The truth is the cost model itself, so the rule
can only cost time here: this measures how much (a truth that favours the users' layouts,
where it would save time, is not modelled yet). Defaults: the window of docs/benchmarks.md.

Usage: python bench/do_no_harm.py [--workload PATH] [--vc NAME] [--start-day D] [--days D]
       [--gpus N] [--load L]
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout's code, not an installed one

from pipeswift_slurm.sim.runner import ALL_POLICIES, RunSpec, run_comparison  # noqa: E402
from pipeswift_slurm.sim.workload import WorkloadError  # noqa: E402

DEFAULT_TRACE = Path(__file__).resolve().parents[1].parent / "shared" / "workloads" / "philly_dev.csv.gz"
POLICIES = ALL_POLICIES + ("pipeswift:config",)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workload", default=str(DEFAULT_TRACE))
    parser.add_argument("--vc", default="b436b2")
    parser.add_argument("--start-day", type=float, default=14.0)
    parser.add_argument("--days", type=float, default=7.0)
    parser.add_argument("--gpus", type=int, default=64)
    parser.add_argument("--load", type=float, default=0.9)
    args = parser.parse_args()
    if not Path(args.workload).is_file():
        print("bench/do_no_harm.py: %s: no such file (give --workload PATH)" % args.workload, file=sys.stderr)
        return 2
    spec = RunSpec(gpus=args.gpus, workload=args.workload, cluster_filter=args.vc, start_day=args.start_day,
                   window_days=args.days, load=args.load, drop_oversized=True, policies=POLICIES)
    try:
        runs = {on: {m["policy"]: m for m in run_comparison(replace(spec, do_no_harm=on)).metrics}
                for on in (True, False)}
    except WorkloadError as exc:
        print("bench/do_no_harm.py: %s (choose another --vc or window)" % exc, file=sys.stderr)
        return 2
    out = {"spec": {k: v for k, v in vars(args).items()}, "policies": {}}
    for name in POLICIES:
        row = {}
        for on, label in ((True, "on"), (False, "off")):
            m, slurm = runs[on][name], runs[on]["slurm"]
            row[label] = {"mean_jct_s": round(m["mean_jct_s"]), "vs_slurm": round(m["mean_jct_s"] / slurm["mean_jct_s"], 3),
                          "relayout_jobs": m["relayout_jobs"], "reconfigured_jobs": m["reconfigured_jobs"]}
        row["mean_jct_on_over_off"] = round(runs[True][name]["mean_jct_s"] / runs[False][name]["mean_jct_s"], 3)
        out["policies"][name] = row
    json.dump(out, sys.stdout, indent=2)
    print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
