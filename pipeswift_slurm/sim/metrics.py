"""Metrics of a simulation run: JCT statistics, per size class, queue-time ratio, waits,
utilisation, reconfigurations, decision cost, and the isolated-run lower bound.

Size classes (``sizeclass.size_class``, the same rule as the store and reports) use the
job's GPU-time as submitted: requested GPUs x recorded duration. Pure: no I/O.
"""

from __future__ import annotations

import statistics
from typing import Any, Iterable, Optional, Sequence

from pipeswift_slurm.core.sizeclass import size_class
from pipeswift_slurm.sim.engine import SimResult
from pipeswift_slurm.sim.workload import WorkloadJob

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


def lower_bound_s(jobs: Sequence[WorkloadJob], estimator: Any, truth: Any, cluster_gpus: int) -> float:
    """Mean over jobs of the best isolated true run time: no queue, best predicted config
    on any GPU count the job allows (within the cluster)."""
    total = 0.0
    for job in jobs:
        if job.profile is None:  # replayed as it ran
            total += job.recorded_duration_s
            continue
        lo, hi = job.profile.gpu_range
        best = None
        for gpus in range(lo, min(hi, cluster_gpus) + 1):
            est = estimator.best(job.profile, gpus)
            if est is not None and (best is None or est.iter_time_s < best.iter_time_s):
                best = est
        config = best.config if best is not None else job.profile.requested
        total += truth.job_time_s(job.profile, config) * job.truth_factor
    return total / len(jobs) if jobs else 0.0


def summarize(result: SimResult, jobs: Sequence[WorkloadJob], wait_bound_s: float) -> dict[str, Any]:
    """The stable metrics dict of one run (keys documented in the README)."""
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
        "gpu_utilisation": busy / (result.makespan_s * result.total_gpus) if result.makespan_s else None,
        "makespan_s": result.makespan_s,
        "reconfigured_jobs": sum(1 for r in recs if r.reconfigured),
        "restarts": sum(r.restarts for r in recs),
        "scontrol_updates": result.updates,
        "ticks": result.ticks,
        "decide_ms_mean": 1000 * _mean(result.decide_s) if result.decide_s else None,
        "decide_ms_max": 1000 * max(result.decide_s) if result.decide_s else None,
        "wall_s": result.wall_s,
    }
