"""The admin's SQL files: ``sql/<name>.sql`` at the repository root, and ``pipeswift report
sql NAME`` where only the package is installed. Each one is the reports' own query
(``store.reads``) with the window open, the group the file names, and its parameters
written in (now = the last tick, the wait bound = the policy's default), wrapped in a
SELECT that rounds and names the columns for reading. So every figure is defined once,
in ``store.reads``; ``tests/unit/test_sql_queries.py`` checks that the files in ``sql/``
are this module's output and runs them under ``sqlite3`` and ``psql``.

They run on SQLite and PostgreSQL alike: the hour label is SQLite's ``strftime()``, which
the store gives a PostgreSQL history too (``store.schema.POSTGRESQL_DATE_FUNCTIONS``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Callable

from pipeswift_slurm.reports.base import DEFAULT_WAIT_BOUND_S
from pipeswift_slurm.store import reads, schema_sql

HOUR_LABEL = "strftime('%Y-%m-%d %H:00', submit_time, 'unixepoch')"
SIZE_ORDER = "CASE size_class WHEN 'small' THEN 0 WHEN 'medium' THEN 1 WHEN 'large' THEN 2 ELSE 3 END"
NOW = "(SELECT MAX(started_at) FROM ticks)"  # what the reports take for a pending job's "now"
WAIT_BOUND_H = DEFAULT_WAIT_BOUND_S / 3600.0
RUN = ("-- Run: sqlite3 -header -column /var/lib/pipeswift/pipeswift.sqlite < sql/{name}.sql\n"
       "--      psql -X -d pipeswift -f sql/{name}.sql\n"
       "-- Written by `pipeswift report sql {name}` from the reports' own query\n"
       "-- (pipeswift_slurm/store/reads.py): the same figures as `pipeswift report`.\n")


def hours(column: str, digits: int = 3) -> str:
    """SQL: ``column`` (seconds) in hours, rounded (CAST: PostgreSQL rounds NUMERIC only)."""
    return "ROUND(CAST(%s / 3600.0 AS NUMERIC), %d)" % (column, digits)


def rounded(column: str, digits: int = 4) -> str:
    return "ROUND(CAST(%s AS NUMERIC), %d)" % (column, digits)


def with_values(sql: str, values: dict[str, str]) -> str:
    """``sql`` with each ``:name`` parameter replaced by its SQL text, and the window test
    (written in as TRUE) dropped."""
    def one(match: re.Match[str]) -> str:
        return values[match.group(1)]

    sql = re.sub(r"(?<![:\w]):([a-z_]\w*)", one, sql)
    sql = re.sub(r"\n\s*AND TRUE\b", "", sql)
    return "\n".join(line for line in sql.strip("\n").splitlines() if line.strip())


def _wrap(report_sql: str, columns: list[str], order: str) -> str:
    """The report's query as a CTE, and the SELECT over it: ``columns``, ordered by ``order``."""
    inner = "\n".join("    " + line for line in report_sql.splitlines())
    return "WITH report AS (\n%s\n)\nSELECT %s\nFROM report\nORDER BY %s;\n" % (
        inner, ",\n       ".join(columns), order)


def _queue_ratio() -> str:
    sql = with_values(reads.QUEUE_RATIO_SQL.format(group=HOUR_LABEL, window="TRUE", extra=""), {})
    return _wrap(sql, ["grp AS hour_utc", "n_jobs", hours("queue_s") + " AS queue_h", hours("run_s") + " AS run_h",
                       rounded("queue_ratio") + " AS queue_ratio", rounded("mean_job_ratio") + " AS mean_job_ratio"],
                 "hour_utc")


def _jct() -> str:
    sql = with_values(reads.JCT_SQL.format(group=reads.GROUP_SQL["size"], window="TRUE",
                                           finished=reads.FINISHED_SQL), {})
    return _wrap(sql, ["grp AS size_class", "n_jobs"]
                 + ["%s AS %s_jct_h" % (hours(c + "_s"), c) for c in ("mean", "p50", "p95", "p99", "max")]
                 + [hours("mean_queue_s") + " AS mean_queue_h"], SIZE_ORDER.replace("size_class", "grp"))


def _waits() -> str:
    sql = with_values(reads.WAITS_SQL.format(group=reads.GROUP_SQL["size"], window="TRUE"),
                      {"now": NOW, "bound": "%g" % DEFAULT_WAIT_BOUND_S})
    return _wrap(sql, ["grp AS size_class", "n_jobs", "n_pending", hours("mean_s") + " AS mean_wait_h",
                       hours("median_s") + " AS median_wait_h", hours("max_s") + " AS max_wait_h",
                       "max_job_id AS max_wait_job_id", "n_over_bound AS n_over_%gh" % WAIT_BOUND_H,
                       "n_pending_over_bound AS n_pending_over_%gh" % WAIT_BOUND_H], "max_wait_h DESC, size_class")


def _bias() -> str:
    sql = with_values(reads.BIAS_SQL.format(window="TRUE", finished=reads.FINISHED_SQL), {})
    return _wrap(sql, ["job_class", "n_jobs"]
                 + ["%s AS %s" % (rounded(c), c) for c in ("mean_ratio", "median_ratio", "min_ratio", "max_ratio",
                                                           "calibrated_ratio")]
                 + ["calibrated_on"], "job_class")


def _decisions() -> str:
    sql = with_values(reads.DECISIONS_SQL.format(where="WHERE TRUE"), {"all_kinds": "0", "limit": "50"})
    return _wrap(sql.replace("WHERE TRUE\n  AND ", "WHERE "),
                 ["id", "tick_id", "datetime(at, 'unixepoch') AS at_utc", "job_id", '"user"', "kind", "config",
                  "gpus", "site_factor", "time_limit_s", "outcome", "error", "reason"], "id DESC")


@dataclass(frozen=True)
class AdminQuery:
    """One admin file: what it answers (its header) and its SQL."""

    header: str
    body: Callable[[], str]


QUERIES = {
    "queue_ratio_by_hour": AdminQuery("""\
Queue-time ratio per hour: is the bottleneck the queue or the pipeline?

For jobs submitted in each hour (UTC) that have started and ended:
  queue_ratio    = total queue time / total (queue + run) time of those jobs
  mean_job_ratio = average over jobs of queue_s / (queue_s + run_s)
queue_s counts from eligibility (or submission) to start, run_s from start to end, so
queue_s + run_s is the job completion time (JCT) as the scheduler can influence it (a
requeued job: its time not running, and its latest run; its earlier runs are ran_s).
A ratio near 1 means jobs mostly wait; near 0, they mostly run.""", _queue_ratio),
    "jct_by_size_class": AdminQuery("""\
Job completion time (JCT) by job size class: mean, P50, P95, P99 and max, in hours.

JCT = end_time - submit_time (what the user waits for), over jobs that completed (state
COMPLETED, or COMPLETED? when the job vanished from the queue and its end was taken as the
first tick it was gone). Size classes are by GPU-hours: small < 4, medium < 32, large >= 32
(pipeswift_slurm.store.schema.size_class). Percentiles are nearest-rank: the value at rank
ceil(p * n) in ascending order.""", _jct),
    "waits": AdminQuery("""\
Waits and starvation by job size class, still-pending jobs included, in hours.

A started job's wait is its queue_s (start - eligible-or-submit, less the runs before a
requeue: ran_s). A job still PENDING has waited (now - eligible-or-submit - ran_s) so far,
where "now" is the last controller tick (so the query also works on a simulated history).
max_wait_job_id names the job with the longest wait in its class (the lowest id on ties);
n_over_%(h)gh counts waits above %(h)g h (%(s)g s, the pipeswift policy's default wait_bound_s:
`pipeswift report waits --wait-bound-h H` counts over a site's own). Size class 'unknown':
no run time known yet.""" % {"h": WAIT_BOUND_H, "s": DEFAULT_WAIT_BOUND_S}, _waits),
    "estimator_bias": AdminQuery("""\
Estimator bias per job class: actual run time / predicted run time.

Over completed jobs (COMPLETED, or COMPLETED? with an estimated end) that have both a run
time and the controller's last prediction for the config they ran with. A ratio above 1
means jobs ran longer than predicted. A class whose median is far from 1 gets false
priorities until calibration corrects it; calibrated_ratio is what the controller currently
applies (calibration table), calibrated_on its number of jobs. The median is nearest-rank
(the lower middle value for an even count).""", _bias),
    "decisions": AdminQuery("""\
The 50 latest decisions that moved a lever (resize, SiteFactor, time limit, requeue, hold),
newest first, with what became of them:
  applied     the backend applied it
  FAILED      the backend refused it (see error)
  not applied not attempted: dry run, or the same as the decision already applied
Decisions that changed nothing (kind 'none') are left out: change "0 = 1" to "1 = 1" to
see them.""", _decisions),
}


NAMES = (*QUERIES, "schema")  # every file in sql/: the queries, and the tables (store.schema_sql)


def render(name: str) -> str:
    """The text of admin file ``name`` (one of NAMES)."""
    if name == "schema":
        return schema_sql.render()
    query = QUERIES[name]
    header = "".join("-- %s\n" % line if line else "--\n" for line in query.header.splitlines())
    return header + "--\n" + RUN.format(name=name) + query.body()
