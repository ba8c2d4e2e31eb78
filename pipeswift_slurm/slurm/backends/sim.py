"""In-memory Slurm-like cluster for the simulator: the ``sim`` backend.

It implements the Backend seam (``snapshot``/``apply``) exactly as the real backends do,
and behaves like Slurm's scheduler in ``schedule(now)``: pending jobs in priority order
(multifactor: age factor + SiteFactor, ties by submit time), started when their request
fits; with ``scheduler="backfill"``, EASY backfill from time limits: the first job that
does not fit gets a reservation on the nodes that free up earliest (by running jobs'
limits), and later jobs start only if they end before it (by their own limit) or leave
enough GPUs on the reserved nodes. ``scheduler="builtin"`` stops at the first job that
does not fit (strict FIFO). Placement is best fit: the nodes with the fewest free GPUs
that still hold the per-node request. Time limits are used for planning only (the
simulated truth never exceeds them by construction). The engine drives the clock, the
arrivals and the completions; this module knows no policy and no truth model.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field
from typing import Optional

from pipeswift_slurm.core.model import PENDING, RUNNING, ClusterView, Decision, ExecConfig, GpuRequest, Job, Node
from pipeswift_slurm.core.token import carries_profile
from pipeswift_slurm.slurm.backends import JobGone


@dataclass
class SimJob:
    """Mutable state of one simulated job (the backend's own bookkeeping)."""

    job_id: int
    name: str
    user: str
    submit_s: float
    comment: str
    num_nodes: int
    gpus_per_node: int
    time_limit_s: int
    state: str = PENDING
    site_factor: int = 0
    admin_comment: str = ""
    config: Optional[ExecConfig] = None
    start_s: Optional[float] = None
    end_s: Optional[float] = None
    placement: tuple[int, ...] = ()
    attained_gpu_s: float = 0.0
    ran_s: float = 0.0
    restarts: int = 0
    version: int = 0
    seen_version: int = -1
    held: bool = False
    view: Optional[Job] = field(default=None, repr=False)

    @property
    def gpus(self) -> int:
        return self.num_nodes * self.gpus_per_node


def _started(job: SimJob, default: float) -> float:
    """The job's start time (0.0 is a real start time, not a missing one)."""
    return job.start_s if job.start_s is not None else default


def _add_run(job: SimJob, now: float) -> None:
    """Count the run that stops at ``now`` into the job's attained service."""
    ran_s = now - _started(job, now)
    job.ran_s += ran_s
    job.attained_gpu_s += ran_s * job.gpus


class SimBackend:
    """A cluster of ``num_nodes`` x ``gpus_per_node`` GPUs driven by the simulator.

    Args:
        num_nodes: nodes in the cluster.
        gpus_per_node: GPUs per node (one GPU type per run).
        scheduler: "backfill" (Slurm's sched/backfill, EASY) or "builtin" (strict order).
        age_weight: PriorityWeightAge; age factor = weight * min(1, age / max_age_s).
        max_age_s: PriorityMaxAge in seconds.
        allow_requeue: whether ``Decision.requeue`` is honoured (a site setting).
    """

    name = "sim"
    in_memory = True  # no change can outlive the process: the controller writes no intents first

    def __init__(self, num_nodes: int, gpus_per_node: int, scheduler: str = "backfill",
                 age_weight: int = 1000, max_age_s: float = 7 * 86400.0, allow_requeue: bool = True,
                 gpu_type: str = ""):
        if scheduler not in ("backfill", "builtin"):
            raise ValueError("scheduler must be 'backfill' or 'builtin'")
        self.gpus_per_node = gpus_per_node
        self.scheduler = scheduler
        self.age_weight = age_weight
        self.max_age_s = max_age_s
        self.allow_requeue = allow_requeue
        self.gpu_type = gpu_type
        self.free = [gpus_per_node] * num_nodes
        self.jobs: dict[int, SimJob] = {}
        self.pending: dict[int, SimJob] = {}
        self.running: dict[int, SimJob] = {}
        self.now = 0.0
        self.updates = 0
        self._finished: list[SimJob] = []
        self._nodes: tuple[Node, ...] = ()
        self._nodes_key: tuple[int, ...] = ()
        self._node_cache: dict[tuple[int, int], Node] = {}

    # ------------------------------------------------------------ engine side
    def submit(self, job: SimJob) -> None:
        self.jobs[job.job_id] = job
        self.pending[job.job_id] = job

    def finish(self, job_id: int, now: float) -> SimJob:
        """Mark a running job done and free its GPUs."""
        job = self.running.pop(job_id)
        for node in job.placement:
            self.free[node] += job.gpus_per_node
        job.state, job.end_s = "COMPLETED", now
        _add_run(job, now)
        job.version += 1
        self._finished.append(job)
        return job

    # ------------------------------------------------------------ Backend seam
    def snapshot(self) -> ClusterView:
        key = tuple(self.free)
        if self._nodes_key != key:  # rebuild the node list only when allocations changed
            self._nodes = tuple(self._node(i, f) for i, f in enumerate(key))
            self._nodes_key = key
        nodes = self._nodes
        # Like Slurm's MinJobAge, a finished job stays visible until the next snapshot.
        jobs = tuple(self._view(j) for j in (*self._finished, *self.running.values(), *self.pending.values()))
        self._finished = []
        return ClusterView(now=self.now, nodes=nodes, jobs=jobs)

    def _node(self, index: int, free: int) -> Node:
        """Node ``index`` with ``free`` GPUs free (made once per pair: most ticks change
        only a few nodes)."""
        node = self._node_cache.get((index, free))
        if node is None:
            node = self._node_cache[index, free] = Node(
                "node%d" % (index + 1), self.gpus_per_node, self.gpus_per_node - free,
                "IDLE" if free == self.gpus_per_node else "MIXED", self.gpu_type)
        return node

    def _view(self, job: SimJob) -> Job:
        if job.view is None or job.seen_version != job.version:
            job.view = Job(job_id=job.job_id, state=job.state, submit_time=job.submit_s, num_nodes=job.num_nodes,
                           gpus=job.gpus, priority=job.site_factor, user=job.user, name=job.name,
                           state_reason="JobHeldAdmin" if job.held else "",
                           start_time=job.start_s if job.state != PENDING else None, end_time=job.end_s,
                           time_limit_s=job.time_limit_s,
                           site_factor=job.site_factor, opted_in=carries_profile(job.comment),
                           comment=job.comment,
                           admin_comment=job.admin_comment, config=job.config,
                           node_list=tuple("node%d" % (n + 1) for n in job.placement),
                           gpu_request=GpuRequest("tres_per_node", job.gpus_per_node),
                           attained_gpu_s=job.attained_gpu_s, restarts=job.restarts, ran_s=job.ran_s)
            job.seen_version = job.version
        return job.view

    def apply(self, decision: Decision, job: Job) -> None:
        """Change a pending job (size, SiteFactor, limit, decision token) or requeue a
        running one (when the site allows it).

        Raises:
            JobGone: the job is no longer pending (or running, for a requeue).
        """
        sim = self.jobs.get(decision.job_id)
        if decision.requeue:
            if sim is None or sim.state != RUNNING or not self.allow_requeue:
                raise JobGone("job %d is not running (or requeue is disabled)" % decision.job_id)
            self._requeue(sim)
            self._update_pending(sim, decision)
            return
        if sim is None or sim.state != PENDING:
            raise JobGone("job %d is no longer pending" % decision.job_id)
        self._update_pending(sim, decision)

    def _update_pending(self, sim: SimJob, decision: Decision) -> None:
        if decision.hold is not None:
            sim.held = decision.hold
        if decision.config is not None:
            from pipeswift_slurm.core.token import encode_decision

            sim.num_nodes, sim.gpus_per_node = decision.config.num_nodes, decision.config.gpus_per_node
            sim.config = decision.config
            sim.admin_comment = encode_decision(decision.config, int(self.now), held=sim.held)
        if decision.site_factor is not None:
            sim.site_factor = decision.site_factor
        if decision.time_limit_s is not None:
            sim.time_limit_s = decision.time_limit_s
        sim.version += 1
        self.updates += 1

    def _requeue(self, job: SimJob) -> None:
        self.running.pop(job.job_id)
        for node in job.placement:
            self.free[node] += job.gpus_per_node
        _add_run(job, self.now)
        job.state, job.start_s, job.placement = PENDING, None, ()
        job.restarts += 1
        job.version += 1
        self.pending[job.job_id] = job
        self.updates += 1

    # ------------------------------------------------------------ Slurm's scheduler
    def priority(self, job: SimJob, now: float) -> float:
        age = min(1.0, max(0.0, now - job.submit_s) / self.max_age_s) if self.max_age_s else 0.0
        return job.site_factor + self.age_weight * age

    def _place(self, free: list[int], nodes: int, per_node: int) -> Optional[tuple[int, ...]]:
        fitting = [i for i, f in enumerate(free) if f >= per_node]
        if len(fitting) < nodes:
            return None
        fitting.sort(key=lambda i: (free[i], i))
        return tuple(sorted(fitting[:nodes]))

    def _start(self, job: SimJob, placement: tuple[int, ...], now: float) -> None:
        for node in placement:
            self.free[node] -= job.gpus_per_node
        del self.pending[job.job_id]
        self.running[job.job_id] = job
        job.state, job.start_s, job.placement = RUNNING, now, placement
        job.version += 1

    def schedule(self, now: float) -> list[SimJob]:
        """One scheduling pass at ``now``; returns the jobs it started."""
        self.now = now
        order = sorted((j for j in self.pending.values() if not j.held),
                       key=lambda j: (-self.priority(j, now), j.submit_s, j.job_id))
        started: list[SimJob] = []
        shadow_s: Optional[float] = None
        slack: dict[int, int] = {}
        no_room: set[tuple[int, int]] = set()  # shapes with no room: a pass only takes GPUs, so they stay so
        for job in order:
            shape = (job.num_nodes, job.gpus_per_node)
            placement = None if shape in no_room else self._place(self.free, *shape)
            if placement is None:
                no_room.add(shape)
            if shadow_s is None:
                if placement is not None:
                    self._start(job, placement, now)
                    started.append(job)
                    continue
                if self.scheduler == "builtin":
                    break
                shadow_s, slack = self._reserve(job, now)
                continue
            if placement is None:
                continue
            if now + job.time_limit_s <= shadow_s:
                self._start(job, placement, now)
                started.append(job)
                continue
            placement = self._place_with_slack(job, slack)
            if placement is not None:
                for node in placement:
                    if node in slack:
                        slack[node] -= job.gpus_per_node
                self._start(job, placement, now)
                started.append(job)
        return started

    def _reserve(self, job: SimJob, now: float) -> tuple[float, dict[int, int]]:
        """Earliest time the blocked ``job`` fits, releasing running jobs by their limits,
        and the spare GPUs on the nodes reserved for it at that time (node -> spare)."""
        free = list(self.free)
        per_node = job.gpus_per_node
        roomy = sum(1 for f in free if f >= per_node)  # nodes with room for one of its tasks
        ends = [(_started(r, now) + r.time_limit_s, r.job_id, r) for r in self.running.values()]
        heapq.heapify(ends)
        while ends:
            end_s, _, run = heapq.heappop(ends)
            for node in run.placement:
                if free[node] < per_node <= free[node] + run.gpus_per_node:
                    roomy += 1
                free[node] += run.gpus_per_node
            if roomy >= job.num_nodes:
                placement = self._place(free, job.num_nodes, per_node)
                assert placement is not None
                return max(end_s, now), {n: free[n] - per_node for n in placement}
        return float("inf"), {}

    def _place_with_slack(self, job: SimJob, slack: dict[int, int]) -> Optional[tuple[int, ...]]:
        free = [f if i not in slack else min(f, slack[i]) for i, f in enumerate(self.free)]
        return self._place(free, job.num_nodes, job.gpus_per_node)
