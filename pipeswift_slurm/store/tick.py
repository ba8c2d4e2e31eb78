"""One tick's writes: ``TickTx``, everything a tick records inside its single transaction
(jobs and their state transitions, the snapshot, profiles, decisions, predicted run
times, calibration, the tick row), as bulk statements built once at import.

Owns: the write statements and the helpers that fill them (queue and run times, decision
rows). ``Store.tick`` opens the transaction and hands out the TickTx; ORM rows never leave
this module. Must not import ``store`` (it builds on this module), any Slurm backend or
the policy.
"""

from __future__ import annotations

import logging
import time
from operator import attrgetter
from typing import Any, Callable, Iterable, Mapping, Optional, Sequence

from sqlalchemy import bindparam, insert, select, update
from sqlalchemy.orm import Session

from pipeswift_slurm.core.model import FINISHED_STATES, PENDING, RUNNING, ClusterView, Decision, Job, JobProfile
from pipeswift_slurm.store.schema import Base, CalibrationRow, ProfileRow, size_class
from pipeswift_slurm.store.queries import (ACTIVE_STATES, CONFIG_FIELDS, VANISHED_STARTED, VANISHED_UNSTARTED,
                            CalibrationEntry, SnapshotSummary, T, _chunks, _Queries)

log = logging.getLogger(__name__)


_TABLES = Base.metadata.tables
_JOBS = _TABLES["jobs"]
_DECISIONS = _TABLES["decisions"]
# Fields copied from the observed Job, plus those derived from them.
_OBSERVED = ("user", "name", "partition", "submit_time", "eligible_time", "start_time",
             "end_time", "state", "state_reason", "num_nodes", "gpus", "opted_in")
_DERIVED = ("queue_s", "run_s", "size_class", "restarts", "ran_s", "attained_gpu_s")
_SET_JOB_CLASS = update(_JOBS).where(_JOBS.c.job_id == bindparam("b_job_id")).values(
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


def _profile_values(raw_text: str, profile: Optional[JobProfile], parse_error: Optional[str],
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
_GET_OBSERVED = attrgetter(*_OBSERVED)


def _inserted_id(result: Any) -> int:
    """The primary key of the row a single-row INSERT made."""
    return int(result.inserted_primary_key[0])


def _save_calibration(s: Session, rows: Iterable[CalibrationEntry]) -> None:
    values = [{"job_class": r.job_class, "n_jobs": r.n_jobs, "log_ratio": r.log_ratio,
               "ratio": r.ratio, "updated_at": r.updated_at} for r in rows]
    if not values:
        return
    s.execute(_TABLES["calibration"].delete()
              .where(CalibrationRow.job_class.in_([v["job_class"] for v in values])))
    s.execute(insert(CalibrationRow), values)


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
        values["ran_s"], values["attained_gpu_s"] = earlier_runs(old, job, self.now)
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
        self.upsert_profiles([(job_id, raw_text, profile, parse_error)])

    def upsert_profiles(self, items: Sequence[tuple[int, str, Optional[JobProfile], Optional[str]]]) -> None:
        """Bulk ``upsert_profile``: (job_id, raw_text, profile or None, parse_error) each.
        New profiles go in one insert, class updates in one executemany."""
        if not items:
            return
        ids = [job_id for job_id, _, _, _ in items]
        existing: set[int] = set()
        for chunk in _chunks(ids):
            existing.update(self.session.scalars(select(ProfileRow.job_id).where(ProfileRow.job_id.in_(chunk))))
        inserts, classes = [], []
        for job_id, raw_text, profile, parse_error in items:
            values = _profile_values(raw_text, profile, parse_error, self.now)
            if profile is not None:
                classes.append({"b_job_id": job_id, "b_job_class": profile.job_class})
            if job_id in existing:
                self.session.execute(update(_TABLES["profiles"]).where(ProfileRow.job_id == job_id).values(**values))
            else:
                inserts.append({"job_id": job_id, "created_at": self.now, **values})
        if inserts:
            self.session.execute(insert(ProfileRow), inserts)
        if classes:
            self.session.execute(_SET_JOB_CLASS, classes)

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
