"""What every admin report shares: the result dataclasses (rows and reports), the report
window and its time parsing (``parse_time``), and the size and grouping vocabulary
(group labels and their order).

Owns the shapes of report results (frozen dataclasses, numbers in seconds); the reads
are ``store.reads``, the reports built from them ``reports.queries`` and
``reports.audit``. Must not import matplotlib, click, SQLAlchemy, any Slurm backend, or
``reports.queries`` / ``reports.audit`` (they build on it).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Optional

from pipeswift_slurm.core.fmt import utc_datetime
from pipeswift_slurm.policy.knobs import PipeSwiftKnobs
from pipeswift_slurm.store.reads import GROUP_SQL


SIZE_ORDER = ("small", "medium", "large", "unknown")
DEFAULT_THRESHOLD = 0.5
# the policy's own bound (its knob default), as in sql/waits.sql
DEFAULT_WAIT_BOUND_S = PipeSwiftKnobs().wait_bound_s
GROUPS = tuple(GROUP_SQL)  # hour, day, user, size, partition, all
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
    n_pending_over_bound: int = 0  # of them, still pending at the last tick


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
class LeverCount:
    """Applied decisions in the window that moved one lever, and the jobs they touched.
    ``lever`` is a name of ``store.rows.LEVERS``, or ``requeue_reshape``: a requeue into
    a new shape (a requeue without one is a preemption)."""

    lever: str
    n_decisions: int
    n_jobs: int


@dataclass(frozen=True)
class RequeuedJob:
    """A job the controller requeued, and how often (applied decisions in the window)."""

    job_id: int
    user: Optional[str]
    requeues: int


@dataclass(frozen=True)
class DecisionsReport:
    """The latest decisions (newest first) and counts over the whole window: by outcome,
    by lever moved (``levers``, applied decisions), and the jobs requeued most."""

    rows: list[DecisionEntry]
    n_total: int
    n_intended: int
    n_applied: int
    n_failed: int
    n_not_attempted: int
    limit: int
    levers: list[LeverCount] = field(default_factory=list)
    most_requeued: list[RequeuedJob] = field(default_factory=list)


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


def check_group(by: str) -> str:
    """``by`` when it is a grouping (see GROUPS).

    Raises:
        ReportError: an unknown grouping.
    """
    if by not in GROUPS:
        raise ReportError("unknown grouping %r; one of: %s" % (by, ", ".join(GROUPS)))
    return by


def group_label(by: str, value: Any) -> tuple[str, Optional[float]]:
    """Human group label, and the bucket start for time groups."""
    if by not in ("hour", "day") or value is None:
        return str(value), None
    stamp = utc_datetime(value)
    return stamp.strftime("%Y-%m-%d %H:00" if by == "hour" else "%Y-%m-%d"), float(value)


def group_sort_key(by: str, row: Any) -> tuple[Any, ...]:
    """Rows by size class in SIZE_ORDER, others by label (hour and day labels sort
    chronologically)."""
    if by == "size":
        return (SIZE_ORDER.index(row.group) if row.group in SIZE_ORDER else len(SIZE_ORDER), row.group)
    return (row.group,)


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
    epoch_s = _parse_time(value, latest_s)
    try:  # a time the reports can show (not nan, inf, or past year 9999)
        utc_datetime(epoch_s)
    except ValueError:
        raise ReportError("%r is not a time between the years 1 and 9999" % value[:40]) from None
    return epoch_s


def _parse_time(value: str, latest_s: Optional[float]) -> float:
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
