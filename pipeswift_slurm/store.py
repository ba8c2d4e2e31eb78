"""The controller's history: jobs, profiles, state changes, ticks, decisions, calibration.

``Store`` owns every read and write of the database and speaks only domain types
(``model.py``) and the small frozen dataclasses below; ORM rows never leave this module.
One tick is one transaction (``with store.tick(now, policy, dry_run) as tx:``): if its body
raises, nothing of it remains, the tick row included. Writes are bulk (one statement per
table per tick) so the simulator can record ~100k ticks.

SQLite (the default) is tuned on every connection: ``foreign_keys=ON``, ``busy_timeout``,
and for files ``journal_mode=WAL`` (readers never block the writer) with
``synchronous=NORMAL``. A tick starts with ``BEGIN IMMEDIATE`` so two writers (an
overlapping cron tick, a manual ``pipeswift controller tick``) queue on the write lock
for up to ``busy_timeout_s`` and then fail with ``StoreBusy``, instead of deadlocking on a
read-to-write upgrade. Other SQLAlchemy URLs (PostgreSQL) work with their own defaults.

Vanished jobs: a job the DB believes active (PENDING, RUNNING, ...) but absent from the
snapshot is reported by ``save_snapshot``; the caller may look it up (sacct) and save it,
or call ``mark_vanished``, which records ``end_time = now`` (an upper bound, one tick
late at most) and state ``COMPLETED?`` if it had started, else ``CANCELLED?``. A later
observation of the real final state overrides these guesses.

This module must not be imported by the policy; it imports nothing from Slurm backends.
"""

from __future__ import annotations

import logging
import math
import time
from contextlib import contextmanager
from dataclasses import dataclass
from operator import attrgetter
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Mapping, Optional, Sequence, TypeVar

from sqlalchemy import Engine, bindparam, create_engine, event, func, insert, inspect, select, update
from sqlalchemy.engine import make_url
from sqlalchemy.exc import OperationalError
from sqlalchemy.orm import Session
from sqlalchemy.pool import StaticPool

from .model import FINISHED_STATES, PENDING, RUNNING, ClusterView, Decision, ExecConfig, Job, JobProfile
from .schema import Base, CalibrationRow, DecisionRow, JobRow, ProfileRow, TickRow, size_class

log = logging.getLogger(__name__)

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

_TABLES = Base.metadata.tables
_JOBS = _TABLES["jobs"]
_DECISIONS = _TABLES["decisions"]
# Fields copied from the observed Job, plus those derived from them.
_OBSERVED = ("user", "name", "partition", "submit_time", "eligible_time", "start_time",
             "end_time", "state", "state_reason", "num_nodes", "gpus", "opted_in")
_DERIVED = ("queue_s", "run_s", "size_class", "restarts")
_GET_OBSERVED = attrgetter(*_OBSERVED)
_IN_CHUNK = 500  # ids per IN (...) list: far below SQLite's bound-parameter limit


class StoreBusy(RuntimeError):
    """Another writer held the database longer than ``busy_timeout_s``."""


@dataclass(frozen=True)
class FinishedJob:
    """A finished job with an actual and a predicted run time (seconds)."""

    job_id: int
    job_class: str
    predicted_run_s: float
    run_s: float
    end_time: float
    state: str


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


def same_action(a: Optional[Decision], b: Optional[Decision]) -> bool:
    """True when two decisions move the same levers to the same values.

    Reason and predicted times are ignored: they change every tick, the action does not.
    """
    if a is None or b is None:
        return a is b
    return (a.job_id, a.config, a.site_factor, a.time_limit_s, a.requeue) == (
        b.job_id, b.config, b.site_factor, b.time_limit_s, b.requeue)


def make_engine(url: str, busy_timeout_s: float = 30.0) -> Engine:
    """Create an engine; a bare file path means SQLite. SQLite connections get tuned.

    Args:
        url: SQLAlchemy URL (``sqlite:////var/lib/pipeswift/pipeswift.sqlite``,
            ``postgresql://...``) or a plain file path. A SQLite file's folder is created
            if missing.
        busy_timeout_s: how long a SQLite writer waits for another one's lock.
    """
    if "://" not in url:
        url = "sqlite:///" + url
    parsed = make_url(url)
    if parsed.get_backend_name() != "sqlite":
        return create_engine(url)
    database = parsed.database or ""
    in_memory = database in ("", ":memory:")
    kwargs: dict[str, Any] = {}
    if in_memory:
        kwargs = {"poolclass": StaticPool, "connect_args": {"check_same_thread": False}}
    elif not database.startswith("file:"):
        Path(database).expanduser().parent.mkdir(parents=True, exist_ok=True)
    engine = create_engine(url, **kwargs)
    _tune_sqlite(engine, busy_timeout_s, wal=not in_memory)
    return engine


def _tune_sqlite(engine: Engine, busy_timeout_s: float, wal: bool) -> None:
    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_conn: Any, _record: Any) -> None:
        dbapi_conn.isolation_level = None  # the driver's implicit BEGIN is replaced below
        cursor = dbapi_conn.cursor()
        cursor.execute("PRAGMA foreign_keys=ON")
        cursor.execute("PRAGMA busy_timeout=%d" % int(busy_timeout_s * 1000))
        if wal:
            cursor.execute("PRAGMA journal_mode=WAL")
            cursor.execute("PRAGMA synchronous=NORMAL")
        cursor.close()

    @event.listens_for(engine, "begin")
    def _on_begin(conn: Any) -> None:
        mode = conn.get_execution_options().get("sqlite_begin", "DEFERRED")
        conn.exec_driver_sql("BEGIN " + mode)


def _chunks(ids: Sequence[int]) -> Iterator[Sequence[int]]:
    for i in range(0, len(ids), _IN_CHUNK):
        yield ids[i:i + _IN_CHUNK]


def _inserted_id(result: Any) -> int:
    """The primary key of the row a single-row INSERT made."""
    return int(result.inserted_primary_key[0])


def _is_locked(exc: OperationalError) -> bool:
    return "locked" in str(exc.orig).lower() or "busy" in str(exc.orig).lower()


# ---------------------------------------------------------------- queries (session -> domain)

def _known_jobs(s: Session, active_only: bool) -> dict[int, str]:
    query = select(JobRow.job_id, JobRow.state)
    if active_only:
        query = query.where(JobRow.state.in_(ACTIVE_STATES))
    return {job_id: state for job_id, state in s.execute(query)}


def _profile_texts(s: Session, job_ids: Iterable[int]) -> dict[int, str]:
    out: dict[int, str] = {}
    for chunk in _chunks(sorted(set(job_ids))):
        rows = s.execute(select(ProfileRow.job_id, ProfileRow.raw_text)
                         .where(ProfileRow.job_id.in_(chunk)))
        out.update({job_id: text for job_id, text in rows})
    return out


def _decision_of(row: DecisionRow) -> Decision:
    config = None
    if row.tp is not None:
        values = {name: getattr(row, name) for name in CONFIG_FIELDS}
        config = ExecConfig(**values)
    return Decision(job_id=row.job_id, config=config, site_factor=row.site_factor,
                    time_limit_s=row.time_limit_s, requeue=bool(row.requeue),
                    reason=row.reason or "", predicted_start_s=row.predicted_start_s,
                    predicted_end_s=row.predicted_end_s)


def _last_applied_for(s: Session, job_ids: Iterable[int]) -> dict[int, Decision]:
    out: dict[int, Decision] = {}
    for chunk in _chunks(sorted(set(job_ids))):
        latest = (select(func.max(DecisionRow.id))
                  .where(DecisionRow.job_id.in_(chunk), DecisionRow.applied.is_(True))
                  .group_by(DecisionRow.job_id))
        for row in s.scalars(select(DecisionRow).where(DecisionRow.id.in_(latest))):
            out[row.job_id] = _decision_of(row)
    return out


def _decisions_for(s: Session, job_id: int) -> list[RecordedDecision]:
    rows = s.scalars(select(DecisionRow).where(DecisionRow.job_id == job_id)
                     .order_by(DecisionRow.id))
    return [RecordedDecision(r.tick_id, r.at, _decision_of(r), bool(r.intended),
                             None if r.applied is None else bool(r.applied), r.error)
            for r in rows]


def _finished_jobs(s: Session, job_class: Optional[str], since: Optional[float],
                   include_vanished: bool) -> list[FinishedJob]:
    states = CALIBRATION_STATES if include_vanished else CALIBRATION_STATES[:1]
    query = (select(JobRow.job_id, JobRow.job_class, JobRow.predicted_run_s, JobRow.run_s,
                    JobRow.end_time, JobRow.state)
             .where(JobRow.state.in_(states), JobRow.run_s.is_not(None),
                    JobRow.predicted_run_s.is_not(None), JobRow.end_time.is_not(None))
             .order_by(JobRow.end_time, JobRow.job_id))
    if job_class is not None:
        query = query.where(JobRow.job_class == job_class)
    if since is not None:
        query = query.where(JobRow.end_time >= since)
    return [FinishedJob(r.job_id, r.job_class or "", r.predicted_run_s, r.run_s, r.end_time,
                        r.state) for r in s.execute(query)]


def _calibration(s: Session) -> dict[str, tuple[float, int]]:
    rows = s.execute(select(CalibrationRow.job_class, CalibrationRow.ratio, CalibrationRow.n_jobs))
    return {job_class: (ratio, n_jobs) for job_class, ratio, n_jobs in rows}


def _save_calibration(s: Session, rows: Iterable[CalibrationEntry]) -> None:
    values = [{"job_class": r.job_class, "n_jobs": r.n_jobs, "log_ratio": r.log_ratio,
               "ratio": r.ratio, "updated_at": r.updated_at} for r in rows]
    if not values:
        return
    s.execute(_TABLES["calibration"].delete()
              .where(CalibrationRow.job_class.in_([v["job_class"] for v in values])))
    s.execute(insert(CalibrationRow), values)


class _Queries:
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

    def calibration(self) -> dict[str, tuple[float, int]]:
        """Map from job_class to (ratio actual/predicted, number of jobs behind it)."""
        return self._read(_calibration)

    def tick_count(self) -> int:
        """Number of ticks recorded (failed ones recorded by record_failed_tick included)."""
        return self._read(lambda s: s.scalar(select(func.count()).select_from(TickRow)) or 0)


# ---------------------------------------------------------------- one tick's writes

def _queue_run_s(values: Mapping[str, Any]) -> tuple[Optional[float], Optional[float]]:
    """(start - eligible-or-submit, end - start) from a jobs row; None where unknown."""
    queue_s = run_s = None
    start, end = values["start_time"], values["end_time"]
    if start is not None:
        eligible = values["eligible_time"]
        queue_s = max(0.0, start - (eligible if eligible is not None else values["submit_time"]))
        if end is not None:
            run_s = max(0.0, end - start)
    return queue_s, run_s


def _transition_at(job: Job, from_state: Optional[str], now: float) -> float:
    """When the new state began: the job's own time for it where Slurm gives one."""
    if job.state == PENDING and from_state is None:
        return job.submit_time
    if job.state == RUNNING and job.start_time is not None:
        return job.start_time
    if job.state in FINISHED_STATES and job.end_time is not None:
        return job.end_time
    return now


def _decision_kind(d: Decision) -> str:
    parts = [name for name, on in (("resize", d.config is not None),
                                   ("site_factor", d.site_factor is not None),
                                   ("time_limit", d.time_limit_s is not None),
                                   ("requeue", d.requeue)) if on]
    return "+".join(parts) or "none"


def _decision_values(d: Decision, tick_id: int, at: float, applied: Optional[bool],
                     error: Optional[str]) -> dict[str, Any]:
    c = d.config
    values: dict[str, Any] = {name: getattr(c, name) if c else None for name in CONFIG_FIELDS}
    values.update(
        tick_id=tick_id, job_id=d.job_id, at=at, kind=_decision_kind(d),
        config=c.short() if c else None, gpus=c.gpus if c else None,
        site_factor=d.site_factor, time_limit_s=d.time_limit_s, requeue=d.requeue,
        reason=d.reason, predicted_start_s=d.predicted_start_s,
        predicted_end_s=d.predicted_end_s, intended=d.changes_anything,
        applied=False if (error and applied is None) else applied, error=error)
    return values


def _update_jobs_by_id(keys: Sequence[str]) -> Any:
    """UPDATE jobs SET key = :b_key ... WHERE job_id = :b_job_id (for executemany)."""
    return (update(_JOBS).where(_JOBS.c.job_id == bindparam("b_job_id"))
            .values({k: bindparam("b_" + k) for k in keys}))


def _prefixed(row: Mapping[str, Any]) -> dict[str, Any]:
    return {"b_" + k: v for k, v in row.items()}


# Statements built once: building and hashing a statement costs more than running it.
_TICKS = _TABLES["ticks"]
_TRANSITIONS = _TABLES["state_transitions"]
_TICK_COUNTS = ("n_pending", "n_running", "n_decisions", "n_applied", "n_errors")
_JOB_COLS = (_JOBS.c.job_id, *(_JOBS.c[k] for k in _OBSERVED + _DERIVED), _JOBS.c.predicted_run_s)
_SELECT_ACTIVE = select(*_JOB_COLS).where(_JOBS.c.state.in_(ACTIVE_STATES))
_SELECT_IDS = select(*_JOB_COLS).where(_JOBS.c.job_id.in_(bindparam("ids", expanding=True)))
_TOUCH_JOBS = (update(_JOBS).where(_JOBS.c.job_id.in_(bindparam("ids", expanding=True)))
               .values(last_seen_tick=bindparam("seen_tick")))
_UPDATE_OBSERVED = _update_jobs_by_id(_OBSERVED + _DERIVED)
_UPDATE_VANISHED = _update_jobs_by_id(("state", "end_time", "run_s", "size_class"))
_UPDATE_PREDICTED = _update_jobs_by_id(("predicted_run_s", "size_class"))
_INSERT_JOBS = insert(_JOBS)
_INSERT_TRANSITIONS = insert(_TRANSITIONS)
_INSERT_DECISIONS = insert(_DECISIONS)
_INSERT_SNAPSHOT = insert(_TABLES["tick_snapshots"])
_INSERT_TICK = insert(_TICKS)
_FINISH_TICK = (update(_TICKS).where(_TICKS.c.tick_id == bindparam("b_tick_id"))
                .values({k: bindparam("b_" + k) for k in
                         ("finished_at", "duration_s", "status", "error") + _TICK_COUNTS}))


class TickTx(_Queries):
    """The writes of one tick, all inside the tick's single transaction.

    Obtained from ``Store.tick``; do not keep it past the ``with`` block. Its query
    methods see this tick's uncommitted writes.
    """

    def __init__(self, session: Session, now: float, policy: str, dry_run: bool) -> None:
        self.session = session
        self.conn = session.connection()
        self.now = now
        self._t0 = time.perf_counter()
        self._counts = dict.fromkeys(_TICK_COUNTS, 0)
        self._finished = False
        self._snapshot_saved = False
        self._rows: dict[int, dict[str, Any]] = {}  # jobs rows as written this tick
        result = self.conn.execute(_INSERT_TICK, {"started_at": now, "policy": policy,
                                                  "dry_run": dry_run, "status": "running"})
        self.tick_id: int = _inserted_id(result)

    def _read(self, fn: Callable[..., T], *args: Any) -> T:
        return fn(self.session, *args)

    def _load_jobs(self, job_ids: Sequence[int], active: bool = False) -> dict[int, dict[str, Any]]:
        """Map from job_id to its current DB row, for ``job_ids`` (plus all active jobs)."""
        rows: dict[int, dict[str, Any]] = {}
        if active:
            rows.update(self._fetch(_SELECT_ACTIVE, {}))
        for chunk in _chunks([j for j in job_ids if j not in rows]):
            rows.update(self._fetch(_SELECT_IDS, {"ids": list(chunk)}))
        return rows

    def _fetch(self, stmt: Any, params: dict[str, Any]) -> dict[int, dict[str, Any]]:
        result = self.conn.execute(stmt, params)
        keys = list(result.keys())
        return {row[0]: dict(zip(keys, row, strict=True)) for row in result}

    def _job_values(self, job: Job, old: Optional[dict[str, Any]]) -> dict[str, Any]:
        values = dict(zip(_OBSERVED, _GET_OBSERVED(job), strict=True))
        if job.state == PENDING:  # Slurm's start/end of a pending job are forecasts
            values["start_time"] = values["end_time"] = None
        values["queue_s"], values["run_s"] = _queue_run_s(values)
        predicted = old["predicted_run_s"] if old else None
        values["size_class"] = size_class(
            job.gpus, values["run_s"] if values["run_s"] is not None else predicted)
        restarts = old["restarts"] if old else 0
        if old and old["state"] == RUNNING and job.state == PENDING:
            restarts += 1  # requeued since we last looked
        values["restarts"] = max(restarts, job.restarts)
        return values

    def save_snapshot(self, view: ClusterView) -> SnapshotSummary:
        """Record every job in ``view``, its state changes, and the cluster's occupancy.

        New jobs are inserted (first sight is a transition from NULL); known jobs are
        updated only where an observed field changed; every seen job gets
        ``last_seen_tick``. ``queue_s``/``run_s`` come from the job's own times (a
        PENDING job's start/end times are Slurm's forecasts, stored as NULL).
        It may be called again in the same tick (e.g. with final states from sacct):
        the cluster occupancy recorded is the first view's.

        Returns:
            Counts, and the ids of jobs the DB holds as active that the view lacks (pass
            them to ``mark_vanished`` once their fate is known or given up on).
        """
        jobs = {j.job_id: j for j in view.jobs}
        known = self._load_jobs(list(jobs), active=True)
        inserts, updates, transitions = [], [], []
        for job in jobs.values():
            old = known.get(job.job_id)
            values = self._job_values(job, old)
            if old is None:
                inserts.append({"job_id": job.job_id, "requested_gpus": job.gpus,
                                "first_seen_tick": self.tick_id, **values})
            elif [old[k] for k in values] != list(values.values()):
                updates.append({"job_id": job.job_id, **values})
            from_state = old["state"] if old else None
            if from_state != job.state:
                transitions.append({"job_id": job.job_id, "tick_id": self.tick_id,
                                    "from_state": from_state, "to_state": job.state,
                                    "at": _transition_at(job, from_state, self.now),
                                    "reason": job.state_reason or None})
            self._rows[job.job_id] = {**(old or {"predicted_run_s": None}), **values}
        self._write_snapshot(view, inserts, updates, transitions)
        vanished = tuple(sorted(j for j, row in known.items()
                                if j not in jobs and row["state"] in ACTIVE_STATES))
        return SnapshotSummary(len(inserts), len(transitions), vanished)

    def _write_snapshot(self, view: ClusterView, inserts: list[dict[str, Any]],
                        updates: list[dict[str, Any]], transitions: list[dict[str, Any]]) -> None:
        c = self.conn
        if inserts:
            c.execute(_INSERT_JOBS, inserts)
        if updates:
            c.execute(_UPDATE_OBSERVED, [_prefixed(u) for u in updates])
        for chunk in _chunks([j.job_id for j in view.jobs]):
            c.execute(_TOUCH_JOBS, {"ids": list(chunk), "seen_tick": self.tick_id})
        if transitions:
            c.execute(_INSERT_TRANSITIONS, transitions)
        if self._snapshot_saved:
            return
        self._snapshot_saved = True
        n_pending, n_running = len(view.pending), len(view.running)
        total, free = view.total_gpus, view.free_gpus
        c.execute(_INSERT_SNAPSHOT, {
            "tick_id": self.tick_id, "at": view.now, "n_nodes": len(view.nodes),
            "total_gpus": total, "free_gpus": free, "busy_gpus": total - free,
            "pending_gpus": sum(j.gpus for j in view.pending),
            "n_pending": n_pending, "n_running": n_running})
        self._counts.update(n_pending=n_pending, n_running=n_running)

    def mark_vanished(self, job_ids: Iterable[int], now: Optional[float] = None) -> int:
        """Close jobs that left the queue unseen: ``end_time = now`` (an estimate).

        A job that had started becomes ``COMPLETED?`` with ``run_s = now - start_time``;
        one that never started becomes ``CANCELLED?``. Jobs not active in the DB are left
        alone, so calling this twice is harmless.

        Returns:
            The number of jobs closed.
        """
        now = self.now if now is None else now
        known = self._load_jobs(sorted(set(job_ids)))
        updates, transitions = [], []
        for job_id in sorted(set(job_ids)):
            old = known.get(job_id)
            if old is None or old["state"] not in ACTIVE_STATES:
                continue
            started = old["state"] != PENDING
            state = VANISHED_STARTED if started else VANISHED_UNSTARTED
            start = old["start_time"]
            run_s = max(0.0, now - start) if started and start is not None else None
            cls = size_class(old["gpus"], run_s if run_s is not None else old["predicted_run_s"])
            updates.append({"b_job_id": job_id, "b_state": state, "b_end_time": now,
                            "b_run_s": run_s, "b_size_class": cls})
            transitions.append({"job_id": job_id, "tick_id": self.tick_id, "at": now,
                                "from_state": old["state"], "to_state": state,
                                "reason": "vanished"})
        if updates:
            self.conn.execute(_UPDATE_VANISHED, updates)
            self.conn.execute(_INSERT_TRANSITIONS, transitions)
            log.debug("closed %d vanished job(s) at %.0f: %s", len(updates), now,
                     " ".join(str(u["b_job_id"]) for u in updates[:20]))
        return len(updates)

    def upsert_profile(self, job_id: int, raw_text: str, profile: Optional[JobProfile],
                       parse_error: Optional[str] = None) -> None:
        """Record a job's raw profile request and what parsing made of it.

        The job must already be saved (``save_snapshot`` first). A parsed profile also sets
        the job's ``job_class``.

        Args:
            job_id: the Slurm job.
            raw_text: the token as found in the Comment (user text: a request only).
            profile: the validated profile, or None when parsing failed.
            parse_error: why parsing failed (None on success).
        """
        values: dict[str, Any] = {"raw_text": raw_text, "parse_error": parse_error,
                                  "updated_at": self.now, "job_class": None,
                                  **dict.fromkeys(("num_layers", "hidden_size", "seq_length",
                                                   "global_batch_size", "train_iters",
                                                   "min_gpus", "max_gpus", "requested_config"))}
        if profile is not None:
            lo, hi = profile.gpu_range
            values.update(job_class=profile.job_class, num_layers=profile.shape.num_layers,
                          hidden_size=profile.shape.hidden_size,
                          seq_length=profile.shape.seq_length,
                          global_batch_size=profile.plan.global_batch_size,
                          train_iters=profile.plan.iterations, min_gpus=lo, max_gpus=hi,
                          requested_config=profile.requested.short())
            self.session.execute(update(_JOBS).where(_JOBS.c.job_id == job_id)
                                 .values(job_class=profile.job_class))
        exists = self.session.scalar(select(ProfileRow.job_id).where(ProfileRow.job_id == job_id))
        if exists is None:
            self.session.execute(insert(ProfileRow).values(job_id=job_id, created_at=self.now,
                                                           **values))
        else:
            self.session.execute(update(_TABLES["profiles"])
                                 .where(ProfileRow.job_id == job_id).values(**values))

    def record_decisions(self, decisions: Sequence[Decision],
                         applied: Optional[Mapping[int, Optional[bool]]] = None,
                         errors: Optional[Mapping[int, str]] = None) -> None:
        """Record this tick's decisions (one bulk insert).

        Args:
            decisions: what the policy decided, one per job.
            applied: map from job_id to True (applied), False (failed) or None/absent (not
                attempted: dry run, or same as the last applied decision).
            errors: map from job_id to the backend's error text (implies applied=False).
        """
        applied, errors = applied or {}, errors or {}
        rows = [_decision_values(d, self.tick_id, self.now, applied.get(d.job_id),
                                 errors.get(d.job_id)) for d in decisions]
        if rows:
            self.conn.execute(_INSERT_DECISIONS, rows)
        self._counts["n_decisions"] += len(rows)
        self._counts["n_applied"] += sum(1 for r in rows if r["applied"] is True)
        self._counts["n_errors"] += sum(1 for r in rows if r["applied"] is False)

    def set_predicted_run(self, job_id: int, predicted_run_s: float) -> None:
        """Record the latest run-time estimate (seconds) for the config the job runs with."""
        self.set_predicted_runs({job_id: predicted_run_s})

    def set_predicted_runs(self, predicted_run_s: Mapping[int, float]) -> None:
        """Bulk ``set_predicted_run``: map from job_id to predicted run seconds.

        Rows whose value is unchanged are not written; ``size_class`` follows the
        estimate until the job's actual run time is known.
        """
        missing = [j for j in predicted_run_s if j not in self._rows]
        if missing:
            self._rows.update(self._load_jobs(missing))
        updates = []
        for job_id, value in predicted_run_s.items():
            row = self._rows.get(job_id)
            if row is None or row["predicted_run_s"] == value:
                continue
            run_s = row["run_s"] if row["run_s"] is not None else value
            row.update(predicted_run_s=value, size_class=size_class(row["gpus"], run_s))
            updates.append({"b_job_id": job_id, "b_predicted_run_s": value,
                            "b_size_class": row["size_class"]})
        if updates:
            self.conn.execute(_UPDATE_PREDICTED, updates)

    def save_calibration(self, rows: Iterable[CalibrationEntry]) -> None:
        """Replace the calibration of the job classes in ``rows`` (others are kept)."""
        _save_calibration(self.session, rows)

    def finish(self, status: str = "ok", error: Optional[str] = None,
               duration_s: Optional[float] = None, **counts: int) -> None:
        """Close the tick row. Called by ``Store.tick`` at exit when the body did not.

        Args:
            status: "ok", or "failed" to commit a tick that went wrong part-way.
            error: text explaining a failure.
            duration_s: wall seconds of the tick (default: measured since it began).
            **counts: overrides of n_pending, n_running (default: from the snapshot),
                n_decisions, n_applied, n_errors (default: from record_decisions).
        """
        unknown = set(counts) - set(self._counts)
        if unknown:
            raise TypeError("finish() got unknown counts: %s" % ", ".join(sorted(unknown)))
        self._counts.update(counts)
        if duration_s is None:
            duration_s = time.perf_counter() - self._t0
        self.conn.execute(_FINISH_TICK, _prefixed({
            "tick_id": self.tick_id, "finished_at": self.now + duration_s,
            "duration_s": duration_s, "status": status, "error": error, **self._counts}))
        self._finished = True


# ---------------------------------------------------------------- the store

class Store(_Queries):
    """History of jobs and decisions over SQLAlchemy (SQLite by default).

    Use ``Store.from_url(path_or_url)`` in the controller, ``Store.in_memory()`` in the
    simulator and tests. Queries return domain objects and frozen dataclasses.
    """

    def __init__(self, engine: Engine, create: bool = True) -> None:
        """Wrap ``engine`` (use ``make_engine`` for SQLite tuning); create missing tables."""
        self.engine = engine
        self._write_engine = engine.execution_options(sqlite_begin="IMMEDIATE")
        if create:
            self._create_missing_tables()

    def _create_missing_tables(self) -> None:
        with self.engine.connect() as conn:
            have = set(inspect(conn).get_table_names())
        if set(Base.metadata.tables) <= have:
            return
        # Under the write lock, so two processes opening a new file do not race.
        with self._write_engine.begin() as conn:
            Base.metadata.create_all(conn)
        log.info("created tables %s", ", ".join(sorted(set(Base.metadata.tables) - have)))

    @classmethod
    def from_url(cls, url: str, busy_timeout_s: float = 30.0) -> "Store":
        """Open (and create if missing) the store at a SQLAlchemy URL or SQLite file path."""
        return cls(make_engine(url, busy_timeout_s))

    @classmethod
    def in_memory(cls) -> "Store":
        """A private in-memory SQLite store (one persistent connection)."""
        return cls(make_engine("sqlite://"))

    def _read(self, fn: Callable[..., T], *args: Any) -> T:
        with Session(self.engine) as s, s.begin():
            return fn(s, *args)

    @contextmanager
    def tick(self, now: float, policy: str, dry_run: bool = False) -> Iterator[TickTx]:
        """One tick's transaction: everything written through the yielded TickTx commits
        together at the end of the ``with`` block, or not at all if the body raises.

        Args:
            now: the tick's clock (epoch or simulated seconds).
            policy: name of the policy run.
            dry_run: decisions are recorded but not applied.

        Raises:
            StoreBusy: another writer held the database past ``busy_timeout_s``.
        """
        try:
            with Session(self._write_engine) as session, session.begin():
                tx = TickTx(session, now, policy, dry_run)
                yield tx
                if not tx._finished:
                    tx.finish()
        except OperationalError as exc:
            if _is_locked(exc):
                log.warning("tick at %.0f: database busy: %s", now, exc.orig)
                raise StoreBusy("store is locked by another writer: %s" % exc.orig) from exc
            raise

    def record_failed_tick(self, now: float, policy: str, dry_run: bool, error: str) -> int:
        """Record a tick whose transaction was rolled back (its own small transaction).

        Returns:
            The failed tick's id.
        """
        with Session(self._write_engine) as s, s.begin():
            result = s.execute(insert(TickRow).values(
                started_at=now, finished_at=now, duration_s=0.0, policy=policy,
                dry_run=dry_run, status="failed", error=error[:10000]))
            return _inserted_id(result)

    def save_calibration(self, rows: Iterable[CalibrationEntry]) -> None:
        """Replace the calibration of the job classes in ``rows`` (others are kept)."""
        with Session(self._write_engine) as s, s.begin():
            _save_calibration(s, list(rows))
