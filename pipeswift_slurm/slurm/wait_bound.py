"""Pending jobs past the policy's wait bound, seen at every tick (issue 24, item 5).

A policy that keeps a wait bound (its knob ``wait_bound_s``, ``policy.wait_bound_of``)
cannot keep it when the load is beyond what any order allows; the controller then says so
in one WARNING line per tick, and the tick report lists the jobs. The history's Prometheus
text has the same count (``pipeswift_jobs_pending_over_wait_bound``, ``reports/metrics.py``).
"""

from __future__ import annotations

import logging
from collections.abc import Collection
from typing import Optional

from pipeswift_slurm.core.model import ClusterView

log = logging.getLogger("pipeswift_slurm.slurm.controller")


def over_wait_bound(view: ClusterView, runnable: Collection[int], bound_s: Optional[float],
                    warn: bool = True) -> list[int]:
    """The pending jobs of ``runnable`` (job ids) queued longer than ``bound_s``
    (``Job.queued_s``: earlier runs of a requeued job do not count), longest first; none
    when ``bound_s`` is None. With ``warn``, one WARNING line when there are any (a count,
    no job ids: the line is about the load, not about one job)."""
    if bound_s is None:
        return []
    over = sorted(((wait_s, job.job_id) for job in view.jobs if job.pending and job.job_id in runnable
                   and (wait_s := job.queued_s(view.now)) > bound_s), key=lambda w: (-w[0], w[1]))
    if over and warn:
        log.warning("%d pending job(s) waited past the wait bound of %.1f h (the longest %.1f h): the load is beyond"
                    " what the bound allows (pipeswift report waits names them)", len(over), bound_s / 3600,
                    over[0][0] / 3600)
    return [job_id for _, job_id in over]
