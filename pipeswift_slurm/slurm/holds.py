"""The controller's own holds: a hold it set (``hold=1`` in its decision token) is always its
own to release, also on a job it no longer manages (its profile became invalid, it left the
managed partitions, or its user opted it out). Pure: builds decisions, changes nothing."""

from __future__ import annotations

from pipeswift_slurm.core.model import ClusterView, Decision, Job, JobProfile
from pipeswift_slurm.core.token import held_by_controller


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
