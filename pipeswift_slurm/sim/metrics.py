"""Metrics of a simulation run: JCT statistics, per size class, queue-time ratio, waits,
utilisation, reconfigurations (jobs resized; jobs run in a layout other than their user's),
decision cost, per user, and the isolated-run lower bound.

Size classes (``sizeclass.size_class``, the same rule as the store and reports) use the
job's GPU-time as submitted: requested GPUs x recorded duration. A job's slowdown is its
JCT over its run time alone: the true run time of the config it asked for, on the GPUs it
asked for, with no queue (``alone_s``). The worst user of a policy is the one whose mean
JCT over the base policy's (slurm) is highest, among users with at least
``MIN_USER_JOBS`` jobs (fewer make a ratio of noise). Pure: no I/O.
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from typing import Any, Iterable, Mapping, Optional, Sequence

from pipeswift_slurm.core.megatron_rules import same_layout
from pipeswift_slurm.core.sizeclass import size_class
from pipeswift_slurm.sim.engine import SimResult
from pipeswift_slurm.sim.workload import WorkloadJob

MIN_USER_JOBS = 3


def percentile(values: Sequence[float], q: float) -> Optional[float]:
    """Nearest-rank percentile (q in 0..100) of ``values``; None when empty."""
    if not values:
        return None
    ordered = sorted(values)
    rank = max(1, int(-(-q * len(ordered) // 100)))
    return ordered[min(rank, len(ordered)) - 1]


def _mean(values: Iterable[float]) -> Optional[float]:
    vals = list(values)
    return statistics.fmean(vals) if vals else None


def true_run_s(job: WorkloadJob, truth: Any, config: Any) -> float:
    """The whole job's true run time in ``config`` from a fresh start: the truth's startup
    plus iterations x iteration time (its shape factor included), times the job's own
    factor (class bias x noise), as the engine runs it."""
    return truth.job_time_s(job.profile, config) * job.truth_factor


def lower_bound_s(jobs: Sequence[WorkloadJob], estimator: Any, truth: Any, cluster_gpus: int) -> float:
    """Mean over jobs of the best isolated true run time: no queue, the fastest predicted
    config on any GPU count the job allows (within the cluster), at its true run time (shape
    factor included: with shape noise, the best a scheduler can do on these predictions)."""
    total = 0.0
    for job in jobs:
        if job.profile is None:  # replayed as it ran
            total += job.recorded_duration_s
            continue
        lo, hi = job.profile.gpu_range
        best = None
        for gpus in range(lo, min(hi, cluster_gpus) + 1):
            est = estimator.fastest(job.profile, gpus)
            if est is not None and (best is None or est.iter_time_s < best.iter_time_s):
                best = est
        config = best.config if best is not None else job.profile.requested
        total += true_run_s(job, truth, config)
    return total / len(jobs) if jobs else 0.0


def alone_s(jobs: Sequence[WorkloadJob], truth: Any) -> dict[int, float]:
    """Map from job_id to the job's true run time alone in the config and on the GPUs it
    asked for (a job replayed as it ran: its recorded run time)."""
    return {j.job_id: j.recorded_duration_s if j.profile is None
            else true_run_s(j, truth, j.profile.requested) for j in jobs}


def user_metrics(result: SimResult, alone: Mapping[int, float]) -> dict[str, dict[str, Any]]:
    """Per user (sorted by name): jobs, mean JCT and mean slowdown (JCT / ``alone``)."""
    jct: dict[str, list[float]] = defaultdict(list)
    slow: dict[str, list[float]] = defaultdict(list)
    for r in result.records:
        jct[r.user].append(r.jct_s)
        if alone.get(r.job_id):
            slow[r.user].append(r.jct_s / alone[r.job_id])
    return {u: {"jobs": len(jct[u]), "mean_jct_s": _mean(jct[u]), "mean_slowdown": _mean(slow[u])}
            for u in sorted(jct)}


def worst_user(metrics: dict[str, Any], base: dict[str, Any],
               min_jobs: int = MIN_USER_JOBS) -> Optional[dict[str, Any]]:
    """The user whose mean JCT under ``metrics`` over ``base``'s is highest (users with at
    least ``min_jobs`` jobs): {"user", "jct_ratio", "users"}; None when no user qualifies."""
    ratios = [(m["mean_jct_s"] / base["users"][u]["mean_jct_s"], u) for u, m in metrics["users"].items()
              if m["jobs"] >= min_jobs and base["users"].get(u, {}).get("mean_jct_s")]
    if not ratios:
        return None
    ratio, user = max(ratios, key=lambda x: (x[0], x[1]))
    return {"user": user, "jct_ratio": ratio, "users": len(ratios)}


def summarize(result: SimResult, jobs: Sequence[WorkloadJob], wait_bound_s: float,
              alone: Optional[Mapping[int, float]] = None) -> dict[str, Any]:
    """The stable metrics dict of one run (keys documented in docs/json.md); ``alone``
    (``alone_s``) gives the per-user slowdowns (None: their ``mean_slowdown`` is None)."""
    recs = result.records
    by_id = {j.job_id: j for j in jobs}
    jct = [r.jct_s for r in recs]
    classes: dict[str, list[float]] = {"small": [], "medium": [], "large": []}
    for r in recs:
        classes[size_class(r.requested_gpus, by_id[r.job_id].recorded_duration_s) or "small"].append(r.jct_s)
    waits = [r.queue_s for r in recs]
    busy = sum(r.busy_gpu_s for r in recs)
    return {
        "policy": result.policy,
        "jobs": len(recs),
        "mean_jct_s": _mean(jct),
        "median_jct_s": percentile(jct, 50),
        "p95_jct_s": percentile(jct, 95),
        "p99_jct_s": percentile(jct, 99),
        "mean_jct_s_by_class": {k: _mean(v) for k, v in classes.items()},
        "jobs_by_class": {k: len(v) for k, v in classes.items()},
        "p99_jct_s_large": percentile(classes["large"], 99),
        "mean_queue_s": _mean(waits),
        "queue_ratio": (sum(waits) / sum(jct)) if jct and sum(jct) > 0 else None,
        "max_wait_s": max(waits, default=None),
        "jobs_over_wait_bound": sum(1 for w in waits if w > wait_bound_s),
        "wait_bound_s": wait_bound_s,
        "bound_kept": max(waits, default=0.0) <= wait_bound_s,
        "users": user_metrics(result, alone or {}),
        "gpu_utilisation": busy / (result.makespan_s * result.total_gpus) if result.makespan_s else None,
        "makespan_s": result.makespan_s,
        "reconfigured_jobs": sum(1 for r in recs if r.reconfigured),
        "relayout_jobs": sum(1 for r in recs if r.config is not None
                             and not same_layout(r.config, by_id[r.job_id].profile.requested)),
        "restarts": sum(r.restarts for r in recs),
        "moved_partition_jobs": sum(1 for r in recs if r.partition and r.partition != by_id[r.job_id].partition),
        "scontrol_updates": result.updates,
        "ticks": result.ticks,
        "decide_ms_mean": 1000 * _mean(result.decide_s) if result.decide_s else None,
        "decide_ms_max": 1000 * max(result.decide_s) if result.decide_s else None,
        "wall_s": result.wall_s,
    }
