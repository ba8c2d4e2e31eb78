"""Admin reports on the controller's own record: estimator bias per job class, the
decision log with outcome counts, tick health and job counts (``pipeswift report``).

Reads through ``store.reads`` (whose SQL follows ``sql/estimator_bias.sql`` and
``sql/decisions.sql``); every function takes a ``Store`` or an ``Engine`` and returns the
frozen dataclasses of ``reports.base``. Must not import matplotlib, click, any Slurm
backend or ``reports.queries`` (which builds on this module).
"""

from __future__ import annotations

from typing import Any, Optional

from pipeswift_slurm.reports.base import (BiasReport, BiasRow, DecisionEntry, DecisionsReport, JobCount, LeverCount,
                                          RequeuedJob, TickStats, Window)
from pipeswift_slurm.store import reads


# ---------------------------------------------------------------- estimator bias


def bias(src: Any, window: Window = Window()) -> BiasReport:
    """Estimator bias per job class: actual / predicted run time (n, mean, median, range).

    Over completed jobs (COMPLETED, COMPLETED?) with a run time and the controller's last
    prediction, as ``sql/estimator_bias.sql``; each row also carries the calibration
    table's fitted ratio for the class (None when the class has no calibration yet).
    """
    rows = [
        BiasRow(
            r.job_class,
            r.n_jobs,
            r.mean_ratio,
            r.median_ratio,
            r.min_ratio,
            r.max_ratio,
            r.calibrated_ratio,
            r.calibrated_on,
        )
        for r in reads.bias_rows(src, window.since_s, window.until_s)
    ]
    calibration = {
        r.job_class: (float(r.ratio), int(r.n_jobs))
        for r in reads.calibration_rows(src)
    }
    return BiasReport(rows, calibration)


# ---------------------------------------------------------------- decisions

MOST_REQUEUED = 5  # jobs listed as the most requeued


def decisions(
    src: Any,
    window: Window = Window(),
    job_id: Optional[int] = None,
    limit: int = 50,
    all_kinds: bool = False,
) -> DecisionsReport:
    """The decision log: the ``limit`` latest decisions (newest first) and window counts.

    Like ``sql/decisions.sql``, decisions that moved no lever (kind ``none``) are left out
    of the list unless ``all_kinds``; the counts cover every decision in the window, and
    so do the applied decisions per lever and the ``MOST_REQUEUED`` jobs requeued most.

    Args:
        src: a Store or an Engine.
        window: decisions made (``at``) in this window.
        job_id: only this job's decisions.
        limit: most rows listed.
        all_kinds: also list decisions that changed nothing.
    """
    found, c = reads.decision_rows(src, window.since_s, window.until_s, job_id, limit, all_kinds)
    rows = [
        DecisionEntry(
            r.id,
            r.tick_id,
            r.at,
            r.job_id,
            r.user,
            r.kind,
            r.config,
            r.gpus,
            r.site_factor,
            r.time_limit_s,
            r.outcome,
            r.error,
            r.reason,
            r.predicted_start_s,
            r.predicted_end_s,
        )
        for r in found
    ]
    tallies, requeued = reads.decision_lever_rows(src, window.since_s, window.until_s, job_id, MOST_REQUEUED)
    tally = tallies._mapping
    levers = [LeverCount(name, int(tally["n_" + name]), int(tally["jobs_" + name])) for name, _ in reads.LEVER_TALLIES]
    return DecisionsReport(rows, c.n_total, c.n_intended, c.n_applied, c.n_failed, c.n_not_attempted, limit, levers,
                           [RequeuedJob(r.job_id, r.user, int(r.requeues)) for r in requeued])


# ---------------------------------------------------------------- ticks and counts


def tick_stats(src: Any, window: Window = Window()) -> TickStats:
    """Ticks in the window (by ``started_at``): count, failures, mean duration, and the
    last tick's time, duration and status."""
    agg, last = reads.tick_rows(src, window.since_s, window.until_s)
    if last is None:
        return TickStats(agg.n_ticks, agg.n_failed, None, None, agg.mean_duration_s, None)
    return TickStats(agg.n_ticks, agg.n_failed, last.started_at, last.duration_s, agg.mean_duration_s, last.status)


def job_count(src: Any, window: Window = Window()) -> JobCount:
    """Jobs submitted in the window (and the first and last submit times)."""
    r = reads.job_span(src, window.since_s, window.until_s)
    return JobCount(r.n, r.first_s, r.last_s)
