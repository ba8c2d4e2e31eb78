"""Admin report queries over the controller's history database: rows, not text.

This module owns the SQL behind ``pipeswift report``: the queue-time ratio (queue / JCT)
per hour, day, user, size class or partition with a verdict, the JCT distribution, waits
and starvation, estimator bias per job class, the decision log and tick health. Every
function takes a ``Store`` (or a bare SQLAlchemy ``Engine``) and returns frozen
dataclasses with full-precision numbers in seconds; formatting, plots and Prometheus text
live in ``report_render.py``. The result dataclasses, the window and time parsing are
``report_base``; bias, decisions and tick health are ``report_audit`` (both re-exported
here, so ``reports`` stays the one entry point). It must not import matplotlib, click or
any Slurm backend.

The SQL is kept here as text (aggregation happens in the database, so 100,000 jobs take
well under a second) and follows the definitions of the admin files in ``sql/`` at the
repository root: ``queue_ratio_by_hour.sql``, ``jct_by_size_class.sql``, ``waits.sql``,
``estimator_bias.sql`` and ``decisions.sql``. ``tests/unit/test_reports.py`` runs those
files and these functions on the same databases and checks that the figures agree. The
text is not loaded from ``sql/`` because that folder is not installed with the package.

Window rule: ``since``/``until`` (epoch seconds, either may be None) select jobs by
``submit_time`` in ``[since, until)`` and decisions by their ``at``. Percentiles are
nearest-rank (the value at rank ceil(p * n)), as in ``sql/``. Time buckets (hour, day)
are UTC and computed with ``CAST(t / 3600 AS INTEGER)`` (SQLite truncation).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Optional

from pipeswift_slurm.reports.audit import bias, decisions, job_count, tick_stats
from pipeswift_slurm.reports.audit import BIAS_SQL, DECISIONS_SQL, DECISION_COUNTS_SQL, LAST_TICK_SQL  # noqa: F401
from pipeswift_slurm.reports.audit import TICKS_SQL  # noqa: F401
from pipeswift_slurm.reports.base import BiasReport, DEFAULT_THRESHOLD, DEFAULT_WAIT_BOUND_S, DecisionsReport, FINISHED_SQL
from pipeswift_slurm.reports.base import JctReport, JctRow, JobCount, QueueRatioReport, QueueRatioRow, SIZE_ORDER, TickStats
from pipeswift_slurm.reports.base import WaitRow, WaitsReport, Window, _WINDOW, _group_sql, _label, _rows, _sort_key
from pipeswift_slurm.reports.base import BiasRow, DecisionEntry, GROUPS, ReportError, has_history_tables  # noqa: F401
from pipeswift_slurm.reports.base import parse_time  # noqa: F401

log = logging.getLogger(__name__)


# ---------------------------------------------------------------- queue ratio

QUEUE_RATIO_SQL = """
SELECT {group}                                             AS grp,
       COUNT(*)                                            AS n_jobs,
       COALESCE(SUM(queue_s), 0)                           AS queue_s,
       COALESCE(SUM(run_s), 0)                             AS run_s,
       SUM(queue_s) / NULLIF(SUM(queue_s + run_s), 0)      AS queue_ratio,
       AVG(queue_s / NULLIF(queue_s + run_s, 0))           AS mean_job_ratio
FROM jobs
WHERE queue_s IS NOT NULL
  AND run_s IS NOT NULL
  AND submit_time IS NOT NULL
  AND {window}
  {extra}
GROUP BY grp
"""


def _queue_rows(src: Any, by: str, window: Window, extra: str = "") -> list[QueueRatioRow]:
    sql = QUEUE_RATIO_SQL.format(group=_group_sql(by), window=_WINDOW, extra=extra)
    out = []
    for r in _rows(src, sql, window.params):
        label, bucket = _label(by, r.grp)
        out.append(
            QueueRatioRow(
                label, r.n_jobs, float(r.queue_s), float(r.run_s), r.queue_ratio, r.mean_job_ratio, bucket
            )
        )
    return sorted(out, key=lambda row: _sort_key(by, row))


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
    small = (_queue_rows(src, "all", window, "AND size_class = 'small'") or [_empty_queue_row("all")])[0]
    small = QueueRatioRow(
        "small", small.n_jobs, small.queue_s, small.run_s, small.queue_ratio, small.mean_job_ratio
    )
    bound, verdict = _verdict(overall, small, threshold)
    return QueueRatioReport(by, rows, overall, small, threshold, bound, verdict)


# ---------------------------------------------------------------- JCT

JCT_SQL = """
WITH finished AS (
    SELECT {group} AS grp, end_time - submit_time AS jct_s, queue_s
    FROM jobs
    WHERE state IN {finished}
      AND start_time IS NOT NULL
      AND end_time IS NOT NULL
      AND submit_time IS NOT NULL
      AND {window}
), ranked AS (
    SELECT grp, jct_s, queue_s,
           ROW_NUMBER() OVER (PARTITION BY grp ORDER BY jct_s) AS rank_,
           COUNT(*) OVER (PARTITION BY grp)                    AS n
    FROM finished
)
SELECT grp,
       COUNT(*)                                                AS n_jobs,
       AVG(jct_s)                                              AS mean_s,
       MAX(CASE WHEN rank_ = (n + 1) / 2 THEN jct_s END)        AS p50_s,
       MAX(CASE WHEN rank_ = (95 * n + 99) / 100 THEN jct_s END) AS p95_s,
       MAX(CASE WHEN rank_ = (99 * n + 99) / 100 THEN jct_s END) AS p99_s,
       MAX(jct_s)                                              AS max_s,
       AVG(queue_s)                                            AS mean_queue_s
FROM ranked
GROUP BY grp
"""


def _jct_rows(src: Any, by: str, window: Window) -> list[JctRow]:
    sql = JCT_SQL.format(group=_group_sql(by), window=_WINDOW, finished=FINISHED_SQL)
    out = []
    for r in _rows(src, sql, window.params):
        label, _ = _label(by, r.grp)
        out.append(JctRow(label, r.n_jobs, r.mean_s, r.p50_s, r.p95_s, r.p99_s, r.max_s, r.mean_queue_s))
    return sorted(out, key=lambda row: _sort_key(by, row))


def jct(src: Any, window: Window = Window(), by: str = "size") -> JctReport:
    """JCT (end - submit) of completed jobs per group: mean, P50, P95, P99, max.

    Over jobs in state COMPLETED or COMPLETED? with submit, start and end times, as
    ``sql/jct_by_size_class.sql``; percentiles are nearest-rank.
    """
    rows = _jct_rows(src, by, window)
    overall = _jct_rows(src, "all", window)
    return JctReport(by, rows, overall[0] if overall else None)


JCT_VALUES_SQL = """
SELECT {group} AS grp, end_time - submit_time AS jct_s
FROM jobs
WHERE state IN {finished}
  AND start_time IS NOT NULL AND end_time IS NOT NULL AND submit_time IS NOT NULL
  AND {window}
ORDER BY grp, jct_s
"""


def jct_values(src: Any, window: Window = Window(), by: str = "size") -> dict[str, list[float]]:
    """Map from group to the sorted JCTs (seconds) of its completed jobs (for CDF plots)."""
    sql = JCT_VALUES_SQL.format(group=_group_sql(by), window=_WINDOW, finished=FINISHED_SQL)
    out: dict[str, list[float]] = {}
    for grp, value in _rows(src, sql, window.params):
        out.setdefault(_label(by, grp)[0], []).append(float(value))
    if by == "size":
        return {
            k: out[k] for k in sorted(out, key=lambda g: (SIZE_ORDER.index(g) if g in SIZE_ORDER else 9, g))
        }
    return out


# ---------------------------------------------------------------- waits

WAITS_SQL = """
WITH waits AS (
    SELECT job_id,
           {group}                         AS grp,
           CASE WHEN start_time IS NOT NULL THEN queue_s
                ELSE :now - COALESCE(eligible_time, submit_time)
           END                             AS wait_s,
           CASE WHEN start_time IS NULL THEN 1 ELSE 0 END AS still_pending
    FROM jobs
    WHERE (start_time IS NOT NULL OR state = 'PENDING')
      AND {window}
), ranked AS (
    SELECT job_id, grp, wait_s, still_pending,
           ROW_NUMBER() OVER (PARTITION BY grp ORDER BY wait_s, job_id DESC) AS rank_,
           COUNT(*) OVER (PARTITION BY grp) AS n
    FROM waits
    WHERE wait_s IS NOT NULL
)
SELECT grp,
       COUNT(*)                                               AS n_jobs,
       SUM(still_pending)                                     AS n_pending,
       AVG(wait_s)                                            AS mean_s,
       MAX(CASE WHEN rank_ = (n + 1) / 2 THEN wait_s END)      AS median_s,
       MAX(wait_s)                                            AS max_s,
       MAX(CASE WHEN rank_ = n THEN job_id END)               AS max_job_id,  -- lowest id on ties
       SUM(CASE WHEN wait_s > :bound THEN 1 ELSE 0 END)       AS n_over_bound
FROM ranked
GROUP BY grp
"""


def history_now_s(src: Any, window: Window = Window()) -> Optional[float]:
    """The history's "now": the last tick's time (before ``until`` when given), else the
    latest job time recorded; None for an empty database."""
    sql = "SELECT MAX(started_at) FROM ticks WHERE (:until IS NULL OR started_at < :until)"
    now = _rows(src, sql, {"until": window.until_s})[0][0]
    if now is None:
        now = _rows(
            src,
            "SELECT MAX(MAX(COALESCE(submit_time, 0), COALESCE(start_time, 0), "
            "COALESCE(end_time, 0))) FROM jobs",
            {},
        )[0][0]
    return None if now is None else float(now)


def _wait_rows(src: Any, by: str, window: Window, now_s: Optional[float], bound_s: float) -> list[WaitRow]:
    sql = WAITS_SQL.format(group=_group_sql(by), window=_WINDOW)
    params = {**window.params, "now": now_s, "bound": bound_s}
    out = [
        WaitRow(
            _label(by, r.grp)[0],
            r.n_jobs,
            r.n_pending,
            r.mean_s,
            r.median_s,
            r.max_s,
            r.max_job_id,
            r.n_over_bound,
        )
        for r in _rows(src, sql, params)
    ]
    return sorted(out, key=lambda row: _sort_key(by, row))


def waits(
    src: Any, window: Window = Window(), by: str = "size", wait_bound_s: float = DEFAULT_WAIT_BOUND_S
) -> WaitsReport:
    """Waits per group, still-pending jobs included: mean, median, max (and whose), how
    many waited longer than ``wait_bound_s``.

    A started job's wait is its ``queue_s``; a PENDING job's is (now - eligible-or-submit)
    with now = the last tick (``history_now_s``), as ``sql/waits.sql``.
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
