"""The read side of the Store: the queries (session -> domain types), the result
dataclasses they return, and the job-state vocabulary the history is kept in.

Owns: ``Queries``, the read methods shared by ``Store`` (its own read transaction) and
``TickTx`` (the tick's, so they see its uncommitted writes); the frozen results
(``FinishedJob``, ``CalibrationEntry``, ``RecordedDecision``, ``SnapshotSummary``);
``ACTIVE_STATES``, ``CONFIG_FIELDS`` and the vanished-job states. ORM rows never leave it.
It writes nothing. Must not import ``store`` or ``store_tick`` (they build on it), any
Slurm backend or the policy.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Iterator, Optional, Sequence, TypeVar

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from pipeswift_slurm.core.model import PENDING, RUNNING, Decision, ExecConfig
from pipeswift_slurm.store.schema import CalibrationRow, DecisionRow, JobRow, MeasurementRow, ProfileRow, TickRow


T = TypeVar("T")


# Slurm states in which a job is still in the system (it may vanish from a later view).
ACTIVE_STATES = (PENDING, RUNNING, "SUSPENDED", "COMPLETING", "CONFIGURING", "REQUEUED",
                 "REQUEUE_HOLD", "REQUEUE_FED", "RESIZING", "SIGNALING", "STAGE_OUT",
                 "STOPPED", "RESV_DEL_HOLD")
VANISHED_STARTED = "COMPLETED?"
VANISHED_UNSTARTED = "CANCELLED?"
CALIBRATION_STATES = ("COMPLETED", VANISHED_STARTED)

# Every ExecConfig field, each stored in its own decisions column (test_store checks this
# list against the dataclass, so a new field cannot be dropped silently).
CONFIG_FIELDS = ("tp", "pp", "dp", "cp", "vp", "micro_batch_size", "num_micro_batches",
                 "num_nodes", "gpus_per_node", "decoder_first_pipeline_num_layers",
                 "decoder_last_pipeline_num_layers")


_IN_CHUNK = 500  # ids per IN (...) list: far below SQLite's bound-parameter limit


@dataclass(frozen=True)
class FinishedJob:
    """A finished job with an actual and a predicted run time (seconds)."""

    job_id: int
    job_class: str
    predicted_run_s: float
    run_s: float
    end_time: float
    state: str
    partition: Optional[str] = None
    calibration_skip: Optional[str] = None
    user: str = ""  # whose run: one user's runs weigh at most ``layout_fit.USER_CAP_RUNS`` in a fit


@dataclass(frozen=True)
class RunRecord:
    """What the history keeps of a running job's run: the config it runs with
    (``ExecConfig.short()``, None when the controller cannot know it), the cost model's
    uncalibrated run time for that config (None with it), and why the job must not feed
    calibration (None: it may)."""

    predicted_run_s: Optional[float]
    config: Optional[str] = None
    calibration_skip: Optional[str] = None


@dataclass(frozen=True)
class MeasurementEntry:
    """One row of ``measurements`` (``schema.MeasurementRow``): what the launcher measured
    of a job's layout, and whether the controller learns from it (``status`` 'ok')."""

    job_id: int
    user: Optional[str]
    job_class: Optional[str]
    config: Optional[str]
    tp: Optional[int]
    pp: Optional[int]
    micro_batch_size: Optional[int]
    vp: Optional[int]
    iter_s: Optional[float]
    predicted_iter_s: Optional[float]
    iterations: Optional[int]
    status: str
    reported_at: float
    own_layout: Optional[int] = None  # 1: the layout was the user's own, 0: pipeswift's choice


@dataclass(frozen=True)
class CalibrationEntry:
    """Estimator bias of one job class: mean log(actual/predicted) over ``n_jobs``."""

    job_class: str
    n_jobs: int
    log_ratio: float
    updated_at: float

    @property
    def ratio(self) -> float:
        return math.exp(self.log_ratio)


@dataclass(frozen=True)
class RecordedDecision:
    """A decision as recorded: the tick, its time, and whether it was applied."""

    tick_id: int
    at: float
    decision: Decision
    intended: bool
    applied: Optional[bool]
    error: Optional[str]


@dataclass(frozen=True)
class SnapshotSummary:
    """What ``save_snapshot`` changed: new jobs, state transitions, vanished job ids."""

    n_new: int
    n_transitions: int
    vanished: tuple[int, ...]


def chunks(ids: Sequence[int]) -> Iterator[Sequence[int]]:
    for i in range(0, len(ids), _IN_CHUNK):
        yield ids[i:i + _IN_CHUNK]


# ---------------------------------------------------------------- queries (session -> domain)

def _known_jobs(s: Session, active_only: bool) -> dict[int, str]:
    query = select(JobRow.job_id, JobRow.state)
    if active_only:
        query = query.where(JobRow.state.in_(ACTIVE_STATES))
    return {job_id: state for job_id, state in s.execute(query)}


def _profile_texts(s: Session, job_ids: Iterable[int]) -> dict[int, str]:
    out: dict[int, str] = {}
    for chunk in chunks(sorted(set(job_ids))):
        rows = s.execute(select(ProfileRow.job_id, ProfileRow.raw_text)
                         .where(ProfileRow.job_id.in_(chunk)))
        out.update({job_id: text for job_id, text in rows})
    return out


def decision_of(row: DecisionRow) -> Decision:
    """The Decision a decisions row holds."""
    config = None
    if row.tp is not None:
        values = {name: getattr(row, name) for name in CONFIG_FIELDS}
        config = ExecConfig(**values)
    return Decision(job_id=row.job_id, config=config, site_factor=row.site_factor,
                    time_limit_s=row.time_limit_s, requeue=bool(row.requeue),
                    hold=None if row.hold is None else bool(row.hold), reason=row.reason or "", predicted_start_s=row.predicted_start_s,
                    predicted_end_s=row.predicted_end_s, partition=row.partition)


def _last_applied_for(s: Session, job_ids: Iterable[int]) -> dict[int, Decision]:
    out: dict[int, Decision] = {}
    for chunk in chunks(sorted(set(job_ids))):
        latest = (select(func.max(DecisionRow.id))
                  .where(DecisionRow.job_id.in_(chunk), DecisionRow.applied.is_(True))
                  .group_by(DecisionRow.job_id))
        for row in s.scalars(select(DecisionRow).where(DecisionRow.id.in_(latest))):
            out[row.job_id] = decision_of(row)
    return out


def _decisions_for(s: Session, job_id: int) -> list[RecordedDecision]:
    rows = s.scalars(select(DecisionRow).where(DecisionRow.job_id == job_id)
                     .order_by(DecisionRow.id))
    return [RecordedDecision(r.tick_id, r.at, decision_of(r), bool(r.intended),
                             None if r.applied is None else bool(r.applied), r.error)
            for r in rows]


def _finished_jobs(s: Session, job_class: Optional[str], since: Optional[float],
                   include_vanished: bool) -> list[FinishedJob]:
    states = CALIBRATION_STATES if include_vanished else CALIBRATION_STATES[:1]
    query = (select(JobRow.job_id, JobRow.job_class, JobRow.predicted_run_s, JobRow.run_s,
                    JobRow.end_time, JobRow.state, JobRow.partition, JobRow.calibration_skip, JobRow.user)
             .where(JobRow.state.in_(states), JobRow.run_s.is_not(None),
                    JobRow.predicted_run_s.is_not(None), JobRow.end_time.is_not(None))
             .order_by(JobRow.end_time, JobRow.job_id))
    if job_class is not None:
        query = query.where(JobRow.job_class == job_class)
    if since is not None:
        query = query.where(JobRow.end_time >= since)
    # SQLite keeps text in a REAL column (a history edited by hand): such a row is no run to learn from
    return [FinishedJob(r.job_id, r.job_class or "", r.predicted_run_s, r.run_s, r.end_time,
                        r.state, r.partition, r.calibration_skip, r.user or "") for r in s.execute(query)
            if all(isinstance(v, (int, float)) for v in (r.predicted_run_s, r.run_s, r.end_time))]


def _calibration(s: Session) -> dict[str, tuple[float, int]]:
    rows = s.execute(select(CalibrationRow.job_class, CalibrationRow.ratio, CalibrationRow.n_jobs))
    return {job_class: (ratio, n_jobs) for job_class, ratio, n_jobs in rows}


def _measurements(s: Session, job_ids: Optional[list[int]]) -> list[MeasurementEntry]:
    cols = [getattr(MeasurementRow, f) for f in MeasurementEntry.__dataclass_fields__]
    query = select(*cols).order_by(MeasurementRow.job_id)
    if job_ids is not None:
        query = query.where(MeasurementRow.job_id.in_(job_ids))
    return [MeasurementEntry(*r) for r in s.execute(query)]


class Queries:
    """Read methods shared by Store (own read transaction) and TickTx (the tick's)."""

    def _read(self, fn: Callable[..., T], *args: Any) -> T:
        raise NotImplementedError

    def known_jobs(self, active_only: bool = False) -> dict[int, str]:
        """Map from job_id to the job's last recorded state (only active states if asked)."""
        return self._read(_known_jobs, active_only)

    def profile_texts(self, job_ids: Iterable[int]) -> dict[int, str]:
        """Map from job_id to the raw profile text recorded for it (jobs with a profile)."""
        return self._read(_profile_texts, list(job_ids))

    def last_applied(self, job_id: int) -> Optional[Decision]:
        """The last decision applied to ``job_id`` (for idempotency), or None."""
        return self._read(_last_applied_for, [job_id]).get(job_id)

    def last_applied_for(self, job_ids: Iterable[int]) -> dict[int, Decision]:
        """Map from job_id to its last applied decision, in one query (jobs that have one)."""
        return self._read(_last_applied_for, list(job_ids))

    def decisions_for(self, job_id: int) -> list[RecordedDecision]:
        """Every decision recorded for ``job_id``, oldest first."""
        return self._read(_decisions_for, job_id)

    def finished_jobs(self, job_class: Optional[str] = None, since: Optional[float] = None,
                      include_vanished: bool = True) -> list[FinishedJob]:
        """Completed jobs with both a run time and a prediction, by end time (calibration).

        Args:
            job_class: only this class (None: all).
            since: only jobs that ended at or after this time (epoch s).
            include_vanished: also jobs whose end was estimated (state ``COMPLETED?``).
        """
        return self._read(_finished_jobs, job_class, since, include_vanished)

    def measurements(self, job_ids: Optional[Iterable[int]] = None) -> list[MeasurementEntry]:
        """The measurements the launchers reported and the controller recorded (of
        ``job_ids`` only, when given), by job."""
        return self._read(_measurements, None if job_ids is None else list(job_ids))

    def calibration(self) -> dict[str, tuple[float, int]]:
        """Map from job_class to (ratio actual/predicted, number of jobs behind it)."""
        return self._read(_calibration)

    def tick_count(self) -> int:
        """Number of ticks recorded (failed ones recorded by record_failed_tick included)."""
        return self._read(lambda s: s.scalar(select(func.count()).select_from(TickRow)) or 0)
