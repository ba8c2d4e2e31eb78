"""Admin reports over the controller's history database: rows, not text.

This module builds the reports behind ``pipeswift report`` from the store's reads
(``store.reads``, which owns the SQL and follows the admin files in ``sql/``): the
queue-time ratio (queue / JCT) per hour, day, user, size class or partition with a
verdict, the JCT distribution, and waits and starvation; bias, decisions and tick health
are ``reports.audit`` and the result dataclasses, the window and time parsing
``reports.base`` (both re-exported here, so this module stays the one entry point).
Every function takes a ``Store`` (or a bare SQLAlchemy ``Engine``) and returns frozen
dataclasses with full-precision numbers in seconds; formatting, plots and Prometheus text
live in ``reports.render``. It must not import matplotlib, click or any Slurm backend.
Window rule: ``since``/``until`` (epoch seconds, either may be None) select jobs by
``submit_time`` in ``[since, until)`` and decisions by their ``at``.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Optional

from pipeswift_slurm.reports.audit import bias, decisions, job_count, tick_stats
from pipeswift_slurm.reports.base import (DEFAULT_THRESHOLD, DEFAULT_WAIT_BOUND_S, SIZE_ORDER, BiasReport,
                                          DecisionsReport, JctReport, JctRow, JobCount, QueueRatioReport,
                                          QueueRatioRow, TickStats, WaitRow, WaitsReport, Window, check_group,
                                          group_label, group_sort_key)
from pipeswift_slurm.reports.base import BiasRow, DecisionEntry, GROUPS, ReportError  # noqa: F401
from pipeswift_slurm.reports.base import parse_time  # noqa: F401
from pipeswift_slurm.store import reads
from pipeswift_slurm.store.reads import has_history_tables  # noqa: F401

log = logging.getLogger(__name__)


# ---------------------------------------------------------------- queue ratio


def _queue_rows(src: Any, by: str, window: Window, small_only: bool = False) -> list[QueueRatioRow]:
    out = []
    for r in reads.queue_ratio_rows(src, check_group(by), window.since_s, window.until_s, small_only):
        label, bucket = group_label(by, r.grp)
        out.append(
            QueueRatioRow(
                label, r.n_jobs, float(r.queue_s), float(r.run_s), r.queue_ratio, r.mean_job_ratio, bucket
            )
        )
    return sorted(out, key=lambda row: group_sort_key(by, row))


def _empty_queue_row(group: str) -> QueueRatioRow:
    return QueueRatioRow(group, 0, 0.0, 0.0, None, None)


def _verdict(overall: QueueRatioRow, small: QueueRatioRow, threshold: float) -> tuple[Optional[str], str]:
    basis, who = (small, "small jobs") if small.n_jobs else (overall, "all jobs")
    if basis.queue_ratio is None:
        return None, "no finished jobs: no verdict"
    pct, limit = 100.0 * basis.queue_ratio, 100.0 * threshold
    if basis.queue_ratio > threshold:
        return "queue", (
            "queue-bound: %s spend %.0f%% of their JCT queued (> %.0f%%): the scheduler, "
            "not the pipeline, is the bottleneck" % (who, pct, limit)
        )
    return "execution", (
        "execution-bound: %s spend %.0f%% of their JCT queued (<= %.0f%%): run time, "
        "not the queue, dominates" % (who, pct, limit)
    )


def queue_ratio(
    src: Any, window: Window = Window(), by: str = "hour", threshold: float = DEFAULT_THRESHOLD
) -> QueueRatioReport:
    """Queue-time ratio (total queue / total (queue + run) time) per group, with a verdict.

    Over jobs with both ``queue_s`` and ``run_s`` (started and ended, whatever their final
    state), as ``sql/queue_ratio_by_hour.sql``. The verdict is "queue-bound" when small jobs
    (all jobs if there are no small ones) spend more than ``threshold`` of JCT queued.

    Args:
        src: a Store or an Engine.
        window: jobs submitted in this window.
        by: hour, day, user, size or partition.
        threshold: queue share of JCT above which the queue is the bottleneck.
    """
    rows = _queue_rows(src, by, window)
    overall = (_queue_rows(src, "all", window) or [_empty_queue_row("all")])[0]
    small = (_queue_rows(src, "all", window, small_only=True) or [_empty_queue_row("all")])[0]
    small = QueueRatioRow(
        "small", small.n_jobs, small.queue_s, small.run_s, small.queue_ratio, small.mean_job_ratio
    )
    bound, verdict = _verdict(overall, small, threshold)
    return QueueRatioReport(by, rows, overall, small, threshold, bound, verdict)


# ---------------------------------------------------------------- JCT


def _jct_rows(src: Any, by: str, window: Window) -> list[JctRow]:
    out = []
    for r in reads.jct_rows(src, check_group(by), window.since_s, window.until_s):
        label, _ = group_label(by, r.grp)
        out.append(JctRow(label, r.n_jobs, r.mean_s, r.p50_s, r.p95_s, r.p99_s, r.max_s, r.mean_queue_s))
    return sorted(out, key=lambda row: group_sort_key(by, row))


def jct(src: Any, window: Window = Window(), by: str = "size") -> JctReport:
    """JCT (end - submit) of completed jobs per group: mean, P50, P95, P99, max.

    Over jobs in state COMPLETED or COMPLETED? with submit, start and end times, as
    ``sql/jct_by_size_class.sql``; percentiles are nearest-rank.
    """
    rows = _jct_rows(src, by, window)
    overall = _jct_rows(src, "all", window)
    return JctReport(by, rows, overall[0] if overall else None)



def jct_values(src: Any, window: Window = Window(), by: str = "size") -> dict[str, list[float]]:
    """Map from group to the sorted JCTs (seconds) of its completed jobs (for CDF plots)."""
    out: dict[str, list[float]] = {}
    for grp, value in reads.jct_value_rows(src, check_group(by), window.since_s, window.until_s):
        out.setdefault(group_label(by, grp)[0], []).append(float(value))
    if by == "size":
        return {
            k: out[k] for k in sorted(out, key=lambda g: (SIZE_ORDER.index(g) if g in SIZE_ORDER else 9, g))
        }
    return out


# ---------------------------------------------------------------- waits


def history_now_s(src: Any, window: Window = Window()) -> Optional[float]:
    """The history's "now": the last tick's time (before ``until`` when given), else the
    latest job time recorded; None for an empty database."""
    now = reads.last_tick_s(src, window.until_s)
    return now if now is not None else reads.latest_job_time_s(src)


def _wait_rows(src: Any, by: str, window: Window, now_s: Optional[float], bound_s: float) -> list[WaitRow]:
    out = [
        WaitRow(
            group_label(by, r.grp)[0],
            r.n_jobs,
            r.n_pending,
            r.mean_s,
            r.median_s,
            r.max_s,
            r.max_job_id,
            r.n_over_bound,
            r.n_pending_over_bound or 0,
        )
        for r in reads.wait_rows(src, check_group(by), window.since_s, window.until_s, now_s, bound_s)
    ]
    return sorted(out, key=lambda row: group_sort_key(by, row))


def waits(
    src: Any, window: Window = Window(), by: str = "size", wait_bound_s: float = DEFAULT_WAIT_BOUND_S
) -> WaitsReport:
    """Waits per group, still-pending jobs included: mean, median, max (and whose), how
    many waited longer than ``wait_bound_s``.

    A started job's wait is its ``queue_s``; a PENDING job's is (now - its
    ``wait_origin_time``: eligible-or-submit, less earlier runs), none while a begin time is
    ahead, with now = the last tick (``history_now_s``); ``sql/waits.sql`` is the same query.
    """
    now_s = history_now_s(src, window)
    rows = _wait_rows(src, by, window, now_s, wait_bound_s)
    overall = _wait_rows(src, "all", window, now_s, wait_bound_s)
    return WaitsReport(by, rows, overall[0] if overall else None, wait_bound_s, now_s)


@dataclass(frozen=True)
class FullReport:
    """Every report over one window (what ``pipeswift report all`` shows)."""

    window: Window
    jobs: JobCount
    queue_ratio: QueueRatioReport
    queue_ratio_by_size: QueueRatioReport
    queue_ratio_by_hour: QueueRatioReport
    jct: JctReport
    waits: WaitsReport
    bias: BiasReport
    decisions: DecisionsReport
    ticks: TickStats


def full_report(
    src: Any,
    window: Window = Window(),
    by: str = "day",
    threshold: float = DEFAULT_THRESHOLD,
    wait_bound_s: float = DEFAULT_WAIT_BOUND_S,
    limit: int = 20,
) -> FullReport:
    """All reports: queue ratio by ``by``, by size class and by hour (the curve), JCT and
    waits by size class, bias, the latest ``limit`` decisions, tick health."""
    return FullReport(
        window,
        job_count(src, window),
        queue_ratio(src, window, by, threshold),
        queue_ratio(src, window, "size", threshold),
        queue_ratio(src, window, "hour", threshold),
        jct(src, window, "size"),
        waits(src, window, "size", wait_bound_s),
        bias(src, window),
        decisions(src, window, limit=limit),
        tick_stats(src, window),
    )


def kinds() -> Sequence[str]:
    """Report kinds the CLI offers."""
    return ("queue-ratio", "jct", "waits", "bias", "decisions", "all")
