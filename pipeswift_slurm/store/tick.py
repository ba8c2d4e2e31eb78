"""One tick's writes: ``TickTx``, everything a tick records inside its single transaction
(jobs and their state transitions, the snapshot, profiles, decisions, predicted run
times, calibration, the tick row), through the statements of ``store.rows``.

``Store.tick`` opens the transaction and hands out the TickTx; ORM rows never leave the
store. Must not import ``store.history`` (it builds on this module), any Slurm backend
or the policy.
"""

from __future__ import annotations

import logging
import time
from typing import Any, Callable, Iterable, Mapping, Optional, Sequence

from sqlalchemy import insert, select, update
from sqlalchemy.orm import Session

from pipeswift_slurm.core.model import PENDING, RUNNING, ClusterView, Decision, Job, JobProfile
from pipeswift_slurm.store import rows as R
from pipeswift_slurm.store.queries import (ACTIVE_STATES, decision_of, VANISHED_STARTED, VANISHED_UNSTARTED, CalibrationEntry,
                                           Queries, RunRecord, SnapshotSummary, T, chunks)
from pipeswift_slurm.core.sizeclass import size_class
from pipeswift_slurm.store.schema import DecisionRow, ProfileRow, TickRow

log = logging.getLogger(__name__)


class TickTx(Queries):
    """The writes of one tick, all inside the tick's single transaction.

    Obtained from ``Store.tick``; do not keep it past the ``with`` block. Its query
    methods see this tick's uncommitted writes.
    """

    def __init__(self, session: Session, now: float, policy: str, dry_run: bool) -> None:
        self.session = session
        self.conn = session.connection()
        self.now = now
        self._t0 = time.perf_counter()
        self._counts = dict.fromkeys(R.TICK_COUNTS, 0)
        self.finished = False
        self._snapshot_saved = False
        self._rows: dict[int, dict[str, Any]] = {}  # jobs rows as written this tick
        result = self.conn.execute(R.INSERT_TICK, {"started_at": now, "policy": policy,
                                                  "dry_run": dry_run, "status": "running"})
        self.tick_id: int = R.inserted_id(result)

    def _read(self, fn: Callable[..., T], *args: Any) -> T:
        return fn(self.session, *args)

    def _load_jobs(self, job_ids: Sequence[int], active: bool = False) -> dict[int, dict[str, Any]]:
        """Map from job_id to its current DB row, for ``job_ids`` (plus all active jobs)."""
        rows: dict[int, dict[str, Any]] = {}
        if active:
            rows.update(self._fetch(R.SELECT_ACTIVE, {}))
        for chunk in chunks([j for j in job_ids if j not in rows]):
            rows.update(self._fetch(R.SELECT_IDS, {"ids": list(chunk)}))
        return rows

    def _fetch(self, stmt: Any, params: dict[str, Any]) -> dict[int, dict[str, Any]]:
        result = self.conn.execute(stmt, params)
        keys = list(result.keys())
        return {row[0]: dict(zip(keys, row, strict=True)) for row in result}

    def _job_values(self, job: Job, old: Optional[dict[str, Any]]) -> dict[str, Any]:
        values = dict(zip(R.OBSERVED, R.GET_OBSERVED(job), strict=True))
        if job.state == PENDING:  # Slurm's start/end of a pending job are forecasts
            values["start_time"] = values["end_time"] = None
        restarts = old["restarts"] if old else 0
        if old and old["state"] == RUNNING and job.state == PENDING:
            restarts += 1  # requeued since we last looked
        values["restarts"] = max(restarts, job.restarts)
        values["ran_s"], values["attained_gpu_s"] = R.earlier_runs(old, job, self.now)
        values["eligible_time"] = R.eligible_since(old, job, self.now)
        if old and values["restarts"]:
            R.keep_first_submission(values, old)
        values["queue_s"], values["run_s"] = R.queue_run_s(values)
        values["wait_origin_time"] = R.wait_origin(values)
        predicted = old["predicted_run_s"] if old else None
        values["size_class"] = size_class(
            job.gpus, values["run_s"] if values["run_s"] is not None else predicted)
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
                                    "at": R.transition_at(job, from_state, self.now),
                                    "reason": job.state_reason or None})
            self._rows[job.job_id] = {**(old or dict.fromkeys(R.RUN_COLS)), **values}
        self._write_snapshot(view, inserts, updates, transitions)
        vanished = tuple(sorted(j for j, row in known.items()
                                if j not in jobs and row["state"] in ACTIVE_STATES))
        return SnapshotSummary(len(inserts), len(transitions), vanished)

    def _write_snapshot(self, view: ClusterView, inserts: list[dict[str, Any]],
                        updates: list[dict[str, Any]], transitions: list[dict[str, Any]]) -> None:
        c = self.conn
        if inserts:
            c.execute(R.INSERT_JOBS, inserts)
        if updates:
            c.execute(R.UPDATE_OBSERVED, [R.prefixed(u) for u in updates])
        for chunk in chunks([j.job_id for j in view.jobs]):
            c.execute(R.TOUCH_JOBS, {"ids": list(chunk), "seen_tick": self.tick_id})
        if transitions:
            c.execute(R.INSERT_TRANSITIONS, transitions)
        if self._snapshot_saved:
            return
        self._snapshot_saved = True
        n_pending, n_running = len(view.pending), len(view.running)
        total, free = view.total_gpus, view.free_gpus
        c.execute(R.INSERT_SNAPSHOT, {
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
            self.conn.execute(R.UPDATE_VANISHED, updates)
            self.conn.execute(R.INSERT_TRANSITIONS, transitions)
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
        for chunk in chunks(ids):
            existing.update(self.session.scalars(select(ProfileRow.job_id).where(ProfileRow.job_id.in_(chunk))))
        inserts, classes = [], []
        for job_id, raw_text, profile, parse_error in items:
            values = R.profile_values(raw_text, profile, parse_error, self.now)
            if profile is not None:
                classes.append({"b_job_id": job_id, "b_job_class": profile.job_class})
            if job_id in existing:
                self.session.execute(update(R.TABLES["profiles"]).where(ProfileRow.job_id == job_id).values(**values))
            else:
                inserts.append({"job_id": job_id, "created_at": self.now, **values})
        if inserts:
            self.session.execute(insert(ProfileRow), inserts)
        if classes:
            self.session.execute(R.SET_JOB_CLASS, classes)

    def record_decisions(self, decisions: Sequence[Decision],
                         applied: Optional[Mapping[int, Optional[bool]]] = None,
                         errors: Optional[Mapping[int, str]] = None, awaiting_outcome: bool = False) -> None:
        """Record this tick's decisions (one bulk insert).

        Args:
            decisions: what the policy decided, one per job.
            applied: map from job_id to True (applied), False (failed) or None/absent (not
                attempted: dry run, or same as the last applied decision).
            errors: map from job_id to the backend's error text (implies applied=False).
            awaiting_outcome: the decisions are intents, written before Slurm is changed;
                ``Store.record_outcomes`` (or the next tick's ``settle_intents``) says
                what became of them.
        """
        applied, errors = applied or {}, errors or {}
        rows = [R.decision_values(d, self.tick_id, self.now, applied.get(d.job_id),
                                 errors.get(d.job_id), awaiting_outcome) for d in decisions]
        if rows:
            self.conn.execute(R.INSERT_DECISIONS, rows)
        self._counts["n_decisions"] += len(rows)
        self._counts["n_applied"] += sum(1 for r in rows if r["applied"] is True)
        self._counts["n_errors"] += sum(1 for r in rows if r["applied"] is False)

    def awaiting_intents(self) -> list[tuple[int, int, Decision]]:
        """Earlier ticks' intents whose outcome is not known: (row id, tick_id, decision)."""
        stmt = select(DecisionRow).where(DecisionRow.awaiting_outcome.is_(True), DecisionRow.tick_id != self.tick_id)
        return [(r.id, r.tick_id, decision_of(r)) for r in self.session.scalars(stmt.order_by(DecisionRow.id))]

    def settle_intents(self, outcomes: Mapping[int, tuple[int, Optional[bool], str]]) -> None:
        """Record what became of earlier intents, as Slurm shows it now.

        Args:
            outcomes: map from decision row id to (its tick_id, applied: True, False or None
                when Slurm cannot tell, e.g. the job left, and the note kept in ``error``).
                A tick still marked 'acting' (it died between changing Slurm and recording
                the outcome) becomes 'interrupted'.
        """
        if not outcomes:
            return
        self.conn.execute(R.SETTLE_DECISIONS, [{"b_id": row_id, "b_applied": applied, "b_error": note,
                                                "b_awaiting": False}
                                               for row_id, (_, applied, note) in outcomes.items()])
        for tick_id in sorted({t for t, _, _ in outcomes.values()}):
            applied = sum(1 for t, a, _ in outcomes.values() if t == tick_id and a is True)
            self.session.execute(update(TickRow).where(TickRow.tick_id == tick_id, TickRow.status == "acting").values(
                status="interrupted", error="stopped after changing Slurm; outcomes settled by tick %d from "
                                            "Slurm's state" % self.tick_id))
            self.session.execute(update(TickRow).where(TickRow.tick_id == tick_id).values(
                n_applied=TickRow.n_applied + applied))
        log.info("settled %d earlier intent(s) from Slurm's state: %d applied", len(outcomes),
                 sum(1 for _, a, _ in outcomes.values() if a is True))

    def set_predicted_run(self, job_id: int, predicted_run_s: float) -> None:
        """Record the latest run-time estimate (seconds) for the config the job runs with."""
        self.set_predicted_runs({job_id: predicted_run_s})

    def set_predicted_runs(self, predicted_run_s: Mapping[int, float]) -> None:
        """Bulk ``set_predicted_run``: map from job_id to predicted run seconds."""
        self.set_runs({job_id: RunRecord(value) for job_id, value in predicted_run_s.items()})

    def set_runs(self, runs: Mapping[int, RunRecord]) -> None:
        """Record what each running job runs with: its config, the prediction for that
        config, and whether it may feed calibration (``RunRecord``).

        Rows whose values are unchanged are not written; unknown jobs are ignored;
        ``size_class`` follows the estimate until the job's actual run time is known.
        """
        missing = [j for j in runs if j not in self._rows]
        if missing:
            self._rows.update(self._load_jobs(missing))
        updates = []
        for job_id, run in runs.items():
            row = self._rows.get(job_id)
            values = dict(zip(R.RUN_COLS, (run.predicted_run_s, run.config, run.calibration_skip), strict=True))
            if row is None or all(row.get(k) == v for k, v in values.items()):
                continue
            run_s = row["run_s"] if row["run_s"] is not None else run.predicted_run_s
            row.update(values, size_class=size_class(row["gpus"], run_s))
            updates.append(R.prefixed({"job_id": job_id, **values, "size_class": row["size_class"]}))
        if updates:
            self.conn.execute(R.UPDATE_PREDICTED, updates)

    def save_calibration(self, rows: Iterable[CalibrationEntry]) -> None:
        """Replace the calibration of the job classes in ``rows`` (others are kept)."""
        R.save_calibration(self.session, rows)

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
        self.conn.execute(R.FINISH_TICK, R.prefixed({
            "tick_id": self.tick_id, "finished_at": self.now + duration_s,
            "duration_s": duration_s, "status": status, "error": error, **self._counts}))
        self.finished = True
