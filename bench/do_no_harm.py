#!/usr/bin/env python3
"""Do no harm, measured: every policy on one trace window with the planner's rule on (a
user's layout is replaced on a GPU count only when the predicted gain exceeds the error
band, ``core.planner.keep_user_layout``) and off (the fastest layout always).

The truth can favour the users' layouts (``--truth-user-favour F``: the shape each job
asked for really runs F times faster than the model predicts) and err per config shape
(``--truth-shape-noise SIGMA``) and per job (``--truth-noise SIGMA``): ``sim/truth.py``.
With a truth that favours the users' layouts the rule is what saves them; with the truth
equal to the model (the defaults) it can only cost time, and this measures how much.

Prints JSON: per policy, with the rule on and off, the mean JCT, the mean JCT over slurm's,
the jobs run in a layout other than their user's (``relayout_jobs``) and on another GPU
count (``reconfigured_jobs``), and the per-job do-no-harm figures of ``sim/harm.py``:
``same_gpus`` (jobs relaid out on their own GPU count: how many, how many ran slower than
the user's layout would have beyond the 2 % tolerance, the worst and median ratio of true
run times, GPU-hours lost and gained), ``other_gpus`` (the same for jobs resized, against
the user's layout on the count they ran; ``no_user_layout``: resized to a count where the
user's layout is not valid) and ``resized_jct_vs_slurm`` (resized jobs' JCT over their JCT
under slurm). Defaults: the window of docs/benchmarks.md.

Usage: python bench/do_no_harm.py [--workload PATH] [--vc NAME] [--start-day D] [--days D]
       [--gpus N] [--load L] [--layouts user|expert] [--truth-user-favour F]
       [--truth-shape-noise SIGMA] [--truth-noise SIGMA] [--seed N] [--learn [--own-layout-first] [--learn-history-days D]
       [--learn-report-s S]]
       [--policies slurm,pipeswift,...]
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout's code, not an installed one

from pipeswift_slurm.sim.layouts import LAYOUTS  # noqa: E402
from pipeswift_slurm.sim.runner import ALL_POLICIES, RunSpec, run_comparison  # noqa: E402
from pipeswift_slurm.sim.workload import WorkloadError  # noqa: E402

DEFAULT_TRACE = Path(__file__).resolve().parents[1].parent / "shared" / "workloads" / "philly_dev.csv.gz"
POLICIES = ALL_POLICIES + ("pipeswift:config",)
HARM_KEYS = ("jobs", "slower_jobs", "slower_beyond_tolerance", "worst_ratio", "median_ratio",
             "gpu_hours_lost", "gpu_hours_gained", "vs_fewer_gpus", "no_user_layout")


def _rounded(block: dict[str, Any] | None) -> dict[str, Any] | None:
    if block is None:
        return None
    return {k: round(v, 3) if isinstance(v, float) else v for k, v in block.items()
            if k in HARM_KEYS or k == "worst_job_id"}


def policy_row(m: dict[str, Any], slurm: dict[str, Any]) -> dict[str, Any]:
    """One policy's figures of one run (rule on or off)."""
    harm = m["do_no_harm"]
    return {"mean_jct_s": round(m["mean_jct_s"]), "vs_slurm": round(m["mean_jct_s"] / slurm["mean_jct_s"], 3),
            "relayout_jobs": m["relayout_jobs"], "reconfigured_jobs": m["reconfigured_jobs"],
            "same_gpus": _rounded(harm["same_gpus"]), "other_gpus": _rounded(harm["other_gpus"]),
            "resized_jct_vs_slurm": _rounded(harm["resized_jct_vs_slurm"])}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workload", default=str(DEFAULT_TRACE))
    parser.add_argument("--vc", default="b436b2")
    parser.add_argument("--start-day", type=float, default=14.0)
    parser.add_argument("--days", type=float, default=7.0)
    parser.add_argument("--gpus", type=int, default=64)
    parser.add_argument("--load", type=float, default=0.9)
    parser.add_argument("--layouts", choices=LAYOUTS, default="user")
    parser.add_argument("--truth-user-favour", type=float, default=1.0)
    parser.add_argument("--truth-shape-noise", type=float, default=0.0)
    parser.add_argument("--truth-noise", type=float, default=0.0)
    parser.add_argument("--seed", type=int, default=1, help="the workload's and the truth's draws")
    parser.add_argument("--learn", action="store_true",
                        help="calibrate online with layout terms from finished jobs (simulate --learn)")
    parser.add_argument("--learn-history-days", type=float, default=0.0,
                        help="with --learn: start from what the site learned on the trace's D days before the window")
    parser.add_argument("--learn-report-s", type=float, default=None,
                        help="with --learn: learn from a job S seconds after it starts (the launcher's report)"
                        " instead of when it finishes")
    parser.add_argument("--own-layout-first", action="store_true",
                        help="with --learn: change no user's layout of a class before a run in one was measured")
    parser.add_argument("--policies", default=",".join(POLICIES),
                        help="comma-separated; slurm is always run (the base of the ratios)")
    args = parser.parse_args()
    if not Path(args.workload).is_file():
        print("bench/do_no_harm.py: %s: no such file (give --workload PATH)" % args.workload, file=sys.stderr)
        return 2
    if args.learn_report_s is not None and not 0 <= args.learn_report_s < float("inf"):
        print("bench/do_no_harm.py: --learn-report-s must be a number of seconds >= 0", file=sys.stderr)
        return 2
    if not 0.1 <= args.truth_user_favour <= 10 or args.truth_shape_noise < 0 or args.truth_noise < 0:
        print("bench/do_no_harm.py: --truth-user-favour must be in 0.1..10, the noise sigmas >= 0", file=sys.stderr)
        return 2
    policies = tuple(dict.fromkeys(["slurm"] + [p for p in args.policies.split(",") if p]))
    spec = RunSpec(gpus=args.gpus, workload=args.workload, cluster_filter=args.vc, start_day=args.start_day,
                   window_days=args.days, load=args.load, drop_oversized=True, policies=policies,
                   layouts=args.layouts, user_favour=args.truth_user_favour, shape_sigma=args.truth_shape_noise,
                   noise_sigma=args.truth_noise, seed=args.seed, learn=args.learn,
                   own_layout_first=args.own_layout_first, learn_history_days=args.learn_history_days,
                   learn_report_s=args.learn_report_s)
    try:
        runs = {on: {m["policy"]: m for m in run_comparison(replace(spec, do_no_harm=on)).metrics}
                for on in (True, False)}
    except (WorkloadError, KeyError) as exc:
        print("bench/do_no_harm.py: %s (choose another --vc, window or --policies)" % exc, file=sys.stderr)
        return 2
    out: dict[str, Any] = {"spec": dict(vars(args)), "jobs": runs[True]["slurm"]["jobs"], "policies": {}}
    for name in policies:
        row = {label: policy_row(runs[on][name], runs[on]["slurm"]) for on, label in ((True, "on"), (False, "off"))}
        row["mean_jct_on_over_off"] = round(runs[True][name]["mean_jct_s"] / runs[False][name]["mean_jct_s"], 3)
        out["policies"][name] = row
    json.dump(out, sys.stdout, indent=2)
    print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
