"""Record one controller tick in the Store, in one transaction: the snapshot (jobs, state
transitions, occupancy), jobs that left unseen, new or changed profile requests, what
each running opted-in job runs with, and the decisions with their outcome.

What a job runs with is what calibration learns from: the uncalibrated prediction for
the config that actually RAN, compared later with its actual run time. The controller
knows that config only from its own decision token (AdminComment), and only when the
launcher would accept it for the allocation (``ran_config``: the same test the launcher
makes). A job that started without one ran the launcher's own choice, which the
controller cannot see: it is recorded with no config and no prediction, and marked
``calibration_skip`` so that it never feeds calibration (a guess at the launcher's
choice would teach the estimator its own guessing error). Emulated runs are kept out at
fit time by partition (``[calibration] exclude_partitions``, ``slurm/calibrate.py``).
Imported only when a Store is in use (it pulls in SQLAlchemy through the store)."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Callable, Mapping, Optional

from pipeswift_slurm.core.estimator import Estimator
from pipeswift_slurm.core.megatron_rules import config_for_allocation
from pipeswift_slurm.core.model import ClusterView, Decision, ExecConfig, Job, JobProfile
from pipeswift_slurm.policy import Policy
from pipeswift_slurm.slurm.seams import HistoryStore, TickWriter
from pipeswift_slurm.store.queries import RunRecord

log = logging.getLogger(__name__)

NO_DECISION = "config unknown: started without a controller decision (the launcher chose its own)"

if TYPE_CHECKING:
    from pipeswift_slurm.slurm.controller import TickReport


def record_tick(store: HistoryStore, report: "TickReport", profiles: Mapping[int, JobProfile],
                parsed: Mapping[int, tuple[str, Optional[JobProfile], str]], policy: Policy, estimator: Estimator,
                dry_run: bool, intents: bool = False,
                settle: Optional[Callable[[Decision, Optional[Job]], tuple[Optional[bool], str]]] = None) -> int:
    """Write ``report`` (a controller TickReport) into ``store`` as one tick; returns its id.

    With ``intents`` (a live tick, before it changes Slurm) the decisions are written as
    intents awaiting their outcome and the tick row says 'acting' until ``record_outcomes``;
    else they are written with the report's outcomes. ``settle(decision, job or None)``
    tells from this tick's view what became of earlier ticks' intents whose outcome was
    never recorded (applied True/False/None, and a note)."""
    view = report.view
    with store.tick(view.now, policy.name, dry_run) as tx:
        summary = tx.save_snapshot(view)
        if summary.vanished:
            tx.mark_vanished(summary.vanished, view.now)
        known = tx.profile_texts(list(parsed))
        tx.upsert_profiles([(job_id, text, profile, why or None) for job_id, (text, profile, why) in parsed.items()
                            if known.get(job_id) != text])
        runs = {job.job_id: run_record(job, profiles[job.job_id], estimator)
                for job in view.running if job.job_id in profiles}
        if runs:
            tx.set_runs(runs)
        if settle is not None:
            settle_earlier_intents(tx, view, settle)
        if intents:
            tx.record_decisions(report.decisions, awaiting_outcome=True)
            tx.finish(status="acting", duration_s=report.duration_s)
            return tx.tick_id
        applied: dict[int, Optional[bool]] = {j: True for j in report.applied}
        errors = dict(report.errors)
        applied.update({j: False for j in errors})
        tx.record_decisions(report.decisions, applied, errors)
        tx.finish(status="failed" if report.failed else "ok", error=report.failed, duration_s=report.duration_s)
        return tx.tick_id


def settle_earlier_intents(tx: TickWriter, view: ClusterView,
                           settle: Callable[[Decision, Optional[Job]], tuple[Optional[bool], str]]) -> None:
    """Give every earlier intent still awaiting its outcome the outcome Slurm shows now."""
    pending = tx.awaiting_intents()
    if not pending:
        return
    by_id = {j.job_id: j for j in view.jobs}
    outcomes = {}
    for row_id, tick_id, decision in pending:
        applied, note = settle(decision, by_id.get(decision.job_id))
        outcomes[row_id] = (tick_id, applied, note)
        log.warning("job %d: decision of tick %d had no recorded outcome; Slurm shows it %s", decision.job_id,
                    tick_id, {True: "applied", False: "not applied", None: "cannot tell"}[applied])
    tx.settle_intents(outcomes)


def record_outcomes(store: HistoryStore, tick_id: int, report: "TickReport") -> None:
    """Record what became of the intents ``record_tick`` wrote for ``report`` (applied,
    failed, or still unknown: those the next tick settles), and close the tick."""
    outcomes: dict[int, tuple[Optional[bool], Optional[str], bool]] = {}
    for d in report.decisions:
        outcomes[d.job_id] = (None, None, False)  # not attempted (the job left: logged, as before)
    outcomes.update({j: (True, None, False) for j in report.applied})
    outcomes.update({j: (False, why, False) for j, why in report.errors})
    outcomes.update({j: (None, "outcome unknown (%s); the next tick reads it from Slurm" % why, True)
                     for j, why in report.unknown})
    store.record_outcomes(tick_id, outcomes, "failed" if report.failed else "ok", report.failed, report.duration_s)


def ran_config(job: Job, profile: JobProfile) -> tuple[Optional[ExecConfig], str]:
    """The config a running job runs with, as far as the controller can know: its decision
    token's config when the launcher would have accepted it (same size and node shape as
    the allocation, valid for the job), else (None, why not)."""
    cfg = job.config
    if cfg is None:
        return None, NO_DECISION
    gpus_per_node = job.gpus // job.num_nodes if job.num_nodes else 0
    ran, problem = config_for_allocation(cfg, profile, job.num_nodes, gpus_per_node)
    if ran is None:
        return None, "config unknown: the launcher refuses the decision (%s, %s)" % (cfg.short(), problem)
    return ran, ""


def run_record(job: Job, profile: JobProfile, estimator: Estimator) -> RunRecord:
    """What the history keeps of a running job's run (``RunRecord``): the config it runs
    with and the cost model's uncalibrated run time for it, or why neither is known."""
    cfg, why = ran_config(job, profile)
    if cfg is None:
        return RunRecord(None, None, why)
    return RunRecord(estimator.cost.job_time_s(profile, cfg), cfg.short())
