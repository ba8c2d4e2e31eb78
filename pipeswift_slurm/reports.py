"""Admin report queries over the controller's history database: rows, not text.

This module owns the SQL behind ``pipeswift report``: the queue-time ratio (queue / JCT)
per hour, day, user, size class or partition with a verdict, the JCT distribution, waits
and starvation, estimator bias per job class, the decision log and tick health. Every
function takes a ``Store`` (or a bare SQLAlchemy ``Engine``) and returns frozen
dataclasses with full-precision numbers in seconds; formatting, plots and Prometheus text
live in ``report_render.py``. It must not import matplotlib, click or any Slurm backend.

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
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Optional

from sqlalchemy import Engine, inspect, text

log = logging.getLogger(__name__)

SIZE_ORDER = ("small", "medium", "large", "unknown")
FINISHED_SQL = "('COMPLETED', 'COMPLETED?')"
DEFAULT_THRESHOLD = 0.5
DEFAULT_WAIT_BOUND_S = 24 * 3600.0  # as sql/waits.sql
GROUPS = {
    "hour": "CAST(submit_time / 3600 AS INTEGER) * 3600",
    "day": "CAST(submit_time / 86400 AS INTEGER) * 86400",
    "user": "COALESCE(NULLIF(user, ''), '(none)')",
    "size": "COALESCE(size_class, 'unknown')",
    "partition": "COALESCE(NULLIF(partition, ''), '(none)')",
    "all": "'all'",
}
_WINDOW = "(:since IS NULL OR submit_time >= :since) AND (:until IS NULL OR submit_time < :until)"
_RELATIVE = re.compile(r"^-(\d+(?:\.\d+)?)([smhdw])$")
_UNIT_S = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, "w": 604800.0}


class ReportError(ValueError):
    """Bad report input (a time that does not parse, an unknown grouping)."""


@dataclass(frozen=True)
class Window:
    """Jobs submitted in ``[since_s, until_s)`` (epoch seconds; None = unbounded)."""

    since_s: Optional[float] = None
    until_s: Optional[float] = None

    @property
    def params(self) -> dict[str, Optional[float]]:
        return {"since": self.since_s, "until": self.until_s}


@dataclass(frozen=True)
class QueueRatioRow:
    """Queue and run time of the jobs of one group; ratio = queue / (queue + run).

    ``bucket_s`` is the bucket's start (epoch s) for hour/day groups, else None.
    """

    group: str
    n_jobs: int
    queue_s: float
    run_s: float
    queue_ratio: Optional[float]
    mean_job_ratio: Optional[float]
    bucket_s: Optional[float] = None


@dataclass(frozen=True)
class QueueRatioReport:
    """Queue-time ratio per group, overall and for small jobs, with the verdict.

    ``bound`` is "queue" (the scheduler is the bottleneck), "execution" or None (no
    data); it is judged on small jobs when there are any, else on all jobs.
    """

    by: str
    rows: list[QueueRatioRow]
    overall: QueueRatioRow
    small: QueueRatioRow
    threshold: float
    bound: Optional[str]
    verdict: str


@dataclass(frozen=True)
class JctRow:
    """JCT (end - submit, seconds) of the completed jobs of one group."""

    group: str
    n_jobs: int
    mean_s: float
    p50_s: float
    p95_s: float
    p99_s: float
    max_s: float
    mean_queue_s: Optional[float]


@dataclass(frozen=True)
class JctReport:
    by: str
    rows: list[JctRow]
    overall: Optional[JctRow]


@dataclass(frozen=True)
class WaitRow:
    """Waits of one group: started jobs' queue_s, pending jobs' wait so far."""

    group: str
    n_jobs: int
    n_pending: int
    mean_s: float
    median_s: float
    max_s: float
    max_job_id: int
    n_over_bound: int


@dataclass(frozen=True)
class WaitsReport:
    """Waits per group; ``now_s`` is when pending jobs' waits are measured to."""

    by: str
    rows: list[WaitRow]
    overall: Optional[WaitRow]
    wait_bound_s: float
    now_s: Optional[float]


@dataclass(frozen=True)
class BiasRow:
    """Actual / predicted run time of one job class, next to the calibration in use."""

    job_class: str
    n_jobs: int
    mean_ratio: float
    median_ratio: float
    min_ratio: float
    max_ratio: float
    calibrated_ratio: Optional[float]
    calibrated_on: Optional[int]


@dataclass(frozen=True)
class BiasReport:
    rows: list[BiasRow]
    calibration: dict[str, tuple[float, int]] = field(default_factory=dict)


@dataclass(frozen=True)
class DecisionEntry:
    """One recorded decision; ``outcome`` is applied, FAILED or not applied."""

    id: int
    tick_id: int
    at_s: float
    job_id: int
    user: Optional[str]
    kind: str
    config: Optional[str]
    gpus: Optional[int]
    site_factor: Optional[int]
    time_limit_s: Optional[int]
    outcome: str
    error: Optional[str]
    reason: Optional[str]
    predicted_start_s: Optional[float]
    predicted_end_s: Optional[float]


@dataclass(frozen=True)
class DecisionsReport:
    """The latest decisions (newest first) and counts over the whole window."""

    rows: list[DecisionEntry]
    n_total: int
    n_intended: int
    n_applied: int
    n_failed: int
    n_not_attempted: int
    limit: int


@dataclass(frozen=True)
class TickStats:
    """Controller health: ticks recorded, failures, the last tick's time and duration."""

    n_ticks: int
    n_failed: int
    last_tick_s: Optional[float]
    last_duration_s: Optional[float]
    mean_duration_s: Optional[float]
    last_status: Optional[str]


@dataclass(frozen=True)
class JobCount:
    """Jobs in the window, and the span of their submit times (None when none)."""

    n_jobs: int
    first_submit_s: Optional[float]
    last_submit_s: Optional[float]


# ---------------------------------------------------------------- helpers


def _engine(src: Any) -> Engine:
    return src if isinstance(src, Engine) else src.engine


def _rows(src: Any, sql: str, params: dict[str, Any]) -> list[Any]:
    with _engine(src).connect() as conn:
        return list(conn.execute(text(sql), params))


def _group_sql(by: str) -> str:
    try:
        return GROUPS[by]
    except KeyError:
        raise ReportError("unknown grouping %r; one of: %s" % (by, ", ".join(GROUPS))) from None


def _label(by: str, value: Any) -> tuple[str, Optional[float]]:
    """Human group label, and the bucket start for time groups."""
    if by not in ("hour", "day") or value is None:
        return str(value), None
    stamp = datetime.fromtimestamp(float(value), tz=UTC)
    return stamp.strftime("%Y-%m-%d %H:00" if by == "hour" else "%Y-%m-%d"), float(value)


def _sort_key(by: str, row: Any) -> tuple[Any, ...]:
    if by == "size":
        return (SIZE_ORDER.index(row.group) if row.group in SIZE_ORDER else len(SIZE_ORDER), row.group)
    return (row.group,)  # hour and day labels sort chronologically


def has_history_tables(src: Any) -> bool:
    """True when the database has the controller's ``jobs`` and ``ticks`` tables."""
    with _engine(src).connect() as conn:
        names = set(inspect(conn).get_table_names())
    return {"jobs", "ticks", "decisions"} <= names


def parse_time(value: Optional[str], latest_s: Optional[float] = None) -> Optional[float]:
    """Parse a ``--since``/``--until`` value to epoch seconds.

    Accepts epoch seconds (``0``, ``1700000000.5``), ISO dates and times (``2024-06-01``,
    ``2024-06-01T12:00``, ``2024-06-01 12:00:00+02:00``; UTC unless an offset is given),
    and ``-N[smhdw]`` (N units before ``latest_s``, the history's last tick).

    Raises:
        ReportError: the text is none of these.
    """
    if value is None or value == "":
        return None
    text_ = value.strip()
    rel = _RELATIVE.match(text_)
    if rel:
        if latest_s is None:
            raise ReportError("%r is relative to the last tick, and the history has none" % value)
        return latest_s - float(rel.group(1)) * _UNIT_S[rel.group(2)]
    try:
        return float(text_)
    except ValueError:
        pass
    try:
        stamp = datetime.fromisoformat(text_)
    except ValueError:
        raise ReportError("%r is not epoch seconds, an ISO date/time or -N[smhdw]" % value) from None
    if stamp.tzinfo is None:
        stamp = stamp.replace(tzinfo=UTC)
    return stamp.timestamp()


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


# ---------------------------------------------------------------- estimator bias

BIAS_SQL = """
WITH ratios AS (
    SELECT COALESCE(NULLIF(job_class, ''), '(none)') AS job_class,
           run_s / predicted_run_s                  AS ratio
    FROM jobs
    WHERE state IN {finished}
      AND run_s > 0
      AND predicted_run_s > 0
      AND {window}
), ranked AS (
    SELECT job_class, ratio,
           ROW_NUMBER() OVER (PARTITION BY job_class ORDER BY ratio) AS rank_,
           COUNT(*) OVER (PARTITION BY job_class)                    AS n
    FROM ratios
)
SELECT r.job_class                                          AS job_class,
       COUNT(*)                                             AS n_jobs,
       AVG(r.ratio)                                         AS mean_ratio,
       MAX(CASE WHEN r.rank_ = (r.n + 1) / 2 THEN r.ratio END) AS median_ratio,
       MIN(r.ratio)                                         AS min_ratio,
       MAX(r.ratio)                                         AS max_ratio,
       MAX(c.ratio)                                         AS calibrated_ratio,
       MAX(c.n_jobs)                                        AS calibrated_on
FROM ranked AS r
LEFT JOIN calibration AS c ON c.job_class = r.job_class
GROUP BY r.job_class
ORDER BY r.job_class
"""


def bias(src: Any, window: Window = Window()) -> BiasReport:
    """Estimator bias per job class: actual / predicted run time (n, mean, median, range).

    Over completed jobs (COMPLETED, COMPLETED?) with a run time and the controller's last
    prediction, as ``sql/estimator_bias.sql``; each row also carries the calibration
    table's fitted ratio for the class (None when the class has no calibration yet).
    """
    sql = BIAS_SQL.format(window=_WINDOW, finished=FINISHED_SQL)
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
        for r in _rows(src, sql, window.params)
    ]
    calibration = {
        r.job_class: (float(r.ratio), int(r.n_jobs))
        for r in _rows(src, "SELECT job_class, ratio, n_jobs FROM calibration ORDER BY job_class", {})
    }
    return BiasReport(rows, calibration)


# ---------------------------------------------------------------- decisions

_DECISION_WHERE = """
WHERE (:since IS NULL OR d.at >= :since) AND (:until IS NULL OR d.at < :until)
  AND (:job_id IS NULL OR d.job_id = :job_id)
"""

DECISIONS_SQL = """
SELECT d.id, d.tick_id, d.at, d.job_id, j.user, d.kind, d.config, d.gpus, d.site_factor,
       d.time_limit_s,
       CASE WHEN d.applied = 1 THEN 'applied'
            WHEN d.applied = 0 THEN 'FAILED'
            ELSE 'not applied' END AS outcome,
       d.error, d.reason, d.predicted_start_s, d.predicted_end_s
FROM decisions AS d
LEFT JOIN jobs AS j ON j.job_id = d.job_id
{where}
  AND (:all_kinds = 1 OR d.intended = 1)
ORDER BY d.id DESC
LIMIT :limit
"""

DECISION_COUNTS_SQL = """
SELECT COUNT(*)                                                      AS n_total,
       COALESCE(SUM(CASE WHEN d.intended = 1 THEN 1 ELSE 0 END), 0)   AS n_intended,
       COALESCE(SUM(CASE WHEN d.applied = 1 THEN 1 ELSE 0 END), 0)    AS n_applied,
       COALESCE(SUM(CASE WHEN d.applied = 0 THEN 1 ELSE 0 END), 0)    AS n_failed,
       COALESCE(SUM(CASE WHEN d.intended = 1 AND d.applied IS NULL THEN 1 ELSE 0 END), 0)
                                                                     AS n_not_attempted
FROM decisions AS d
{where}
"""


def decisions(
    src: Any,
    window: Window = Window(),
    job_id: Optional[int] = None,
    limit: int = 50,
    all_kinds: bool = False,
) -> DecisionsReport:
    """The decision log: the ``limit`` latest decisions (newest first) and window counts.

    Like ``sql/decisions.sql``, decisions that moved no lever (kind ``none``) are left out
    of the list unless ``all_kinds``; the counts cover every decision in the window.

    Args:
        src: a Store or an Engine.
        window: decisions made (``at``) in this window.
        job_id: only this job's decisions.
        limit: most rows listed.
        all_kinds: also list decisions that changed nothing.
    """
    params = {**window.params, "job_id": job_id, "limit": int(limit), "all_kinds": int(all_kinds)}
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
        for r in _rows(src, DECISIONS_SQL.format(where=_DECISION_WHERE), params)
    ]
    c = _rows(src, DECISION_COUNTS_SQL.format(where=_DECISION_WHERE), params)[0]
    return DecisionsReport(rows, c.n_total, c.n_intended, c.n_applied, c.n_failed, c.n_not_attempted, limit)


# ---------------------------------------------------------------- ticks and counts

TICKS_SQL = """
SELECT COUNT(*) AS n_ticks,
       COALESCE(SUM(CASE WHEN status = 'failed' THEN 1 ELSE 0 END), 0) AS n_failed,
       AVG(duration_s) AS mean_duration_s
FROM ticks
WHERE (:since IS NULL OR started_at >= :since) AND (:until IS NULL OR started_at < :until)
"""

LAST_TICK_SQL = """
SELECT started_at, duration_s, status FROM ticks
WHERE (:since IS NULL OR started_at >= :since) AND (:until IS NULL OR started_at < :until)
ORDER BY started_at DESC, tick_id DESC LIMIT 1
"""


def tick_stats(src: Any, window: Window = Window()) -> TickStats:
    """Ticks in the window (by ``started_at``): count, failures, mean duration, and the
    last tick's time, duration and status."""
    agg = _rows(src, TICKS_SQL, window.params)[0]
    last = _rows(src, LAST_TICK_SQL, window.params)
    if not last:
        return TickStats(agg.n_ticks, agg.n_failed, None, None, agg.mean_duration_s, None)
    return TickStats(
        agg.n_ticks, agg.n_failed, last[0].started_at, last[0].duration_s, agg.mean_duration_s, last[0].status
    )


def job_count(src: Any, window: Window = Window()) -> JobCount:
    """Jobs submitted in the window (and the first and last submit times)."""
    sql = (
        "SELECT COUNT(*) AS n, MIN(submit_time) AS first_s, MAX(submit_time) AS last_s "
        "FROM jobs WHERE " + _WINDOW
    )
    r = _rows(src, sql, window.params)[0]
    return JobCount(r.n, r.first_s, r.last_s)


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
