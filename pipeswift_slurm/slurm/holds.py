"""The controller's own holds: a hold it set (``hold=1`` in its decision token) is always its
own to release, also on a job it no longer manages (its profile became invalid, it left the
managed partitions, or its user opted it out); and the holds and waits Slurm keeps a job
pending for whatever its priority (``not_runnable``). Pure: builds decisions, changes nothing
(``warn_first_looks_kept`` only logs)."""

from __future__ import annotations

import logging

from pipeswift_slurm.core.model import ClusterView, Decision, Job, JobProfile
from pipeswift_slurm.core.token import first_look_pending, held_by_controller

log = logging.getLogger(__name__)


def own_holds_to_release(view: ClusterView, decided: set[int],
                         managed: dict[int, JobProfile]) -> list[tuple[Decision, Job]]:
    """Releases of the controller's own holds on pending jobs it no longer manages (not in
    ``managed``) and has no decision for this tick (not in ``decided``)."""
    out = []
    for job in view.pending:
        if job.job_id in decided or job.job_id in managed or not job.held or not held_by_controller(job.admin_comment):
            continue
        out.append((Decision(job.job_id, hold=False,
                             reason="release the controller's own hold: job no longer managed"), job))
    return out


def first_looks_to_clear(view: ClusterView, decided: set[int]) -> list[tuple[Decision, Job]]:
    """An update (StartTime=now, and nothing else) for each job psbatch left for the first
    look that has no decision this tick: one the policy leaves as it is, one outside the
    managed partitions, one under a policy that decides nothing. Its begin time was only
    ever for the controller; without this it would wait it out."""
    return [(Decision(job.job_id, reason="first look: nothing to change"), job) for job in view.pending
            if job.job_id not in decided
            and first_look_pending(job, view.now)]


def warn_first_looks_kept(view: ClusterView) -> int:
    """In a dry run, one WARNING line when jobs wait on psbatch's first look, which only a
    live tick clears (each then waits out its begin time); returns how many."""
    waiting = sum(1 for job in view.pending if first_look_pending(job, view.now))
    if waiting:
        log.warning("dry run: %d job(s) wait out psbatch's first look (a minute by default), which only a live tick "
                    "clears; set PIPESWIFT_FIRST_LOOK_S=0 where psbatch runs until you go live", waiting)
    return waiting


# Why Slurm will not start a pending job whatever its priority: a hold (by its user or an
# admin; a hold the controller set is its own to release), a dependency, a begin time.
NOT_RUNNABLE_REASONS = frozenset({"Dependency", "DependencyNeverSatisfied", "BeginTime"})


def not_runnable(job: Job, now: float) -> str:
    """Why a pending job cannot start at ``now`` whatever the policy decides ('' when it can): held
    by its user or an admin (not by the controller), or pending on a dependency or a
    begin time. Such a job is not planned, and gets no decision (no SiteFactor either:
    Slurm does not report one for held or dependent jobs, so it would be re-applied on
    every tick)."""
    if not job.pending:
        return ""
    if job.held and not held_by_controller(job.admin_comment):
        return "held (%s)" % job.state_reason
    if job.state_reason not in NOT_RUNNABLE_REASONS:
        return ""
    if job.state_reason == "BeginTime" and first_look_pending(job, now):
        return ""  # psbatch's begin time for the controller's first look: decided now, and cleared
    return "pending on %s" % job.state_reason
