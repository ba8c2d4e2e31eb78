#!/usr/bin/env python3
"""Every window of the dev set (issue 24, item 1): an evaluation that cannot be tuned to a
few windows.

Runs every 7-day window of every Philly virtual cluster (VC) of
``../shared/workloads/philly_dev.csv.gz`` (resolved from the repository root; one line and
exit 0 when absent) at each load, share of flexible jobs and kind of users' layouts, with
the policies of ``POLICIES``, through the library (``sim.runner.run_comparison``) in a
process pool. Prints JSON (stdout, or ``--out``): per (load, flex, layouts) group and per
baseline, the worst-case and median ratio of mean JCT of pipeswift (and of
``pipeswift:order`` and ``pipeswift:preempt``) to the baseline's and to the best of the
baselines, the windows where it is behind, small jobs' mean JCT against slurm's, the
longest wait against the bound and fifo's, then the goal table of issue 24 with pass or
fail per goal (also printed as text: to stdout with ``--out``, else to stderr).

Rules (documented in docs/results.md, "Every window of the dev set"):
  * windows: days [7k, 7k + 7) of the table's time (``--start-day 7k --window-days 7``),
    for every k with at least ``--min-jobs`` (default 10) jobs of the VC; the others are
    listed under ``skipped_windows``;
  * cluster per VC: its average busy GPUs over the whole trace (recorded GPU-seconds /
    span of its submissions) rounded up to a power of two, at least 32 and at least its
    largest job, in 8-GPU nodes;
  * arrivals rescaled to the load over the window (``rescale_load``); seed 1; wait bound
    48 h; truth = the cost model unless ``--truth-noise`` / ``--truth-shape-noise``.

Usage: python bench/policy_windows.py [--quick] [--vc 11cb48,...] [--loads 0.7,0.9,1.1]
       [--flex 1.0,0.5] [--layouts user,expert] [--truth-noise 0.3]
       [--truth-shape-noise 0.15] [--workers 2] [--dated] [--out FILE.json]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import statistics
import sys
import time
from collections import defaultdict
from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path
from typing import Any, Iterable, Optional, Sequence

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # this checkout's code, not an installed one

from pipeswift_slurm.sim.runner import RunSpec, run_comparison  # noqa: E402
from pipeswift_slurm.sim.workload import TraceRow, WorkloadError, read_trace  # noqa: E402

DEFAULT_TRACE = ROOT.parent / "shared" / "workloads" / "philly_dev.csv.gz"
POLICIES = ("fifo", "slurm", "sjf", "tiresias", "pipeswift", "pipeswift:order", "pipeswift:preempt")
BASELINES = ("fifo", "slurm", "sjf", "tiresias")
CANDIDATES = ("pipeswift", "pipeswift:order", "pipeswift:preempt")
BEST3 = ("sjf", "tiresias", "slurm")  # "min(sjf, tiresias, slurm)" of the goals
BEST2 = ("sjf", "tiresias")
WINDOW_DAYS = 7.0
MIN_JOBS = 10
MIN_GPUS = 32
WAIT_BOUND_S = 48 * 3600.0
LOADS, FLEX, LAYOUTS = (0.7, 0.9, 1.1), (1.0, 0.5), ("user", "expert")
SHAPE_FIELD = "shape_sigma"  # RunSpec's per-config-shape truth factor, where the runner has it


# ---------------------------------------------------------------- the grid

def cluster_gpus(rows: Sequence[TraceRow], gpus_per_node: int = 8) -> int:
    """The cluster for one VC: its average busy GPUs (recorded GPU-seconds / span of its
    submissions) rounded up to a power of two, at least ``MIN_GPUS`` and its largest job,
    rounded up to whole nodes."""
    span = max(r.submit_s for r in rows) - min(r.submit_s for r in rows)
    busy = sum(r.num_gpus * r.duration_s for r in rows) / max(span, 1.0)
    need = max(MIN_GPUS, busy, max(r.num_gpus for r in rows))
    gpus = int(2 ** math.ceil(math.log2(need)))
    return -(-gpus // gpus_per_node) * gpus_per_node


def windows(rows: Sequence[TraceRow], vcs: Optional[Sequence[str]] = None, min_jobs: int = MIN_JOBS,
            window_days: float = WINDOW_DAYS, max_jobs: Optional[int] = None
            ) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(windows to run, windows skipped for fewer than ``min_jobs`` jobs or, with
    ``max_jobs``, more): one dict per VC and window start (``vc``, ``start_day``, ``jobs``,
    ``gpus``), in VC then day order."""
    by_vc: dict[str, list[TraceRow]] = defaultdict(list)
    for r in rows:
        by_vc[r.category].append(r)
    unknown = sorted(set(vcs or ()) - set(by_vc))
    if unknown:
        raise WorkloadError("--vc %s: no such virtual cluster in the trace; known: %s"
                            % (",".join(unknown), ",".join(sorted(by_vc))))
    run: list[dict[str, Any]] = []
    skipped: list[dict[str, Any]] = []
    for vc in sorted(vcs or by_vc):
        gpus = cluster_gpus(by_vc[vc])
        counts: dict[int, int] = defaultdict(int)
        for r in by_vc[vc]:
            counts[int(r.submit_s // (window_days * 86400.0))] += 1
        for k in sorted(counts):
            item = {"vc": vc, "start_day": k * window_days, "jobs": counts[k], "gpus": gpus}
            keep = counts[k] >= min_jobs and (max_jobs is None or counts[k] <= max_jobs)
            (run if keep else skipped).append(item)
    return run, skipped


def quick_subset(wins: Sequence[dict[str, Any]], per_vc: int = 2) -> list[dict[str, Any]]:
    """``per_vc`` windows of each VC, deterministic: those nearest its median job count."""
    by_vc: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for w in wins:
        by_vc[w["vc"]].append(w)
    out = []
    for vc in sorted(by_vc):
        ranked = sorted(by_vc[vc], key=lambda w: (w["jobs"], w["start_day"]))
        mid = len(ranked) // 2
        out += sorted(ranked[max(0, mid - per_vc // 2):][:per_vc], key=lambda w: w["start_day"])
    return out


def run_window(task: dict[str, Any]) -> dict[str, Any]:
    """Simulate every policy of ``task`` on one window; metrics kept: what the summary uses.
    ``wall_s`` and ``cpu_s``: the window's wall and CPU time (CPU time does not grow when
    other processes share the cores)."""
    t0, c0 = time.perf_counter(), time.process_time()
    extra = {SHAPE_FIELD: task["truth_shape_noise"]} if task.get("truth_shape_noise") else {}
    spec = RunSpec(gpus=task["gpus"], workload=task["trace"], cluster_filter=task["vc"], start_day=task["start_day"],
                   window_days=task["window_days"], load=task["load"], flex=task["flex"], layouts=task["layouts"],
                   policies=tuple(task["policies"]), seed=task["seed"], noise_sigma=task["truth_noise"],
                   wait_bound_s=WAIT_BOUND_S, drop_oversized=True, start_epoch_s=task.get("start_epoch_s", 0.0),
                   ticks_on_events=not task.get("cron_ticks", False), first_look_s=task.get("first_look_s", 60.0),
                   **extra)
    comp = run_comparison(spec)
    out = {k: task[k] for k in ("vc", "start_day", "load", "flex", "layouts", "gpus")}
    out.update(jobs=comp.workload["jobs"], dropped=comp.workload["dropped_oversized"],
               offered_load=comp.workload["offered_load"],
               lower_bound_mean_jct_s=comp.workload["lower_bound_mean_jct_s"], policies={})
    for m in comp.metrics:
        worst_user = m.get("worst_user_vs_slurm")
        out["policies"][m["policy"]] = {
            "mean_jct_s": m["mean_jct_s"], "small_mean_jct_s": m["mean_jct_s_by_class"]["small"],
            "max_wait_s": m["max_wait_s"], "restarts": m["restarts"], "wall_s": m["wall_s"],
            "worst_user_vs_slurm": worst_user["jct_ratio"] if worst_user else None}
    out["wall_s"], out["cpu_s"] = time.perf_counter() - t0, time.process_time() - c0
    return out


def run_grid(trace: str, wins: Sequence[dict[str, Any]], loads: Sequence[float], flexes: Sequence[float],
             layouts: Sequence[str], truth_noise: float = 0.0, truth_shape_noise: float = 0.0, seed: int = 1,
             workers: int = 2, policies: Sequence[str] = POLICIES, progress: Any = None,
             partial: Optional[Path] = None, dated: bool = False, cron_ticks: bool = False,
             first_look_s: float = 60.0) -> list[dict[str, Any]]:
    """Every window x load x flex x layouts; the largest windows first (``workers`` > 1: a
    process pool; 1: in this process). Each run is appended to ``partial`` (JSON lines) as
    it ends, so a long grid stopped early keeps what it did. Runs come back in (group, VC,
    day) order. ``dated``: time 0 of each window is its start on the trace's own dates (as
    ``pipeswift simulate`` runs it), not 0. ``cron_ticks``: the controller ticks on its own
    clock only (``simulate --cron-ticks``), with psbatch's first look of ``first_look_s``."""
    tasks = [dict(w, trace=trace, load=load, flex=flex, layouts=lay, truth_noise=truth_noise,
                  truth_shape_noise=truth_shape_noise, seed=seed, window_days=WINDOW_DAYS, policies=policies,
                  start_epoch_s=None if dated else 0.0, cron_ticks=cron_ticks,
                  first_look_s=first_look_s)
             for load in loads for flex in flexes for lay in layouts for w in wins]
    tasks.sort(key=lambda t: -t["jobs"])
    runs: list[dict[str, Any]] = []

    def done(run: dict[str, Any]) -> None:
        runs.append(run)
        if partial is not None:
            with open(partial, "a") as handle:
                handle.write(json.dumps(run) + "\n")
        if progress is not None:
            print("[%d/%d] %s day %g load %g flex %g %s: %d jobs, %.0f s" % (
                len(runs), len(tasks), run["vc"], run["start_day"], run["load"], run["flex"], run["layouts"],
                run["jobs"], run["wall_s"]), file=progress, flush=True)

    if workers <= 1:
        for t in tasks:
            done(run_window(t))
    else:
        with ProcessPoolExecutor(max_workers=workers) as pool:
            for future in as_completed([pool.submit(run_window, t) for t in tasks]):
                done(future.result())
    return sorted(runs, key=lambda r: (group_key(r), r["vc"], r["start_day"]))


# ---------------------------------------------------------------- the summary

def group_key(run: dict[str, Any]) -> tuple[float, float, str]:
    return (run["load"], run["flex"], run["layouts"])


def _median(values: Iterable[float]) -> Optional[float]:
    vals = list(values)
    return statistics.median(vals) if vals else None


def ratios(runs: Sequence[dict[str, Any]], policy: str, against: Sequence[str],
           key: str = "mean_jct_s") -> dict[str, Any]:
    """``policy``'s ``key`` over the best (lowest) of ``against`` per window: worst, median,
    and the windows where it is behind (ratio above 1; worst first)."""
    per = []
    for r in runs:
        p = r["policies"]
        if policy not in p or any(a not in p for a in against):
            continue
        mine, best = p[policy][key], min((p[a][key] for a in against if p[a][key] is not None), default=None)
        if mine is None or not best:
            continue  # e.g. no small job in the window
        per.append({"vc": r["vc"], "start_day": r["start_day"], "ratio": mine / best})
    behind = sorted((w for w in per if w["ratio"] > 1.0), key=lambda w: -w["ratio"])
    return {"windows": len(per), "worst": max((w["ratio"] for w in per), default=None),
            "median": _median(w["ratio"] for w in per), "behind": behind}


def waits(runs: Sequence[dict[str, Any]], policy: str, bound_s: float = WAIT_BOUND_S) -> dict[str, Any]:
    """The longest wait of ``policy`` against the bound and fifo's: a window fails when it
    waits past the bound while fifo kept it, or longer than fifo where fifo did not."""
    rows = []
    for r in runs:
        p = r["policies"]
        if policy not in p:
            continue
        mine = p[policy]["max_wait_s"] or 0.0
        fifo = (p.get("fifo") or {}).get("max_wait_s")
        ok = mine <= bound_s if fifo is None or fifo <= bound_s else mine <= fifo
        rows.append({"vc": r["vc"], "start_day": r["start_day"], "max_wait_h": mine / 3600,
                     "fifo_max_wait_h": None if fifo is None else fifo / 3600, "ok": ok})
    return {"bound_h": bound_s / 3600, "worst_h": max((w["max_wait_h"] for w in rows), default=None),
            "windows_over_bound": [w for w in rows if w["max_wait_h"] > bound_s / 3600],
            "failing": [w for w in rows if not w["ok"]]}


def worst_users(runs: Sequence[dict[str, Any]], policy: str) -> Optional[dict[str, Any]]:
    """Worst and median over windows of the worst user's mean JCT / slurm's (None when the
    simulator gives no per-user figures)."""
    vals = [(r["policies"][policy]["worst_user_vs_slurm"], r) for r in runs if policy in r["policies"]
            and r["policies"][policy].get("worst_user_vs_slurm") is not None]
    if not vals:
        return None
    worst, run = max(vals, key=lambda v: v[0])
    return {"worst": worst, "median": _median(v for v, _ in vals), "worst_window": [run["vc"], run["start_day"]]}


def candidate_block(runs: Sequence[dict[str, Any]], policy: str) -> dict[str, Any]:
    vs = {b: ratios(runs, policy, (b,)) for b in BASELINES}
    vs["min(sjf,tiresias,slurm)"] = ratios(runs, policy, BEST3)
    vs["min(sjf,tiresias)"] = ratios(runs, policy, BEST2)
    return {"vs": vs, "small_jobs_vs_slurm": ratios(runs, policy, ("slurm",), "small_mean_jct_s"),
            "max_wait": waits(runs, policy), "worst_user_vs_slurm": worst_users(runs, policy)}


def _goal(goal: str, value: Optional[float], limit: float, how: str, note: str = "") -> dict[str, Any]:
    return {"goal": goal, "value": value, "limit": limit, "measure": how,
            "pass": None if value is None else value <= limit, "note": note}


def goals(group: dict[str, Any]) -> list[dict[str, Any]]:
    """The goal table of issue 24 for one group; ``pass`` None: not measured here."""
    ps, order, pre = (group.get(c) for c in CANDIDATES)
    rows = []
    if ps:
        wait = ps["max_wait"]
        users = ps["worst_user_vs_slurm"]
        rows += [
            _goal("pipeswift <= 1.0 x min(sjf, tiresias, slurm) on every window",
                  ps["vs"]["min(sjf,tiresias,slurm)"]["worst"], 1.0, "worst"),
            _goal("pipeswift median <= 0.75 x min(sjf, tiresias)", ps["vs"]["min(sjf,tiresias)"]["median"], 0.75,
                  "median"),
            _goal("pipeswift median <= 0.5 x slurm", ps["vs"]["slurm"]["median"], 0.5, "median"),
            _goal("small jobs' mean JCT <= slurm's on every window", ps["small_jobs_vs_slurm"]["worst"], 1.0,
                  "worst"),
            _goal("max wait <= bound when fifo's is; else <= fifo's", float(len(wait["failing"])), 0.0,
                  "windows failing", "the warning itself is simulate's, not checked here"),
            _goal("worst user's mean JCT <= 1.2 x slurm's", users["worst"] if users else None, 1.2, "worst",
                  "" if users else "not measured: the simulator gives no per-user figures"),
        ]
    if order:
        rows.append(_goal("pipeswift:order <= 1.0 x sjf on every window", order["vs"]["sjf"]["worst"], 1.0,
                          "worst", "" if group["layouts"] == "user" else "(goal stated for user layouts)"))
    if pre:
        rows.append(_goal("pipeswift:preempt median <= 0.6 x min(sjf, tiresias)",
                          pre["vs"]["min(sjf,tiresias)"]["median"], 0.6, "median",
                          "'within 1.2 x the ideal reference' not measured here"))
    return rows


def summarize(runs: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """One entry per (load, flex, layouts): the candidates' blocks, the goals, wall times."""
    groups: dict[tuple[float, float, str], list[dict[str, Any]]] = defaultdict(list)
    for r in runs:
        groups[group_key(r)].append(r)
    out = []
    for (load, flex, layouts), rs in sorted(groups.items()):
        group: dict[str, Any] = {"load": load, "flex": flex, "layouts": layouts, "windows": len(rs),
                                 "jobs": sum(r["jobs"] for r in rs),
                                 "window_wall_s": {"max": max(r["wall_s"] for r in rs),
                                                   "median": _median(r["wall_s"] for r in rs),
                                                   "total": sum(r["wall_s"] for r in rs)},
                                 "window_cpu_s_total": sum(r.get("cpu_s", 0.0) for r in rs)}
        for c in CANDIDATES:
            if any(c in r["policies"] for r in rs):
                group[c] = candidate_block(rs, c)
        group["goals"] = goals(group)
        out.append(group)
    return out


def overall(groups: Sequence[dict[str, Any]], truth_errors: bool) -> list[dict[str, Any]]:
    """Each goal over every group (pass only where it passes in all), and the goal "all of
    the above with expert layouts and with the truth errors"."""
    by_goal: dict[str, list[tuple[dict[str, Any], dict[str, Any]]]] = defaultdict(list)
    for g in groups:
        for row in g["goals"]:
            by_goal[row["goal"]].append((g, row))
    out = []
    for goal, items in by_goal.items():
        measured = [row["pass"] for _, row in items if row["pass"] is not None]
        out.append({"goal": goal, "pass": all(measured) if measured else None,
                    "failing_groups": ["load %g flex %g %s" % (g["load"], g["flex"], g["layouts"])
                                       for g, row in items if row["pass"] is False]})
    expert = [row["pass"] for g in groups if g["layouts"] == "expert" for row in g["goals"]
              if row["pass"] is not None]
    note = "expert layouts %s; truth errors %s" % ("run" if expert else "not run", "on" if truth_errors else "off")
    both = expert and truth_errors
    out.append({"goal": "all of the above with expert layouts and with the truth errors",
                "pass": all(expert) if both else (False if expert and not all(expert) else None),
                "failing_groups": [], "note": note})
    out.append({"goal": "decide() cold latency", "pass": None, "failing_groups": [],
                "note": "not measured here: bench/decide_latency.py"})
    return out


def goal_table(groups: Sequence[dict[str, Any]], total: Sequence[dict[str, Any]]) -> str:
    """The goal table as text: one line per goal and group, then the verdict over groups."""
    def verdict(ok: Optional[bool]) -> str:
        return "n/a" if ok is None else "PASS" if ok else "FAIL"

    lines = []
    for g in groups:
        lines.append("load %g, flex %g, %s layouts (%d windows):" % (g["load"], g["flex"], g["layouts"],
                                                                      g["windows"]))
        for row in g["goals"]:
            value = "-" if row["value"] is None else "%.3g" % row["value"]
            lines.append("  %-4s %-66s %s %s (limit %g)%s" % (verdict(row["pass"]), row["goal"], row["measure"],
                                                              value, row["limit"],
                                                              "; " + row["note"] if row["note"] else ""))
    lines.append("over all groups:")
    for row in total:
        extra = row.get("note") or (", ".join(row["failing_groups"]) and "fails at " + ", ".join(row["failing_groups"]))
        lines.append("  %-4s %s%s" % (verdict(row["pass"]), row["goal"], " (%s)" % extra if extra else ""))
    return "\n".join(lines)


def report(runs: Sequence[dict[str, Any]], settings: dict[str, Any]) -> dict[str, Any]:
    """The bench's JSON: settings, groups (with goals), goals over groups, runs."""
    groups = summarize(runs)
    truth_errors = bool(settings.get("truth_noise") or settings.get("truth_shape_noise_applied"))
    return {"settings": settings, "groups": groups, "goals": overall(groups, truth_errors), "runs": list(runs)}


# ---------------------------------------------------------------- the command

def _floats(text: str, what: str) -> tuple[float, ...]:
    try:
        values = tuple(float(x) for x in text.split(",") if x.strip())
    except ValueError:
        values = ()
    if not values or any(not math.isfinite(v) or v < 0 for v in values):
        raise SystemExit("policy_windows.py: %s %r: expected comma-separated numbers >= 0, e.g. 0.7,0.9" % (
            what, text))
    return values


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--workload", default=str(DEFAULT_TRACE), help="trace CSV (default: the dev set)")
    parser.add_argument("--quick", action="store_true",
                        help="2 windows per VC (nearest its median size), load 0.9, flex 1.0, user layouts"
                        " unless given")
    parser.add_argument("--vc", help="comma-separated virtual clusters (default: all)")
    parser.add_argument("--loads", help="default 0.7,0.9,1.1")
    parser.add_argument("--flex", help="default 1.0,0.5")
    parser.add_argument("--layouts", help="default user,expert")
    parser.add_argument("--truth-noise", type=float, default=0.0, help="log-normal sigma per job")
    parser.add_argument("--truth-shape-noise", type=float, default=0.0,
                        help="log-normal sigma per config shape (where the runner has it)")
    parser.add_argument("--min-jobs", type=int, default=MIN_JOBS)
    parser.add_argument("--max-jobs", type=int, help="skip windows with more jobs (listed as skipped): b436b2's"
                        " day-42 window, 6,127 jobs, takes about 14 CPU-minutes for its seven policies")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--dated", action="store_true", help="run each window at the trace's own dates, as"
                        " `pipeswift simulate` does (default: from time 0): the same jobs at other absolute times,"
                        " to measure how much a window's figures move by chance")
    parser.add_argument("--cron-ticks", action="store_true", help="the controller ticks only every minute on its own"
                        " clock, as a deployed one (`pipeswift simulate --cron-ticks`); default: also at every"
                        " arrival and end")
    parser.add_argument("--first-look", type=float, default=60.0, help="with --cron-ticks: psbatch's first-look"
                        " begin time in seconds (0: none; `pipeswift simulate --first-look`)")
    parser.add_argument("--out", help="write the JSON here (the goal table then goes to stdout); each run is"
                        " also appended to OUT.partial.jsonl as it ends")
    parser.add_argument("--from-partial", metavar="JSONL", help="summarize the runs of a partial file (of a grid"
                        " stopped early) instead of running")
    args = parser.parse_args(argv)
    if args.from_partial:
        return _print(report([json.loads(line) for line in Path(args.from_partial).read_text().splitlines()
                              if line.strip()], {"from_partial": args.from_partial}), args.out)
    if not Path(args.workload).exists():
        print(json.dumps({"skipped": "workload %s not found" % args.workload}))
        return 0
    loads = _floats(args.loads, "--loads") if args.loads else ((0.9,) if args.quick else LOADS)
    flexes = _floats(args.flex, "--flex") if args.flex else ((1.0,) if args.quick else FLEX)
    if any(f > 1 for f in flexes) or any(v <= 0 for v in loads):
        raise SystemExit("policy_windows.py: --flex takes shares in 0..1 and --loads numbers above 0")
    layouts = tuple(x for x in (args.layouts or ("user" if args.quick else ",".join(LAYOUTS))).split(",") if x)
    if not layouts or set(layouts) - set(LAYOUTS):
        raise SystemExit("policy_windows.py: --layouts %r: expected user, expert or both" % args.layouts)
    if args.truth_noise < 0 or args.truth_shape_noise < 0 or args.workers < 1:
        raise SystemExit("policy_windows.py: --truth-noise, --truth-shape-noise >= 0 and --workers >= 1")
    has_shape = SHAPE_FIELD in {f.name for f in dataclasses.fields(RunSpec)}
    try:
        wins, skipped = windows(read_trace(args.workload), args.vc.split(",") if args.vc else None, args.min_jobs,
                              max_jobs=args.max_jobs)
    except WorkloadError as exc:
        raise SystemExit("policy_windows.py: %s" % exc) from None
    wins = quick_subset(wins) if args.quick else wins
    if args.out:
        Path(args.out + ".partial.jsonl").unlink(missing_ok=True)
    t0 = time.perf_counter()
    runs = run_grid(args.workload, wins, loads, flexes, layouts, args.truth_noise,
                    args.truth_shape_noise if has_shape else 0.0, args.seed, args.workers, progress=sys.stderr,
                    partial=Path(args.out + ".partial.jsonl") if args.out else None, dated=args.dated,
                    cron_ticks=args.cron_ticks, first_look_s=args.first_look)
    settings = {"workload": args.workload, "quick": args.quick, "loads": loads, "flex": flexes, "layouts": layouts,
                "policies": POLICIES, "seed": args.seed, "dated": args.dated, "cron_ticks": args.cron_ticks, "first_look_s": args.first_look, "window_days": WINDOW_DAYS, "min_jobs": args.min_jobs,
                "max_jobs": args.max_jobs,
                "wait_bound_h": WAIT_BOUND_S / 3600, "truth_noise": args.truth_noise,
                "truth_shape_noise": args.truth_shape_noise,
                "truth_shape_noise_applied": bool(args.truth_shape_noise and has_shape),
                "truth": "the cost model" if not (args.truth_noise or (args.truth_shape_noise and has_shape))
                else "the cost model x seeded errors", "windows": [[w["vc"], w["start_day"], w["jobs"]] for w in wins],
                "cluster_gpus": {w["vc"]: w["gpus"] for w in wins}, "skipped_windows": skipped,
                "workers": args.workers, "wall_s": time.perf_counter() - t0}
    if args.truth_shape_noise and not has_shape:
        settings["truth_shape_noise_note"] = "ignored: this runner's RunSpec has no %s field" % SHAPE_FIELD
    return _print(report(runs, settings), args.out)


def _print(out: dict[str, Any], path: Optional[str]) -> int:
    """The JSON to ``path`` (the goal table then to stdout), else to stdout (the table to stderr)."""
    text = json.dumps(out, indent=1)
    table = goal_table(out["groups"], out["goals"])
    if path:
        Path(path).write_text(text + "\n")
        print(table)
    else:
        print(text)
        print(table, file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
