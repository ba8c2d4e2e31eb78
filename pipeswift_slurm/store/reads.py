"""The history's reads for the admin reports and ``explain``: the SQL behind ``pipeswift
report`` (queue-time ratio, JCT, waits, estimator bias, the decision log, tick health,
job counts) and the rows ``explain`` looks up, as functions that return plain rows
(named tuples of numbers and text) or dicts. Reports compute and format; this module
only reads.

The SQL is text (aggregation happens in the database, so 100,000 jobs take well under a
second), and the one definition of each figure: the admin files in ``sql/`` at the
repository root are these queries with their parameters written in
(``reports.admin_sql``, ``pipeswift report sql NAME``). Window rule: ``since``/``until``
(epoch seconds, either may be None) select jobs by ``submit_time`` in ``[since, until)``, decisions by ``at`` and ticks by
``started_at``. Percentiles are nearest-rank (the value at rank ceil(p * n)). Time
buckets (hour, day) are UTC, ``CAST(t / 3600 AS INTEGER)`` (SQLite truncation; in
PostgreSQL, whose CAST rounds, ``CAST(FLOOR(t / 3600) AS BIGINT)``).

The same SQL runs on SQLite and PostgreSQL: ``"user"`` is quoted (a PostgreSQL keyword:
bare, it is the session's user), booleans are compared with TRUE/FALSE, parameters are
cast where tested for NULL (PostgreSQL cannot tell the type of a bare ``:since IS NULL``),
and the one dialect difference left (the time buckets) is chosen per database.

Every function takes a ``Store`` or a bare SQLAlchemy ``Engine``. Must not import the
reports, matplotlib, click or any Slurm backend.
"""

from __future__ import annotations

from typing import Any, Optional

from sqlalchemy import Engine, inspect, text

from pipeswift_slurm.core.model import FINISHED_STATES
from pipeswift_slurm.store.queries import VANISHED_STARTED
from pipeswift_slurm.store.rows import LEVERS

FINISHED_SQL = "('COMPLETED', 'COMPLETED?')"
# grouping name -> the SQL expression of a job's group
GROUP_SQL = {
    "hour": "CAST(submit_time / 3600 AS INTEGER) * 3600",
    "day": "CAST(submit_time / 86400 AS INTEGER) * 86400",
    "user": "COALESCE(NULLIF(\"user\", ''), '(none)')",
    "size": "COALESCE(size_class, 'unknown')",
    "partition": "COALESCE(NULLIF(partition, ''), '(none)')",
    "all": "'all'",
}
# PostgreSQL's CAST to an integer rounds; truncate first (times are positive: FLOOR truncates).
POSTGRESQL_GROUP_SQL = {
    "hour": "CAST(FLOOR(submit_time / 3600) AS BIGINT) * 3600",
    "day": "CAST(FLOOR(submit_time / 86400) AS BIGINT) * 86400",
}
# A parameter that may be NULL is cast where it is tested: PostgreSQL cannot tell the type
# of a bare ":since IS NULL" (SQLite ignores the cast).
TIME_IS_NULL = "CAST(:{0} AS DOUBLE PRECISION) IS NULL"
WINDOW_SQL = ("(%s OR submit_time >= :since) AND (%s OR submit_time < :until)"
              % (TIME_IS_NULL.format("since"), TIME_IS_NULL.format("until")))


def _engine(src: Any) -> Engine:
    return src if isinstance(src, Engine) else src.engine


def _group_sql(src: Any, by: str) -> str:
    """The SQL expression of a job's group ``by`` (a key of GROUP_SQL) on this database."""
    if _engine(src).dialect.name == "postgresql":
        return POSTGRESQL_GROUP_SQL.get(by, GROUP_SQL[by])
    return GROUP_SQL[by]


def _rows(src: Any, sql: str, params: dict[str, Any]) -> list[Any]:
    with _engine(src).connect() as conn:
        return list(conn.execute(text(sql), params))


def _window(since: Optional[float], until: Optional[float]) -> dict[str, Optional[float]]:
    return {"since": since, "until": until}


def has_history_tables(src: Any) -> bool:
    """True when the database has the controller's ``jobs``, ``ticks`` and ``decisions`` tables."""
    with _engine(src).connect() as conn:
        names = set(inspect(conn).get_table_names())
    return {"jobs", "ticks", "decisions"} <= names


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


def queue_ratio_rows(src: Any, by: str, since: Optional[float], until: Optional[float],
                     small_only: bool = False) -> list[Any]:
    """Per group ``by`` (a key of GROUP_SQL): grp, n_jobs, queue_s, run_s, queue_ratio,
    mean_job_ratio, over jobs with both queue and run times (only size class small with
    ``small_only``)."""
    sql = QUEUE_RATIO_SQL.format(group=_group_sql(src, by), window=WINDOW_SQL,
                                 extra="AND size_class = 'small'" if small_only else "")
    return _rows(src, sql, _window(since, until))


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


def jct_rows(src: Any, by: str, since: Optional[float], until: Optional[float]) -> list[Any]:
    """Per group: grp, n_jobs, mean_s, p50_s, p95_s, p99_s, max_s, mean_queue_s of the JCT
    (end - submit) of completed jobs."""
    sql = JCT_SQL.format(group=_group_sql(src, by), window=WINDOW_SQL, finished=FINISHED_SQL)
    return _rows(src, sql, _window(since, until))


JCT_VALUES_SQL = """
SELECT {group} AS grp, end_time - submit_time AS jct_s
FROM jobs
WHERE state IN {finished}
  AND start_time IS NOT NULL AND end_time IS NOT NULL AND submit_time IS NOT NULL
  AND {window}
ORDER BY grp, jct_s
"""


def jct_value_rows(src: Any, by: str, since: Optional[float], until: Optional[float]) -> list[Any]:
    """(grp, jct_s) of every completed job, sorted by group then JCT."""
    sql = JCT_VALUES_SQL.format(group=_group_sql(src, by), window=WINDOW_SQL, finished=FINISHED_SQL)
    return _rows(src, sql, _window(since, until))


WAITS_SQL = """
WITH waits AS (
    SELECT job_id,
           {group}                         AS grp,
           CASE WHEN start_time IS NOT NULL THEN queue_s
                WHEN wait_origin_time >= :now THEN 0.0  -- not eligible yet (a begin time ahead)
                ELSE :now - wait_origin_time
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
       SUM(CASE WHEN wait_s > :bound THEN 1 ELSE 0 END)       AS n_over_bound,
       SUM(CASE WHEN still_pending = 1 AND wait_s > :bound THEN 1 ELSE 0 END) AS n_pending_over_bound
FROM ranked
GROUP BY grp
"""


def wait_rows(src: Any, by: str, since: Optional[float], until: Optional[float], now_s: Optional[float],
              bound_s: float) -> list[Any]:
    """Per group: grp, n_jobs, n_pending, mean_s, median_s, max_s, max_job_id,
    n_over_bound, n_pending_over_bound; a PENDING job's wait runs to ``now_s``."""
    sql = WAITS_SQL.format(group=_group_sql(src, by), window=WINDOW_SQL)
    return _rows(src, sql, {**_window(since, until), "now": now_s, "bound": bound_s})


def last_tick_s(src: Any, until: Optional[float] = None) -> Optional[float]:
    """When the last tick (before ``until`` when given) started; None without ticks."""
    sql = "SELECT MAX(started_at) FROM ticks WHERE (%s OR started_at < :until)" % TIME_IS_NULL.format("until")
    value = _rows(src, sql, {"until": until})[0][0]
    return None if value is None else float(value)


def latest_job_time_s(src: Any) -> Optional[float]:
    """The latest submit, start or end time recorded for any job; None without jobs."""
    row = _rows(src, "SELECT MAX(submit_time), MAX(start_time), MAX(end_time) FROM jobs", {})[0]
    values = [float(v) for v in row if v is not None]
    return max(values) if values else None


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


def bias_rows(src: Any, since: Optional[float], until: Optional[float]) -> list[Any]:
    """Per job class: job_class, n_jobs, mean/median/min/max_ratio (actual / predicted run
    time of completed jobs), calibrated_ratio, calibrated_on."""
    return _rows(src, BIAS_SQL.format(window=WINDOW_SQL, finished=FINISHED_SQL), _window(since, until))


def calibration_rows(src: Any) -> list[Any]:
    """(job_class, ratio, n_jobs) of the calibration table, by class."""
    return _rows(src, "SELECT job_class, ratio, n_jobs FROM calibration ORDER BY job_class", {})


DECISION_WHERE = """
WHERE ({since} OR d.at >= :since) AND ({until} OR d.at < :until)
  AND (CAST(:job_id AS BIGINT) IS NULL OR d.job_id = :job_id)
""".format(since=TIME_IS_NULL.format("since"), until=TIME_IS_NULL.format("until"))

DECISIONS_SQL = """
SELECT d.id, d.tick_id, d.at, d.job_id, j."user", d.kind, d.config, d.gpus, d.site_factor,
       d.time_limit_s,
       CASE WHEN d.applied = TRUE THEN 'applied'
            WHEN d.applied = FALSE THEN 'FAILED'
            ELSE 'not applied' END AS outcome,
       d.error, d.reason, d.predicted_start_s, d.predicted_end_s
FROM decisions AS d
LEFT JOIN jobs AS j ON j.job_id = d.job_id
{where}
  AND (:all_kinds = 1 OR d.intended = TRUE)
ORDER BY d.id DESC
LIMIT :limit
"""

DECISION_COUNTS_SQL = """
SELECT COUNT(*)                                                      AS n_total,
       COALESCE(SUM(CASE WHEN d.intended = TRUE THEN 1 ELSE 0 END), 0)   AS n_intended,
       COALESCE(SUM(CASE WHEN d.applied = TRUE THEN 1 ELSE 0 END), 0)    AS n_applied,
       COALESCE(SUM(CASE WHEN d.applied = FALSE THEN 1 ELSE 0 END), 0)   AS n_failed,
       COALESCE(SUM(CASE WHEN d.intended = TRUE AND d.applied IS NULL THEN 1 ELSE 0 END), 0)
                                                                     AS n_not_attempted
FROM decisions AS d
{where}
"""


def decision_rows(src: Any, since: Optional[float], until: Optional[float], job_id: Optional[int], limit: int,
                  all_kinds: bool) -> tuple[list[Any], Any]:
    """(the ``limit`` latest decisions, newest first, with the job's user and an outcome;
    the window's counts: n_total, n_intended, n_applied, n_failed, n_not_attempted)."""
    params = {**_window(since, until), "job_id": job_id, "limit": int(limit), "all_kinds": int(all_kinds)}
    rows = _rows(src, DECISIONS_SQL.format(where=DECISION_WHERE), params)
    return rows, _rows(src, DECISION_COUNTS_SQL.format(where=DECISION_WHERE), params)[0]


def _moved(*levers: str) -> str:
    """SQL: whether decision ``d`` moved all ``levers`` (its kind joins the levers it moved with '+')."""
    return " AND ".join("('+' || d.kind || '+') LIKE '%%+%s+%%'" % lever for lever in levers)


# (name, levers moved together): each lever, and a requeue into a new shape (a requeue without one is a preemption)
LEVER_TALLIES = tuple((lever, (lever,)) for lever in LEVERS) + (("requeue_reshape", ("requeue", "resize")),)
DECISION_LEVERS_SQL = "SELECT %s\nFROM decisions AS d\n{where}\n  AND d.applied = TRUE" % ",\n       ".join(
    "COALESCE(SUM(CASE WHEN {m} THEN 1 ELSE 0 END), 0) AS n_{name}, "
    "COUNT(DISTINCT CASE WHEN {m} THEN d.job_id END) AS jobs_{name}".format(m=_moved(*levers), name=name)
    for name, levers in LEVER_TALLIES)
MOST_REQUEUED_SQL = """
SELECT d.job_id, j."user", COUNT(*) AS requeues
FROM decisions AS d LEFT JOIN jobs AS j ON j.job_id = d.job_id
{where}
  AND d.applied = TRUE AND %s
GROUP BY d.job_id, j."user" ORDER BY requeues DESC, d.job_id LIMIT :limit
""" % _moved("requeue")


def decision_lever_rows(src: Any, since: Optional[float], until: Optional[float], job_id: Optional[int],
                        most: int) -> tuple[Any, list[Any]]:
    """(applied decisions that moved each lever of ``LEVER_TALLIES``, and the distinct jobs:
    n_<name>, jobs_<name>; the ``most`` jobs requeued most often: job_id, user, requeues)."""
    params = {**_window(since, until), "job_id": job_id, "limit": int(most)}
    return (_rows(src, DECISION_LEVERS_SQL.format(where=DECISION_WHERE), params)[0],
            _rows(src, MOST_REQUEUED_SQL.format(where=DECISION_WHERE), params))


TICK_WINDOW = {"since": TIME_IS_NULL.format("since"), "until": TIME_IS_NULL.format("until")}
TICKS_SQL = """
SELECT COUNT(*) AS n_ticks,
       COALESCE(SUM(CASE WHEN status = 'failed' THEN 1 ELSE 0 END), 0) AS n_failed,
       AVG(duration_s) AS mean_duration_s
FROM ticks
WHERE ({since} OR started_at >= :since) AND ({until} OR started_at < :until)
""".format(**TICK_WINDOW)

LAST_TICK_SQL = """
SELECT started_at, duration_s, status FROM ticks
WHERE ({since} OR started_at >= :since) AND ({until} OR started_at < :until)
ORDER BY started_at DESC, tick_id DESC LIMIT 1
""".format(**TICK_WINDOW)


def tick_rows(src: Any, since: Optional[float], until: Optional[float]) -> tuple[Any, Optional[Any]]:
    """(n_ticks, n_failed, mean_duration_s of the window's ticks; the last one's
    started_at, duration_s, status, or None)."""
    params = _window(since, until)
    last = _rows(src, LAST_TICK_SQL, params)
    return _rows(src, TICKS_SQL, params)[0], (last[0] if last else None)


def job_span(src: Any, since: Optional[float], until: Optional[float]) -> Any:
    """(n, first_s, last_s): jobs submitted in the window and the span of their submit times."""
    sql = "SELECT COUNT(*) AS n, MIN(submit_time) AS first_s, MAX(submit_time) AS last_s FROM jobs WHERE " + WINDOW_SQL
    return _rows(src, sql, _window(since, until))[0]


def job_row(src: Any, job_id: int) -> Optional[dict[str, Any]]:
    """Every column of one job's row, or None when the history does not know it."""
    with _engine(src).connect() as conn:
        row = conn.execute(text("SELECT * FROM jobs WHERE job_id = :id"), {"id": job_id}).mappings().first()
    return dict(row) if row is not None else None


def last_snapshot(src: Any) -> Optional[Any]:
    """(n_nodes, total_gpus, free_gpus) of the last tick's cluster snapshot, or None."""
    rows = _rows(src, "SELECT n_nodes, total_gpus, free_gpus FROM tick_snapshots ORDER BY tick_id DESC LIMIT 1", {})
    return rows[0] if rows else None


# Every job that ran, however it ended, is evidence for the per-user correction: a job killed
# at its time limit ran at least that long, and one that failed, was cancelled or ran out of
# memory after running past its claim shows the claim was low all the same (a user who
# claims one iteration and cancels the job just before its limit must not escape the
# correction; ``user_factors`` counts only runs longer than claimed, so no ending dilutes a
# record). The per-class bias reads only completed runs (``store.queries``).
USER_RUNS_SQL = """
SELECT "user", job_class, partition, predicted_run_s, run_s
FROM jobs
WHERE state IN {ran}
  AND "user" IS NOT NULL AND "user" != ''
  AND predicted_run_s > 0 AND run_s IS NOT NULL
  AND calibration_skip IS NULL
ORDER BY end_time, job_id
"""
RAN_STATES_SQL = "(%s)" % ", ".join("'%s'" % state for state in sorted(FINISHED_STATES | {VANISHED_STARTED}))


def finished_user_runs(src: Any) -> list[Any]:
    """Per finished job that ran (any end state: ``USER_RUNS_SQL``; a known config and
    prediction):
    user, job_class, partition, predicted_run_s (the cost model's, uncalibrated), run_s;
    oldest end first. What the per-user correction of claims is fitted from."""
    return _rows(src, USER_RUNS_SQL.format(ran=RAN_STATES_SQL), {})


RAN_JOBS_SQL = """
SELECT j.job_id, j."user", j.name, j.partition, j.submit_time, j.start_time, j.end_time, j.state,
       j.num_nodes, j.gpus, p.raw_text AS profile_text
FROM jobs j LEFT JOIN profiles p ON p.job_id = j.job_id
ORDER BY j.submit_time, j.job_id
"""


def ran_job_rows(src: Any) -> list[Any]:
    """Every job of the history, oldest submission first: job_id, user, name, partition,
    submit_time, start_time, end_time, state, num_nodes, gpus (as last seen: the allocation
    of a job that ran) and profile_text (its profile token, NULL without one). What
    ``pipeswift simulate --history`` replays."""
    return _rows(src, RAN_JOBS_SQL, {})
