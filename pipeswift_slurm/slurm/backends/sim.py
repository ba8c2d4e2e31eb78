"""In-memory Slurm-like cluster for the simulator: the ``sim`` backend.

It implements the Backend seam (``snapshot``/``apply``) exactly as the real backends do,
and schedules as Slurm does with the site's settings (slurm/backends/sched_settings.py):
``main_pass(now)`` is Slurm's main scheduler (pending jobs in multifactor priority order,
ties by submit time, each started where it fits, until the first that does not);
``backfill_pass(now)`` is sched/backfill (every tested blocked job reserves whole nodes
from its earliest start, rounded to bf_resolution; later jobs start only off those nodes
for their time limit; the reservation search is ``backfill_plan.py``). ``schedule(now)``
runs both; the engine decides when each runs.
A job's CPUs (for the job size factor) are one per node, sbatch's default of one task per
node. ``scheduler="builtin"`` (the ``fifo`` baseline) never backfills. Placement is best
fit: the nodes with the fewest free GPUs that still hold the per-node request. Time limits
are used for planning only. The engine drives the clock, the arrivals and the
completions; this module knows no policy and no truth model.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field, replace
from typing import Optional, Sequence

from pipeswift_slurm.core.model import PENDING, RUNNING, ClusterView, Decision, ExecConfig, GpuRequest, Job, Node
from pipeswift_slurm.core.token import carries_profile
from pipeswift_slurm.slurm.backends import JobGone
from pipeswift_slurm.slurm.backends.backfill_plan import (Floor, Reservation, earliest_start, place, rounded,
                                                          start_of, unreserved)
from pipeswift_slurm.slurm.backends.sched_settings import SchedulingSettings, job_size_factor, priority


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
    begin_s: Optional[float] = None  # a begin time (a requeue's, psbatch's first look), until it passes
    partition: str = ""  # Slurm's text: one partition, or "a,b" for a job that may run in either
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
    """A cluster of ``num_nodes`` x ``gpus_per_node`` GPUs driven by the simulator, or of
    ``partitions`` (a mixed cluster: each its own nodes, GPU type and node size).

    Args:
        num_nodes: nodes in the cluster (without ``partitions``).
        gpus_per_node: GPUs per node (without ``partitions``).
        scheduler: the policy's: "backfill" (the site's settings decide) or "builtin"
            (never backfill, whatever the settings say).
        settings: the site's scheduling settings (default: Slurm's defaults).
        allow_requeue: whether ``Decision.requeue`` is honoured (a site setting).
        gpu_type: the GPU type the nodes show.
        cpus_per_node: CPUs per node (the job size factor's CPU share).
        age_weight, max_age_s: shortcuts that replace ``settings.weight_age`` and
            ``settings.max_age_s`` (tests).
        partitions: (name, GPU type, nodes, GPUs per node) of each partition; a job then
            starts only on nodes of a partition it is in (Slurm's main scheduler stops at
            the first job that does not fit only for that job's partitions).
    """

    name = "sim"
    in_memory = True  # no change can outlive the process: the controller writes no intents first

    def __init__(self, num_nodes: int, gpus_per_node: int, scheduler: str = "backfill",
                 settings: Optional[SchedulingSettings] = None, allow_requeue: bool = True,
                 gpu_type: str = "", cpus_per_node: int = 64, age_weight: Optional[int] = None,
                 max_age_s: Optional[float] = None, partitions: Sequence[tuple[str, str, int, int]] = ()):
        if scheduler not in ("backfill", "builtin"):
            raise ValueError("scheduler must be 'backfill' or 'builtin'")
        settings = settings or SchedulingSettings()
        if scheduler == "builtin":  # the policy's baseline runs Slurm's builtin scheduler
            settings = replace(settings, scheduler="builtin")
        if age_weight is not None:
            settings = replace(settings, weight_age=age_weight)
        if max_age_s is not None:
            settings = replace(settings, max_age_s=max_age_s)
        self.settings = settings
        layout = [(name, kind, gpn) for name, kind, nodes, gpn in partitions for _ in range(nodes)] \
            or [("", gpu_type, gpus_per_node)] * num_nodes
        self.node_partition = [p for p, _, _ in layout]
        self.node_gpu_type = [k for _, k, _ in layout]
        self.node_gpus = [g for _, _, g in layout]
        self.num_nodes = len(layout)
        self.cpus_per_node = cpus_per_node
        self.gpus_per_node = max(self.node_gpus, default=gpus_per_node)
        self.scheduler = settings.scheduler
        self.allow_requeue = allow_requeue
        self.gpu_type = gpu_type
        self.free = list(self.node_gpus)
        self._nodes_of: dict[str, Optional[frozenset[int]]] = {}
        self.jobs: dict[int, SimJob] = {}
        self.pending: dict[int, SimJob] = {}
        self.running: dict[int, SimJob] = {}
        self.now = 0.0
        self.updates = 0
        self._finished: list[SimJob] = []
        self._nodes: tuple[Node, ...] = ()
        self._nodes_key: tuple[int, ...] = ()
        self._node_cache: dict[tuple[int, int], Node] = {}
        self._begins: set[int] = set()  # pending jobs whose begin time has not passed

    # ------------------------------------------------------------ engine side
    def submit(self, job: SimJob) -> None:
        self.jobs[job.job_id] = job
        self.pending[job.job_id] = job
        if job.begin_s is not None:  # psbatch's first look
            self._begins.add(job.job_id)

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
        self._begin_passed(self.now)
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
            gpus, part = self.node_gpus[index], self.node_partition[index]
            node = self._node_cache[index, free] = Node(
                "node%d" % (index + 1), gpus, gpus - free, "IDLE" if free == gpus else "MIXED",
                self.node_gpu_type[index], (part,) if part else ())
        return node

    def _view(self, job: SimJob) -> Job:
        if job.view is None or job.seen_version != job.version:
            job.view = Job(job_id=job.job_id, state=job.state, submit_time=job.submit_s, num_nodes=job.num_nodes,
                           gpus=job.gpus, priority=job.site_factor, user=job.user, name=job.name,
                           partition=job.partition,
                           state_reason="JobHeldAdmin" if job.held else "BeginTime" if job.begin_s else "",
                           start_time=job.start_s if job.state != PENDING else None, end_time=job.end_s,
                           eligible_time=job.begin_s if job.begin_s and not job.restarts else None,
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
        if sim.begin_s is not None and not sim.restarts:  # the first look is done: StartTime=now
            sim.begin_s = None
            self._begins.discard(sim.job_id)
        if decision.hold is not None:
            sim.held = decision.hold
        if decision.partition is not None:
            sim.partition = decision.partition
        if decision.config is not None:
            from pipeswift_slurm.core.token import decision_token

            # the token reads the size the job had before this update
            sim.admin_comment = decision_token(decision.config, int(self.now), sim.held, sim.admin_comment, sim.gpus)
            sim.num_nodes, sim.gpus_per_node = decision.config.num_nodes, decision.config.gpus_per_node
            sim.config = decision.config
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
        if self.settings.requeue_delay_s > 0:  # Slurm sets its begin time (Reason=BeginTime)
            job.begin_s = self.now + self.settings.requeue_delay_s
            self._begins.add(job.job_id)

    def next_begin_s(self) -> float:
        """The earliest begin time of a requeued job still waiting for it (inf: none)."""
        return min((self.jobs[i].begin_s or 0.0 for i in self._begins), default=float("inf"))

    def _begin_passed(self, now: float) -> None:
        """Requeued jobs whose begin time has passed may start again."""
        for job_id in [i for i in self._begins if (self.jobs[i].begin_s or 0.0) <= now]:
            self._begins.discard(job_id)
            self.jobs[job_id].begin_s = None
            self.jobs[job_id].version += 1

    # ------------------------------------------------------------ Slurm's scheduler
    def priority(self, job: SimJob, now: float) -> float:
        """Slurm's multifactor priority of ``job`` at ``now`` (sched_settings.priority)."""
        size = job_size_factor(job.num_nodes, job.num_nodes, self.num_nodes, self.num_nodes * self.cpus_per_node,
                               self.settings.favor_small) if self.settings.weight_job_size else 0.0
        return priority(self.settings, now - job.submit_s, size, job.site_factor)

    def _order(self, now: float) -> list[SimJob]:
        self._begin_passed(now)
        return sorted((j for j in self.pending.values() if not j.held and j.begin_s is None),
                      key=lambda j: (-self.priority(j, now), j.submit_s, j.job_id))

    def nodes_of(self, partition: str) -> Optional[frozenset[int]]:
        """The node indices a job in ``partition`` (Slurm's text) may start on; None: any."""
        if partition not in self._nodes_of:
            names = set(partition.split(","))
            self._nodes_of[partition] = None if not partition or not any(self.node_partition) else frozenset(
                i for i, p in enumerate(self.node_partition) if p in names)
        return self._nodes_of[partition]

    def _start(self, job: SimJob, placement: tuple[int, ...], now: float) -> None:
        for node in placement:
            self.free[node] -= job.gpus_per_node
        del self.pending[job.job_id]
        self.running[job.job_id] = job
        job.state, job.start_s, job.placement = RUNNING, now, placement
        job.version += 1

    def schedule(self, now: float) -> list[SimJob]:
        """The main pass and then (sched/backfill) a backfill pass at ``now``; the jobs
        they started."""
        started = self.main_pass(now)
        if self.settings.scheduler == "backfill":
            started += self.backfill_pass(now)
        return started

    def main_pass(self, now: float) -> list[SimJob]:
        """Slurm's main scheduler: pending jobs in priority order, each started where it
        fits now, until the first that does not (it leaves the partition's later jobs
        pending, so that none takes its resources)."""
        self.now = now
        started: list[SimJob] = []
        blocked: set[str] = set()
        for job in self._order(now):
            parts = job.partition.split(",")
            if blocked.issuperset(parts):
                continue
            placement = place(self.free, job.num_nodes, job.gpus_per_node, self.nodes_of(job.partition))
            if placement is None:
                if not any(self.node_partition):
                    break  # one partition: nothing after it may start
                blocked.update(parts)
                continue
            self._start(job, placement, now)
            started.append(job)
        return started

    def backfill_pass(self, now: float) -> list[SimJob]:
        """Slurm's sched/backfill pass: the first ``bf_max_job_test`` pending jobs in
        priority order; each starts now if it fits on nodes that no reservation made in
        this pass holds during its time limit; otherwise it reserves the whole nodes it
        would start on at its earliest start (running jobs end at their limits), from
        that start to its end, both rounded down to ``bf_resolution`` (none beyond
        ``bf_window``). Later jobs never use a reserved node while it is reserved."""
        self.now = now
        settings = self.settings
        reserved: list[Reservation] = []
        started: list[SimJob] = []
        ends = self._ends(now)
        floors: dict[tuple[int, int, str], Floor] = {}
        for job in self._order(now)[:settings.bf_max_job_test]:
            limit = float(job.time_limit_s)
            free = unreserved(list(self.free), reserved, now, now + limit)
            placement = place(free, job.num_nodes, job.gpus_per_node, self.nodes_of(job.partition))
            if placement is not None:
                self._start(job, placement, now)
                started.append(job)
                bisect.insort(ends, (self._end_s(job, now), job.job_id, job.gpus_per_node, placement))
                continue
            floor = floors.setdefault((job.num_nodes, job.gpus_per_node, job.partition), Floor())
            start_s, placement = self._earliest(job, now, reserved, ends, floor.of(limit, now))
            floor.add(limit, start_s)
            if placement is None or start_s - now > settings.bf_window_s:
                continue
            bisect.insort(reserved, (*rounded(start_s, start_s + limit, settings.bf_resolution_s),
                                     frozenset(placement)), key=start_of)
        return started

    @staticmethod
    def _end_s(job: SimJob, now: float) -> float:
        """When a running job ends by its limit (not before ``now``)."""
        return max(now, _started(job, now) + job.time_limit_s)

    def _ends(self, now: float) -> list[tuple[float, int, int, tuple[int, ...]]]:
        """Running jobs as (end by their limit, job id, GPUs per node, nodes), soonest first."""
        return sorted((self._end_s(r, now), r.job_id, r.gpus_per_node, r.placement) for r in self.running.values())

    def _earliest(self, job: SimJob, now: float, reserved: list[Reservation],
                  ends: Optional[list[tuple[float, int, int, tuple[int, ...]]]] = None,
                  not_before: Optional[float] = None) -> tuple[float, Optional[tuple[int, ...]]]:
        """The earliest time after ``now`` at which ``job`` fits (running jobs ending at
        their limits: ``ends``, else computed; this pass's reservations held), within
        bf_window, and the nodes it would get then (``backfill_plan.earliest_start``)."""
        return earliest_start(self.free, self._ends(now) if ends is None else ends, reserved, now,
                              job.time_limit_s, job.num_nodes, job.gpus_per_node, self.nodes_of(job.partition),
                              self.settings.bf_resolution_s, self.settings.bf_window_s, not_before)
