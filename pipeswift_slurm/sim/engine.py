"""Discrete-event simulation of a Slurm-like GPU cluster running the real controller tick.

The loop: arrivals (jobs submitted to the SimBackend) and completions are events on a
heap ordered by (time, sequence), so ties are deterministic. At every event time the
controller ``tick`` runs (the same Controller as cron, on the sim backend), then the
backend's Slurm-like scheduling pass starts what fits. Ticks also run every
``tick_interval_s`` while jobs are pending and GPUs are free (or the policy preempts):
with nothing pending or nothing free, no lever can change anything, so those ticks are
skipped. With ``SimSettings.ticks_on_events`` off, the controller ticks as a deployed one
does instead: on its own clock, every ``tick_interval_s`` (cron's minute), whenever jobs
wait or something changed since its last tick; Slurm starts a job it has not seen yet at
the job's own size, and pipeswift-launch then runs the layout it chooses for that
allocation (``Estimator.best``) where the policy changes layouts. There psbatch also
submits each job with a begin time ``first_look_s`` ahead, which the controller's first
update of the job clears (``token.first_look_pending``): Slurm starts it then, or at that
begin time if no tick came. Truth: a job's run time in config c is (startup + remaining iterations x
iteration time of c) x its truth factor (class bias x noise, see workload.py); every
(re)start pays the startup again, and a requeued job resumes from its last checkpoint
(``--save-interval``; a job that does not save and load checkpoints starts over). A
job without a profile (a history job replayed as it ran, see sim/replay.py) is submitted
without a profile token, so the controller leaves it as submitted; it holds its GPUs for
its recorded run time. No policy code lives here.
"""

from __future__ import annotations

import heapq
import math
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Optional

from pipeswift_slurm.core.calibration import OnlineCalibrator
from pipeswift_slurm.core.costmodel import CostModel
from pipeswift_slurm.slurm.backends.sim import SimBackend, SimJob
from pipeswift_slurm.slurm.calibrate import OnlineCalibration
from pipeswift_slurm.slurm.controller import Controller, ControllerSettings
from pipeswift_slurm.slurm.backends.sched_settings import SchedulingSettings
from pipeswift_slurm.core.model import ExecConfig
from pipeswift_slurm.core.token import ProfileRequest, encode_profile
from pipeswift_slurm.sim.mixed import SimPartition
from pipeswift_slurm.sim.workload import WorkloadJob


@dataclass(frozen=True)
class SimSettings:
    """Cluster and loop settings of one simulation run."""

    num_nodes: int
    gpus_per_node: int
    tick_interval_s: float = 60.0
    ticks_on_events: bool = True  # False: the controller's own clock only, as cron's (module text)
    first_look_s: float = 60.0  # on its own clock: psbatch's begin time for the first look (0: none)
    allow_requeue: bool = True
    slurm: SchedulingSettings = field(default_factory=SchedulingSettings)
    partitions: tuple[SimPartition, ...] = ()  # a mixed cluster (sim/mixed.py); then num_nodes is theirs


@dataclass
class JobRecord:
    """The outcome of one job: times in seconds from the start of the simulation."""

    job_id: int
    name: str
    user: str
    model: str
    job_class: str
    category: str
    submit_s: float
    requested_gpus: int
    first_start_s: Optional[float] = None
    end_s: Optional[float] = None
    gpus: int = 0
    config: Optional[ExecConfig] = None
    run_s: float = 0.0
    busy_gpu_s: float = 0.0
    restarts: int = 0
    predicted_run_s: float = 0.0
    iters_done: float = 0.0
    run_started_s: float = 0.0
    run_true_s: float = 0.0
    flexible: bool = False
    partition: str = ""  # where it last ran (a mixed cluster)
    requested: Optional[ExecConfig] = None  # the user's own config (what layouts are learned against)

    @property
    def jct_s(self) -> float:
        return (self.end_s or 0.0) - self.submit_s

    @property
    def queue_s(self) -> float:
        """Time not running: JCT minus time spent running (all runs)."""
        return self.jct_s - self.run_s

    @property
    def reconfigured(self) -> bool:
        return self.config is not None and self.gpus != self.requested_gpus


@dataclass
class SimResult:
    """Per-job records and per-tick costs of one run."""

    policy: str
    records: list[JobRecord]
    decide_s: list[float] = field(default_factory=list)
    ticks: int = 0
    updates: int = 0
    makespan_s: float = 0.0
    total_gpus: int = 0
    wall_s: float = 0.0


class Simulation:
    """One policy on one workload.

    Args:
        jobs: the workload (sorted by submit time or not).
        policy: a Policy (its ``scheduler`` configures the Slurm-like backend).
        estimator: what the controller predicts with (possibly biased/calibrated).
        truth: the cost model that defines true iteration times.
        settings: cluster shape and loop settings.
        store: optional Store; every tick is then recorded as the real controller does.
        on_tick: optional callback(now, report) (progress bars).
        calibrator: optional online calibrator: the controller's calibration step then
            learns from the jobs finished so far, as cron's learns from the history.
        truths: on a mixed cluster (``settings.partitions``), the truth of each partition's
            GPU type (``truth`` is then only the default); the controller predicts each
            partition with the cost model of its GPU type.
    """

    def __init__(self, jobs: list[WorkloadJob], policy: Any, estimator: Any, truth: CostModel,
                 settings: SimSettings, store: Any = None,
                 on_tick: Optional[Callable[[float, Any], None]] = None,
                 calibrator: Optional[OnlineCalibrator] = None, truths: Optional[Mapping[str, Any]] = None):
        self.jobs = sorted(jobs, key=lambda j: (j.submit_s, j.job_id))
        self.by_id = {j.job_id: j for j in self.jobs}
        self.policy = policy
        self.truth = truth
        self.truths = dict(truths or {})
        self.settings = settings
        self.backend = SimBackend(settings.num_nodes, settings.gpus_per_node, scheduler=policy.scheduler,
                                  settings=settings.slurm, allow_requeue=settings.allow_requeue,
                                  gpu_type=truth.gpu.name,
                                  partitions=[(p.name, p.gpu.name, p.num_nodes, p.gpus_per_node)
                                              for p in settings.partitions])
        self.controller = Controller(self.backend, policy, estimator, store,
                                     ControllerSettings(allow_requeue=settings.allow_requeue,
                                                        warn_wait_bound=False),  # the run's summary says it
                                     clock=time.perf_counter,
                                     calibration=OnlineCalibration(calibrator, lambda: self.records)
                                     if calibrator is not None else None,
                                     partition_costs={p.name: CostModel(p.gpu) for p in settings.partitions})
        self.on_tick = on_tick
        # pipeswift-launch chooses the layout of a job the controller has not decided, on an
        # install whose policy changes layouts (the baselines run the user's own)
        self._launcher_chooses = bool(getattr(getattr(policy, "knobs", None), "reconfigure", False))
        self.records: dict[int, JobRecord] = {}
        self._heap: list[tuple[float, int, int, int]] = []
        self._seq = 0

    # ------------------------------------------------------------ truth
    def _truth_of(self, rec: JobRecord) -> Any:
        """The truth where the job runs (its partition's GPU type on a mixed cluster)."""
        return self.truths.get(rec.partition, self.truth)

    def _true_run_s(self, wjob: WorkloadJob, rec: JobRecord, config: Optional[ExecConfig]) -> float:
        if wjob.profile is None or config is None:
            return wjob.recorded_duration_s  # replayed as it ran
        remaining = max(0.0, wjob.profile.plan.iterations - rec.iters_done)
        truth = self._truth_of(rec)
        return (truth.startup_s(wjob.profile) + remaining * truth.iter_time_s(wjob.profile, config)) \
            * wjob.truth_factor

    def _config_of(self, sim: SimJob, wjob: WorkloadJob) -> Optional[ExecConfig]:
        if wjob.profile is None:
            return None
        if sim.config is not None and sim.config.gpus == sim.gpus:
            return sim.config
        if self._launcher_chooses and not self.settings.ticks_on_events:
            chosen = self._in_force.best(wjob.profile, sim.gpus)
            if chosen is not None:
                return chosen.config
        return wjob.profile.requested

    def _submit(self, wjob: WorkloadJob) -> None:
        if wjob.profile is None:
            self.backend.submit(SimJob(job_id=wjob.job_id, name=wjob.name, user=wjob.user, submit_s=wjob.submit_s,
                                       comment="", num_nodes=wjob.as_ran_nodes,
                                       gpus_per_node=wjob.as_ran_gpus_per_node, time_limit_s=wjob.time_limit_s,
                                       partition=wjob.partition))
            self.records[wjob.job_id] = JobRecord(wjob.job_id, wjob.name, wjob.user, wjob.model, "", wjob.category,
                                                  wjob.submit_s, wjob.gpus)
            return
        # psbatch's first look (on an install whose policy changes layouts; with ticks on
        # events the controller sees the job first anyway)
        look_s = self.settings.first_look_s if self._launcher_chooses and not self.settings.ticks_on_events else 0.0
        req = ProfileRequest(wjob.argv, wjob.profile.gpu_range if wjob.profile.flexible else None,
                             world_size=wjob.gpus, partitions=wjob.partitions, first_look=look_s > 0)
        user = wjob.profile.requested
        self.backend.submit(SimJob(job_id=wjob.job_id, name=wjob.name, user=wjob.user, submit_s=wjob.submit_s,
                                   comment=encode_profile(req), num_nodes=user.num_nodes,
                                   gpus_per_node=user.gpus_per_node, time_limit_s=wjob.time_limit_s,
                                   partition=wjob.partition, begin_s=wjob.submit_s + look_s if look_s > 0 else None))
        self.records[wjob.job_id] = JobRecord(wjob.job_id, wjob.name, wjob.user, wjob.model,
                                              wjob.profile.job_class, wjob.category, wjob.submit_s, wjob.gpus,
                                              flexible=wjob.profile.flexible, requested=user)

    def _started(self, sim: SimJob, now: float, estimator: Any) -> None:
        """A job (re)started at ``now``; its prediction is by ``estimator``, the one in
        force when the tick decided (a refit at the tick's end applies after ``now``)."""
        wjob, rec = self.by_id[sim.job_id], self.records[sim.job_id]
        rec.partition = self.backend.node_partition[sim.placement[0]] if sim.placement else ""
        config = self._config_of(sim, wjob)
        run_s = self._true_run_s(wjob, rec, config)
        if rec.first_start_s is None:
            rec.first_start_s = now
        rec.gpus, rec.config, rec.run_started_s, rec.run_true_s = sim.gpus, config, now, run_s
        rec.restarts = sim.restarts
        rec.predicted_run_s = run_s if wjob.profile is None or config is None else \
            estimator.run_time_s(wjob.profile, config)
        # the launcher's start: a job replayed as it ran has it in its recorded time already
        launch_s = self.backend.settings.launch_s if wjob.profile is not None else 0.0
        heapq.heappush(self._heap, (now + launch_s + run_s, self._seq, sim.job_id, sim.restarts))
        self._seq += 1

    def _stopped(self, job_id: int, now: float, completed: bool) -> None:
        rec, wjob = self.records[job_id], self.by_id[job_id]
        ran = now - rec.run_started_s
        rec.run_s += ran
        rec.busy_gpu_s += ran * rec.gpus
        if wjob.profile is None:  # (never requeued: the controller leaves it alone)
            rec.end_s = now if completed else rec.end_s
            return
        if completed:
            rec.end_s = now
            rec.iters_done = wjob.profile.plan.iterations
            return
        truth = self._truth_of(rec)
        startup = truth.startup_s(wjob.profile) * wjob.truth_factor
        if rec.config is not None and ran > startup:
            iter_true = truth.iter_time_s(wjob.profile, rec.config) * wjob.truth_factor
            rec.iters_done += (ran - startup) / iter_true
        # a requeued job resumes from its last checkpoint; without checkpoints it starts over
        interval = wjob.profile.plan.save_interval
        rec.iters_done = float(int(rec.iters_done // interval) * interval) if interval else 0.0

    # ------------------------------------------------------------ loop
    def _tick(self, now: float, result: SimResult) -> bool:
        """One controller tick at ``now``; whether it changed a job (Slurm then runs its
        main scheduler)."""
        running_before = set(self.backend.running)
        updates_before = self.backend.updates
        self.backend.now = now
        self._in_force = self.controller.estimator
        report = self.controller.tick()
        result.ticks += 1
        result.decide_s.append(report.decide_s)
        for job_id in running_before - set(self.backend.running):
            self._stopped(job_id, now, completed=False)  # requeued by the tick
        if self.on_tick is not None:
            self.on_tick(now, report)
        return self.backend.updates != updates_before

    def _pass(self, now: float, backfill: bool) -> None:
        """A Slurm scheduler pass at ``now`` (main or backfill); jobs it starts begin."""
        started = self.backend.backfill_pass(now) if backfill else self.backend.main_pass(now)
        for sim in started:
            self._started(sim, now, self._in_force)

    def _wants_periodic(self) -> bool:
        if not self.backend.pending:
            return False
        return self.policy.preempts or any(f > 0 for f in self.backend.free)

    def run(self) -> SimResult:
        """Run to completion (every job finishes) and return the records.

        When Slurm's passes run (SchedulingSettings): the main scheduler at once on a job's
        end and on a tick that changed a job, and ``batch_sched_delay_s`` after a submission
        (the submissions in between share that pass); backfill every ``bf_interval_s`` (on its own clock) while
        jobs pend, skipped when nothing changed since the last one (``bf_interval_s`` 0:
        right after every main pass; with all latencies 0, every job starts the moment
        Slurm could start it, the idealised scheduler of earlier releases). A requeued job
        pends until its begin time (``requeue_delay_s``); both passes run then. The controller
        ticks at every arrival and end, and every ``tick_interval_s`` while it could act;
        with ``ticks_on_events`` off, on its own clock only (the module's text)."""
        wall0 = time.perf_counter()
        result = SimResult(self.policy.name, [], total_gpus=sum(self.backend.node_gpus))
        slurm = self.backend.settings
        backfill = slurm.scheduler == "backfill"
        nxt, now = 0, 0.0
        next_periodic = next_main = next_bf = next_begin = float("inf")
        unseen = False  # an arrival or an end since the controller's last tick (its own clock)
        self._in_force = self.controller.estimator
        while nxt < len(self.jobs) or self._heap or self.backend.pending:
            t_arrival = self.jobs[nxt].submit_s if nxt < len(self.jobs) else float("inf")
            t_end = self._heap[0][0] if self._heap else float("inf")
            now = min(t_arrival, t_end, next_periodic, next_main, next_bf, next_begin)
            if now == float("inf"):
                raise RuntimeError("simulation stalled with %d pending jobs that can never start"
                                   % len(self.backend.pending))
            arrived = ended = False
            begun = now >= next_begin  # a requeued job may start again: both passes consider it
            while nxt < len(self.jobs) and self.jobs[nxt].submit_s <= now:
                self._submit(self.jobs[nxt])
                nxt += 1
                arrived = True
            while self._heap and self._heap[0][0] <= now:
                _, _, job_id, generation = heapq.heappop(self._heap)
                sim = self.backend.jobs[job_id]
                if sim.state == "RUNNING" and sim.restarts == generation:
                    self.backend.finish(job_id, now)
                    self._stopped(job_id, now, completed=True)
                    ended = True
            changed = False
            unseen = unseen or arrived or ended
            if now >= next_periodic or (self.settings.ticks_on_events and (arrived or ended)):
                changed = self._tick(now, result)
                unseen = False
            if arrived:  # Slurm defers the main pass that a submission asks for (batch_sched_delay)
                next_main = min(next_main, now + slurm.batch_sched_delay_s)
            if ended or changed or begun or now >= next_main:
                if now >= next_main:
                    next_main = float("inf")
                self._pass(now, backfill=False)
                if backfill and not slurm.bf_interval_s:  # bf_interval 0: backfill with every main pass
                    self._pass(now, backfill=True)
            if backfill and now >= next_bf:
                self._pass(now, backfill=True)
                next_bf = float("inf")
            if backfill and slurm.bf_interval_s and next_bf == float("inf") and self.backend.pending \
                    and (arrived or ended or changed or begun):
                next_bf = (math.floor(now / slurm.bf_interval_s) + 1) * slurm.bf_interval_s
            next_begin = self.backend.next_begin_s()
            if self.backend.pending and not self.backend.running and nxt == len(self.jobs) and not unseen \
                    and next_main == float("inf") and next_bf == float("inf") and next_begin == float("inf"):
                stuck = sorted(self.backend.pending)[:5]
                raise RuntimeError("simulation stalled: %d pending job(s) can never start on an idle cluster"
                                   " (first: %s)" % (len(self.backend.pending), stuck))
            if self.settings.ticks_on_events:
                next_periodic = now + self.settings.tick_interval_s if self._wants_periodic() else float("inf")
            elif next_periodic <= now or next_periodic == float("inf"):  # the next minute of cron's clock
                next_periodic = (math.floor(now / self.settings.tick_interval_s) + 1) * self.settings.tick_interval_s \
                    if unseen or self.backend.pending else float("inf")
        result.records = [self.records[j.job_id] for j in self.jobs]
        result.makespan_s = max((r.end_s or 0.0) for r in result.records) if result.records else 0.0
        result.updates = self.backend.updates
        result.wall_s = time.perf_counter() - wall0
        return result
