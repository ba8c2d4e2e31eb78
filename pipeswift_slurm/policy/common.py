"""Helpers shared by policies: predicted ends of running jobs, per-job options and plans,
SiteFactor ranks, rescaled time limits and a free-GPU timeline. Pure; knows no policy
names. (Keeping SiteFactors stable between ticks is the controller's job:
``slurm/factors.py``.)"""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass
from typing import Iterable, Mapping, Optional, Sequence

from pipeswift_slurm.core.estimator import EstimatorProtocol
from pipeswift_slurm.core.model import ClusterView, Decision, ExecConfig, Job, JobProfile

# Spacing of SiteFactor between consecutive ranks: larger than Slurm's default
# PriorityWeightAge (1000), so the age factor cannot reorder the policy's ranks.
RANK_STEP = 10_000


@dataclass(frozen=True)
class Option:
    """Running a job on ``gpus`` GPUs in ``config`` takes ``run_s`` seconds (predicted;
    for a requeued job, from its last checkpoint on); ``full_run_s`` is the whole job's
    run time in that config (None: the same as ``run_s``)."""

    gpus: int
    config: ExecConfig
    run_s: float
    full_run_s: Optional[float] = None


def job_options(profile: JobProfile, estimator: EstimatorProtocol, max_gpus: int, max_nodes: int,
                iterations: Optional[int] = None, shared: Optional[dict[object, tuple[Option, ...]]] = None
                ) -> tuple[Option, ...]:
    """Best config and predicted run time for every GPU count the job allows that the
    cluster can hold and the do-no-harm rule offers (``Estimator.option``) (<= max_gpus GPUs on
    <= max_nodes nodes); with ``iterations``, the run time of that many iterations (what a
    requeued job has left) in that config. ``shared`` (one estimator's, e.g. for one tick)
    hands jobs whose options are the same (``estimator.option_run_times_key``) one tuple."""
    lo, hi = profile.gpu_range
    hi = min(hi, max_gpus)
    if shared is None or iterations is not None:
        return _job_options(profile, estimator, lo, hi, max_nodes, iterations)
    key = (estimator.option_run_times_key(profile, lo, hi), max_nodes)
    hit = shared.get(key)
    if hit is None:
        hit = shared[key] = _job_options(profile, estimator, lo, hi, max_nodes, None)
    return hit


def _job_options(profile: JobProfile, estimator: EstimatorProtocol, lo: int, hi: int, max_nodes: int,
                 iterations: Optional[int]) -> tuple[Option, ...]:
    best = [(gpus, config, run_s) for gpus, config, run_s in estimator.option_run_times_s(profile, lo, hi)
            if config.num_nodes <= max_nodes]
    if iterations is None:
        return tuple(Option(gpus, config, run_s) for gpus, config, run_s in best)
    return tuple(Option(gpus, config, float(estimator.run_time_s(profile, config, iterations)), run_s)
                 for gpus, config, run_s in best)


def lends_poorly(option: Option, user_gpus: int, least_gpu_s: float, efficiency: float) -> bool:
    """Whether ``option`` runs a job on more GPUs than ``user_gpus`` and would use them at
    under ``efficiency`` of the job's best rate: its GPU-seconds ``run_s x gpus`` against
    ``least_gpu_s``, the fewest of any count the job allows. At 0.6, a 1-GPU job given 2
    must run at least 1.2 x faster: lent GPUs must pay, since the jobs that arrive while it
    runs cannot have them. (Against the job's best count, which no resize moves: a job
    whose submitted size is not on record, e.g. resized by an older release, is seen by
    a cron tick at its new size, and a bar set by that size rose with every resize.)"""
    return option.gpus > user_gpus and least_gpu_s < efficiency * option.run_s * option.gpus


def kept_size(waits: Sequence[tuple[float, Option]], best: tuple[float, Option], gpus: int, now: float,
              margin: float) -> tuple[float, Option]:
    """Of a waiting job's plans (predicted end, option), ``best`` unless the plan at the
    size the job has now (``gpus``: asked, or given by an earlier tick) ends within
    ``margin`` of it (measured from ``now``): then that one. Predictions err, and a job
    resized to another target at every tick had Slurm re-plan it at every tick, never
    starting (issue 24, 11cb48 day 28: an 8-GPU job sent between 9 and 16 GPUs for 5 h)."""
    kept = next((w for w in waits if w[1].gpus == gpus), None)
    if kept is None or best[1].gpus == gpus or kept[0] - now > (best[0] - now) * (1 + margin):
        return best
    return kept


def best_run_s(options: Sequence[Option]) -> float:
    """The shortest predicted run among a job's options (inf when it has none)."""
    return min((o.run_s for o in options), default=math.inf)


def reachable_run_s(options: Sequence[Option], reach_gpus: float) -> float:
    """The shortest predicted run on a GPU count of at most ``reach_gpus`` (the GPUs the
    queue can have soon); the run on the job's fewest GPUs when none is that small (inf
    when it has no option)."""
    near = [o.run_s for o in options if o.gpus <= reach_gpus]
    if near:
        return min(near)
    return min(options, key=lambda o: (o.gpus, o.run_s)).run_s if options else math.inf


def least_gpu_s(options: Sequence[Option]) -> float:
    """The fewest GPU-seconds (``run_s x gpus``) among a job's options: its work at its
    best rate (inf when it has none)."""
    return min((o.run_s * o.gpus for o in options), default=math.inf)


def remaining_iterations(job: Job, profile: JobProfile, estimator: EstimatorProtocol) -> Optional[int]:
    """Iterations a requeued job has left from its last checkpoint, or None for a job that
    never ran (or that keeps no checkpoints, so starts over). The work done is estimated
    from the GPU-seconds it attained over the GPU-seconds of the whole job in its current
    config: exact when its speed scales linearly with GPUs, whatever sizes it ran at."""
    interval = profile.plan.save_interval
    if not job.restarts or job.attained_gpu_s <= 0 or not job.gpus or not interval:
        return None
    iterations = profile.plan.iterations
    area = job.gpus * float(estimator.run_time_s(profile, current_config(job, profile)))
    done = iterations * min(1.0, job.attained_gpu_s / area) if area > 0 else 0.0
    return max(1, iterations - int(done // interval) * interval)


def current_config(job: Job, profile: JobProfile) -> ExecConfig:
    """The config a job runs (or would run) with: the last decision, else the user's."""
    if job.config is not None and job.config.gpus == job.gpus:
        return job.config
    return profile.requested


def predicted_end_s(job: Job, profiles: Mapping[int, JobProfile], estimator: EstimatorProtocol, now: float) -> float:
    """When a running job should end: start + predicted run time for opted-in jobs (of the
    iterations it had left, for a requeued job: ``remaining_iterations``), start + time
    limit otherwise; never before ``now`` (an overdue job ends 'soon')."""
    start = job.start_time if job.start_time is not None else now
    profile = profiles.get(job.job_id)
    if profile is not None:
        left = remaining_iterations(job, profile, estimator)
        end = start + float(estimator.run_time_s(profile, current_config(job, profile), left))
    elif job.time_limit_s:
        end = start + job.time_limit_s
    else:
        end = now + 365 * 86400.0
    return max(end, now + 1.0)


def rank_factors(ordered: Sequence[int], max_factor: int) -> dict[int, int]:
    """SiteFactor per job id for a wanted order: first gets ``max_factor``, then -RANK_STEP
    each (floored at 0), so Slurm's multifactor priority keeps the order."""
    return {job_id: max(0, max_factor - i * RANK_STEP) for i, job_id in enumerate(ordered)}


def scaled_time_limit_s(job: Job, old_run_s: float, new_run_s: float) -> Optional[int]:
    """The job's limit scaled up by the predicted run-time ratio, in whole minutes (Slurm's
    unit), when the new config is predicted to be slower; None otherwise. A limit is never
    lowered: a wrong prediction must not get a job killed."""
    if not job.time_limit_s or old_run_s <= 0 or new_run_s <= old_run_s:
        return None
    return int(math.ceil(job.time_limit_s * new_run_s / old_run_s / 60.0)) * 60


def free_by_node(view: ClusterView) -> list[int]:
    return [n.gpus_free for n in view.nodes]


def fits_now(free: Sequence[int], config: ExecConfig) -> Optional[list[int]]:
    """Nodes (best fit) where ``config`` can start on the free GPUs, or None."""
    fitting = [i for i, f in enumerate(free) if f >= config.gpus_per_node]
    if len(fitting) < config.num_nodes:
        return None
    fitting.sort(key=lambda i: (free[i], i))
    return fitting[:config.num_nodes]


def priority_order(view: ClusterView, jobs: Iterable[Job]) -> list[Job]:
    """Slurm's order without a policy: higher priority first, then earlier submit."""
    return sorted(jobs, key=lambda j: (-j.priority, j.submit_time, j.job_id))


@dataclass
class Plan:
    """A pending job's plan: ``option`` (None: keep its size), its predicted start (None:
    none foreseen), and why; ``held``: it waits for the short-job lane (a long job that
    would take long jobs past their share of the GPUs), so Slurm's hold keeps it from
    starting meanwhile."""

    option: Optional[Option]
    start_s: Optional[float]
    reason: str
    held: bool = False


class Timeline:
    """Free GPUs (a count) as a step function of time from ``now`` on.

    ``times[i]`` starts a segment with ``free[i]`` GPUs free until ``times[i+1]``.
    """

    def __init__(self, now: float, free_now: int, releases: Iterable[tuple[float, int]]):
        self.times = [now]
        self.free = [free_now]
        for t, gpus in sorted(releases):
            if t <= self.times[-1]:
                self.free[-1] += gpus
            else:
                self.times.append(t)
                self.free.append(self.free[-1] + gpus)

    def _split(self, t: float) -> int:
        i = bisect.bisect_right(self.times, t) - 1
        if self.times[i] != t:
            self.times.insert(i + 1, t)
            self.free.insert(i + 1, self.free[i])
            i += 1
        return i

    def take(self, start: float, end: float, gpus: int) -> None:
        """Mark ``gpus`` busy over [start, end)."""
        i = self._split(start)
        j = self._split(end) if end != math.inf else len(self.times)
        for k in range(i, j):
            self.free[k] -= gpus

    def earliest(self, gpus: int, duration_s: float) -> float:
        """Earliest start with ``gpus`` free for ``duration_s`` (inf if never)."""
        n = len(self.times)
        for i in range(n):
            if self.free[i] < gpus:
                continue
            end = self.times[i] + duration_s
            ok = True
            for k in range(i + 1, n):
                if self.times[k] >= end:
                    break
                if self.free[k] < gpus:
                    ok = False
                    break
            if ok:
                return self.times[i]
        return math.inf


def decision_for(job: Job, profile: JobProfile, option: Optional[Option], site_factor: int,
                 reason: str, estimator: EstimatorProtocol, start_s: Optional[float] = None) -> Decision:
    """A decision resizing ``job`` to ``option`` (None = keep its size) at ``site_factor``.
    The reason says when the controller's exploration rule kept the job to layouts the site
    has measured (``JobProfile.known_layouts_only``), so ``pipeswift explain`` tells its user."""
    if profile.known_layouts_only:
        reason += " (layouts the site has measured only: another job of its class is trying a new one)"
    if option is None:
        return Decision(job.job_id, site_factor=site_factor, reason=reason, predicted_start_s=start_s)
    old = current_config(job, profile)
    new_full_s = option.run_s if option.full_run_s is None else option.full_run_s
    limit = scaled_time_limit_s(job, estimator.run_time_s(profile, old), new_full_s)
    end = None if start_s is None else start_s + option.run_s
    return Decision(job.job_id, config=option.config, site_factor=site_factor, time_limit_s=limit,
                    reason=reason, predicted_start_s=start_s, predicted_end_s=end)
