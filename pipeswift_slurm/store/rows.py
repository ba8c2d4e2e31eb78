"""The rows a tick writes and the statements that write them, built once at import
(building and hashing a statement costs more than running it): a job's observed and
derived values (queue and run times, earlier runs before a requeue), profile and
decision rows, calibration rows, and the column lists the tick's reads select.

Pure functions of their arguments plus the prepared statements; ``store.tick.TickTx``
runs them inside the tick's transaction and ``store.history.Store`` for its own small
writes. Must not import ``store.history`` or ``store.tick`` (they build on it).
"""

from __future__ import annotations

from operator import attrgetter
from typing import Any, Iterable, Mapping, Optional, Sequence

from sqlalchemy import bindparam, insert, select, update
from sqlalchemy.orm import Session

from pipeswift_slurm.core.model import FINISHED_STATES, PENDING, RUNNING, Decision, Job, JobProfile
from pipeswift_slurm.core.token import first_look_pending
from pipeswift_slurm.store.queries import ACTIVE_STATES, CONFIG_FIELDS, CalibrationEntry, MeasurementEntry
from pipeswift_slurm.store.schema import Base, CalibrationRow, MeasurementRow



TABLES = Base.metadata.tables
JOBS = TABLES["jobs"]
DECISIONS = TABLES["decisions"]
# Fields copied from the observed Job, plus those derived from them.
OBSERVED = ("user", "name", "partition", "submit_time", "eligible_time", "start_time",
             "end_time", "state", "state_reason", "num_nodes", "gpus", "opted_in")
DERIVED = ("queue_s", "run_s", "size_class", "restarts", "ran_s", "attained_gpu_s", "wait_origin_time")
SET_JOB_CLASS = update(JOBS).where(JOBS.c.job_id == bindparam("b_job_id")).values(
    job_class=bindparam("b_job_class"))


def earlier_runs(old: Optional[Mapping[str, Any]], job: Job, now: float) -> tuple[float, float]:
    """(wall seconds, GPU-seconds) of a job's runs before its latest requeue, from its
    stored row and this view of it: what was recorded, plus the run that ended since it was
    last seen running, when it is now pending again (it ran from its start to about now)
    or running from a later start (requeued and restarted between two looks)."""
    if old is None:
        return 0.0, 0.0
    ran_s, gpu_s = float(old.get("ran_s") or 0.0), float(old.get("attained_gpu_s") or 0.0)
    started = old.get("start_time")
    if old.get("state") == RUNNING and started is not None:
        if job.state == PENDING:
            ended: Optional[float] = now
        elif job.state == RUNNING and job.start_time is not None and job.start_time > started:
            ended = job.start_time
        else:
            ended = None
        if ended is not None:
            run_s = max(0.0, ended - started)
            ran_s, gpu_s = ran_s + run_s, gpu_s + run_s * (old.get("gpus") or 0)
    return ran_s, gpu_s


def profile_values(raw_text: str, profile: Optional[JobProfile], parse_error: Optional[str],
                    now: float) -> dict[str, Any]:
    values: dict[str, Any] = {"raw_text": raw_text, "parse_error": parse_error, "updated_at": now,
                              "job_class": None,
                              **dict.fromkeys(("num_layers", "hidden_size", "seq_length", "global_batch_size",
                                               "train_iters", "min_gpus", "max_gpus", "requested_config"))}
    if profile is not None:
        lo, hi = profile.gpu_range
        values.update(job_class=profile.job_class, num_layers=profile.shape.num_layers,
                      hidden_size=profile.shape.hidden_size, seq_length=profile.shape.seq_length,
                      global_batch_size=profile.plan.global_batch_size, train_iters=profile.plan.iterations,
                      min_gpus=lo, max_gpus=hi, requested_config=profile.requested.short())
    return values
GET_OBSERVED = attrgetter(*OBSERVED)


def inserted_id(result: Any) -> int:
    """The primary key of the row a single-row INSERT made."""
    return int(result.inserted_primary_key[0])


def save_calibration(s: Session, rows: Iterable[CalibrationEntry]) -> None:
    values = [{"job_class": r.job_class, "n_jobs": r.n_jobs, "log_ratio": r.log_ratio,
               "ratio": r.ratio, "updated_at": r.updated_at} for r in rows]
    if not values:
        return
    s.execute(TABLES["calibration"].delete()
              .where(CalibrationRow.job_class.in_([v["job_class"] for v in values])))
    s.execute(insert(CalibrationRow), values)


class MeasurementWrites:
    """The Store's write of the launchers' measurements (``Store`` inherits it)."""

    _write_engine: Any

    def save_measurements(self, entries: Sequence[MeasurementEntry]) -> None:
        """Record (or replace: a job's report is rewritten as it runs) what the launchers
        measured, in one transaction."""
        if not entries:
            return
        with Session(self._write_engine) as s, s.begin():
            s.execute(TABLES["measurements"].delete().where(MeasurementRow.job_id.in_([e.job_id for e in entries])))
            s.execute(insert(MeasurementRow), [dict(e.__dict__) for e in entries])


def requeued_fields(old: Optional[Mapping[str, Any]], job: Job, now: float) -> dict[str, Any]:
    """The ``Job`` fields a requeued job's view takes from its stored row, so the policy
    counts it live as the simulator does: its first submit and eligible times (live Slurm
    restarts both at a requeue) and its earlier runs' wall and GPU seconds (``ran_s``,
    ``attained_gpu_s``: squeue forgets them). None of them for a job never stored."""
    if old is None:
        return {}
    ran_s, gpu_s = earlier_runs(old, job, now)
    fields: dict[str, Any] = {"submit_time": job.submit_time, "eligible_time": job.eligible_time,
                              "ran_s": ran_s, "attained_gpu_s": gpu_s}
    keep_first_submission(fields, old)
    return fields


def keep_first_submission(values: dict[str, Any], old: Mapping[str, Any]) -> None:
    """A requeued job's submit and eligible times stay its first ones: live Slurm moves
    them to the requeue, which would drop the job's first wait and runs from its JCT."""
    for key in ("submit_time", "eligible_time"):
        if old[key] is not None and (values[key] is None or old[key] < values[key]):
            values[key] = old[key]


# Waits a job's own user asked for: the time until they end is not queue time.
USERS_OWN_WAITS = frozenset({"JobHeldUser", "Dependency", "DependencyNeverSatisfied"})
ADMINS_HOLD = "JobHeldAdmin"  # an admin's or the controller's hold: queue time


def eligible_since(old: Optional[Mapping[str, Any]], job: Job, now: float) -> Optional[float]:
    """A job's eligible time as the history and the policy count it: Slurm's, less what
    Slurm's own bookkeeping drops. Slurm shows no eligible time while a job is held and
    restarts it at the release, or at the controller's StartTime=now that ends psbatch's
    first look; a wait the controller or an admin imposed is still queue time. So a first
    look still pending counts from the submission, and the stored time (``old``) moves
    only earlier, except where the job now waits on a begin time (a user's or a requeue's)
    or waited on its user's own hold or a dependency until this view (``USERS_OWN_WAITS``).
    A job first seen held by an admin (no eligible time stored) counts from its submission,
    as its wait did while held. A requeued job's first times are ``keep_first_submission``'s."""
    if first_look_pending(job, now) and job.state_reason in ("BeginTime", ""):
        return job.submit_time
    new = job.eligible_time
    if old is None or job.state_reason == "BeginTime" or old["state_reason"] in USERS_OWN_WAITS:
        return new
    earlier = old["eligible_time"]
    if earlier is None and old["state_reason"] == ADMINS_HOLD:  # first seen held: since its submission
        earlier = old["submit_time"]
    return new if earlier is None or (new is not None and new <= earlier) else float(earlier)


def history_fields(old: Optional[Mapping[str, Any]], job: Job, now: float) -> dict[str, Any]:
    """The ``Job`` fields the policy's view takes from the job's stored row, where live
    Slurm forgets them: a requeued job's (``requeued_fields``) or an eligible time Slurm
    restarted (``eligible_since``). Empty where the view already has them."""
    if job.restarts:
        return requeued_fields(old, job, now)
    eligible = eligible_since(old, job, now)
    return {} if eligible == job.eligible_time else {"eligible_time": eligible}


def wait_origin(values: Mapping[str, Any]) -> Optional[float]:
    """When a jobs row's wait counts from, so that it has waited (t - origin) by any time t:
    its eligible (or submit) time, later by its runs before its latest requeue (``ran_s``).
    None when it has neither time. Stored as ``wait_origin_time`` for the SQL reads."""
    eligible = values["eligible_time"]
    begin = eligible if eligible is not None else values["submit_time"]
    return None if begin is None else begin + float(values.get("ran_s") or 0.0)


def waited_s(values: Mapping[str, Any], until: float) -> Optional[float]:
    """A jobs row's time not running from its ``wait_origin`` to ``until`` (None: unknown)."""
    origin = wait_origin(values)
    return None if origin is None else max(0.0, until - origin)


def queue_run_s(values: Mapping[str, Any]) -> tuple[Optional[float], Optional[float]]:
    """(``waited_s`` to its latest start, end - start) from a jobs row: the time not running
    before its latest start, and that run; None where unknown."""
    queue_s = run_s = None
    start, end = values["start_time"], values["end_time"]
    if start is not None:
        queue_s = waited_s(values, start)
        if end is not None:
            run_s = max(0.0, end - start)
    return queue_s, run_s


def transition_at(job: Job, from_state: Optional[str], now: float) -> float:
    """When the new state began: the job's own time for it where Slurm gives one."""
    if job.state == PENDING and from_state is None:
        return job.submit_time
    if job.state == RUNNING and job.start_time is not None:
        return job.start_time
    if job.state in FINISHED_STATES and job.end_time is not None:
        return job.end_time
    return now


# The levers a decision can move, in the order its ``kind`` names them ("resize+hold").
LEVERS = ("resize", "site_factor", "time_limit", "requeue", "hold", "release", "move")


def decision_kind(d: Decision) -> str:
    moved = (d.config is not None, d.site_factor is not None, d.time_limit_s is not None, d.requeue,
             d.hold is True, d.hold is False, d.partition is not None)
    return "+".join(name for name, on in zip(LEVERS, moved, strict=True) if on) or "none"


def decision_values(d: Decision, tick_id: int, at: float, applied: Optional[bool],
                     error: Optional[str], awaiting_outcome: bool = False) -> dict[str, Any]:
    c = d.config
    values: dict[str, Any] = {name: getattr(c, name) if c else None for name in CONFIG_FIELDS}
    values.update(
        tick_id=tick_id, job_id=d.job_id, at=at, kind=decision_kind(d),
        config=c.short() if c else None, gpus=c.gpus if c else None,
        site_factor=d.site_factor, time_limit_s=d.time_limit_s, requeue=d.requeue,
        reason=d.reason, predicted_start_s=d.predicted_start_s,
        predicted_end_s=d.predicted_end_s, intended=d.changes_anything,
        applied=False if (error and applied is None) else applied, error=error,
        hold=d.hold, partition=d.partition, awaiting_outcome=awaiting_outcome)
    return values


def update_jobs_by_id(keys: Sequence[str]) -> Any:
    """UPDATE jobs SET key = :b_key ... WHERE job_id = :b_job_id (for executemany)."""
    return (update(JOBS).where(JOBS.c.job_id == bindparam("b_job_id"))
            .values({k: bindparam("b_" + k) for k in keys}))


def prefixed(row: Mapping[str, Any]) -> dict[str, Any]:
    return {"b_" + k: v for k, v in row.items()}


# Statements built once: building and hashing a statement costs more than running it.
TICKS = TABLES["ticks"]
TRANSITIONS = TABLES["state_transitions"]
TICK_COUNTS = ("n_pending", "n_running", "n_decisions", "n_applied", "n_errors")
RUN_COLS = ("predicted_run_s", "run_config", "calibration_skip")
JOB_COLS = (JOBS.c.job_id, *(JOBS.c[k] for k in OBSERVED + DERIVED + RUN_COLS))
SELECT_ACTIVE = select(*JOB_COLS).where(JOBS.c.state.in_(ACTIVE_STATES))
SELECT_IDS = select(*JOB_COLS).where(JOBS.c.job_id.in_(bindparam("ids", expanding=True)))
TOUCH_JOBS = (update(JOBS).where(JOBS.c.job_id.in_(bindparam("ids", expanding=True)))
               .values(last_seen_tick=bindparam("seen_tick")))
UPDATE_OBSERVED = update_jobs_by_id(OBSERVED + DERIVED)
UPDATE_VANISHED = update_jobs_by_id(("state", "end_time", "run_s", "size_class"))
UPDATE_PREDICTED = update_jobs_by_id(RUN_COLS + ("size_class",))
INSERT_JOBS = insert(JOBS)
INSERT_TRANSITIONS = insert(TRANSITIONS)
INSERT_DECISIONS = insert(DECISIONS)
INSERT_SNAPSHOT = insert(TABLES["tick_snapshots"])
INSERT_TICK = insert(TICKS)
SETTLE_DECISIONS = (update(DECISIONS).where(DECISIONS.c.id == bindparam("b_id"))
                    .values(applied=bindparam("b_applied"), error=bindparam("b_error"),
                            awaiting_outcome=bindparam("b_awaiting")))
FINISH_TICK = (update(TICKS).where(TICKS.c.tick_id == bindparam("b_tick_id"))
                .values({k: bindparam("b_" + k) for k in
                         ("finished_at", "duration_s", "status", "error") + TICK_COUNTS}))


