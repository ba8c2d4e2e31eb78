"""Admin reports on the controller's own record: estimator bias per job class, the
decision log with outcome counts, tick health and job counts (``pipeswift report``).

Owns that SQL (following ``sql/estimator_bias.sql`` and ``sql/decisions.sql``); every
function takes a ``Store`` or an ``Engine`` and returns the frozen dataclasses of
``report_base``. Must not import matplotlib, click, any Slurm backend or ``reports``
(which builds on this module).
"""

from __future__ import annotations

from typing import Any, Optional

from pipeswift_slurm.reports.base import (_WINDOW, FINISHED_SQL, BiasReport, BiasRow, DecisionEntry, DecisionsReport,
                          JobCount, TickStats, Window, _rows)


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
