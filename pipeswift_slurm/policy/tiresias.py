"""``tiresias``: discretized two-dimensional least-attained-service (2D-LAS, Gu et al.,
NSDI'19) with the users' configs. Attained service = GPUs x seconds run (earlier runs
included). Jobs sit in queues by attained service (thresholds ``queue_limits_gpu_s``);
lower queues first, FIFO inside a queue. Starvation promotion: a job that has waited
longer than ``promote_factor`` x its last run time (and at least ``min_wait_s``) goes
back to the first queue. Preemption (requeue, paying the restart cost): when the head
pending job of a queue does not fit, running jobs of strictly lower-priority queues that
have run at least ``min_run_s`` are requeued, latest-started first, until it fits.
"""

from __future__ import annotations

import bisect
from typing import ClassVar, Mapping

from pipeswift_slurm.core.estimator import EstimatorProtocol
from pipeswift_slurm.core.model import ClusterView, Decision, Job, JobProfile
from pipeswift_slurm.policy.common import free_by_node, rank_factors
from pipeswift_slurm.policy.knobs import TiresiasKnobs


class TiresiasPolicy:
    name: ClassVar[str] = "tiresias"
    scheduler: ClassVar[str] = "backfill"
    preempts: ClassVar[bool] = True

    def __init__(self, knobs: TiresiasKnobs = TiresiasKnobs()):
        self.knobs = knobs

    @property
    def site_factor_max(self) -> int:
        return self.knobs.site_factor_max

    def attained_gpu_s(self, job: Job, now: float) -> float:
        running = (now - job.start_time) * job.gpus if job.running and job.start_time is not None else 0.0
        return job.attained_gpu_s + running

    def service_queue(self, job: Job, now: float) -> int:
        """Queue by attained service alone (no starvation promotion)."""
        return bisect.bisect_right(self.knobs.queue_limits_gpu_s, self.attained_gpu_s(job, now))

    def queue_of(self, job: Job, now: float) -> int:
        if job.pending and job.ran_before_s > 0:
            if job.wait_s(now) > max(self.knobs.min_wait_s, self.knobs.promote_factor * job.ran_before_s):
                return 0
        return bisect.bisect_right(self.knobs.queue_limits_gpu_s, self.attained_gpu_s(job, now))

    def decide(self, view: ClusterView, profiles: Mapping[int, JobProfile], estimator: EstimatorProtocol) -> list[Decision]:
        now = view.now
        queued = sorted((self.queue_of(j, now), j.submit_time, j.job_id, j) for j in view.pending
                        if j.job_id in profiles)
        factors = rank_factors([job_id for _, _, job_id, _ in queued], self.site_factor_max)
        out = [Decision(job_id, site_factor=factors[job_id], reason="2D-LAS queue %d" % queue)
               for queue, _, job_id, _ in queued]
        if self.knobs.preempt and queued:
            out += self._preemptions(view, queued[0][3], profiles)
        return out

    def _preemptions(self, view: ClusterView, head: Job, profiles: Mapping[int, JobProfile]) -> list[Decision]:
        """Requeue lower-queue running jobs (latest started first) only when that lets the
        head job start at once on the freed nodes; otherwise preempt nothing."""
        now = view.now
        free = free_by_node(view)
        shape = head.config if head.config is not None and head.config.gpus == head.gpus else None
        nodes_needed, per_node = (shape.num_nodes, shape.gpus_per_node) if shape else (head.num_nodes, head.gpus // max(head.num_nodes, 1))
        if _fits(free, nodes_needed, per_node):
            return []
        # Preemption compares attained service only: a job promoted for starvation is
        # ordered first but does not evict others (that would make jobs ping-pong).
        head_queue = self.service_queue(head, now)
        victims = sorted((r for r in view.running if r.job_id in profiles and self.service_queue(r, now) > head_queue
                          and r.start_time is not None and now - r.start_time >= self.knobs.min_run_s),
                         key=lambda r: (-(r.start_time if r.start_time is not None else 0.0), -r.job_id))
        index = {n.name: i for i, n in enumerate(view.nodes)} if victims else {}
        chosen = []
        for victim in victims:
            per = victim.gpus // max(len(victim.node_list), 1)
            for name in victim.node_list:
                if name in index:
                    free[index[name]] += per
            chosen.append(victim)
            if _fits(free, nodes_needed, per_node):
                return [Decision(v.job_id, requeue=True, site_factor=0, reason="preempted for job %d (queue %d)"
                                 % (head.job_id, head_queue)) for v in chosen]
        return []


def _fits(free: list[int], nodes: int, per_node: int) -> bool:
    return sum(1 for f in free if f >= per_node) >= nodes
