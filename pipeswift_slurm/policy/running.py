"""``pipeswift``'s levers on running jobs: switch-cost-gated preemption (requeue a long
job for shorter ones) and reshape (requeue a job into a bigger shape that ends it sooner).
Both weigh the predicted gain against the switch cost: a restart (``restart_cost_s``) and
the work since the last checkpoint (``lost_work_s``). Pure; the planning of pending jobs
is ``policy/pipeswift.py``.
"""

from __future__ import annotations

import math
from typing import Any, Collection, Mapping, Optional

from pipeswift_slurm.core.estimator import EstimatorProtocol
from pipeswift_slurm.core.model import ClusterView, Decision, Job, JobProfile
from pipeswift_slurm.policy.common import Plan, current_config, fits_now, free_by_node, predicted_end_s
from pipeswift_slurm.policy.knobs import PipeSwiftKnobs


def preemptions(knobs: PipeSwiftKnobs, view: ClusterView, profiles: Mapping[int, JobProfile], estimator: EstimatorProtocol,
                 ordered: list[Job], plans: dict[int, Plan], free: list[int]) -> list[Decision]:
    """Switch-cost-gated preemption (``preempt``): requeue a long running job when the
    short jobs that would start at once on its GPUs, and the queue behind them, save
    more waiting, in total, than the victim loses: until they end, plus its restart
    (startup) and the work since its last checkpoint (half its save interval,
    expected), times (1 + ``preempt_margin``).
    Victims, longest predicted remaining first: opted-in jobs that checkpoint and
    resume (``--save``, ``--load``, ``--save-interval``), have run
    ``preempt_min_run_s`` since their last start, were requeued fewer than
    ``preempt_max_restarts`` times, that never starved if they span several nodes
    (queued ``promote_fraction`` of the wait bound: requeued, such a job may wait
    hours for whole nodes again), and whose queue time plus this loss stays within
    ``preempt_wait_share`` of the wait bound. Beneficiaries: planned jobs that wait and
    are ``preempt_ratio`` times shorter than the victim's remaining run. The jobs
    packed onto the freed GPUs are re-planned to start now; ``free`` is updated."""
    now = view.now

    def waits(job: Job) -> bool:
        plan = plans.get(job.job_id)
        return plan is not None and plan.option is not None and plan.start_s is not None and plan.start_s > now

    waiting = [j for j in ordered if waits(j)]
    if not waiting:
        return []
    # jobs that wait, planned or beyond the planning depth: each gets the freed
    # GPU-seconds' share of the cluster sooner (a saturated queue drains that much faster)
    queued = sum(1 for j in ordered if j.job_id not in plans or waits(j))
    total_gpus = max(view.total_gpus, 1)
    index = {n.name: i for i, n in enumerate(view.nodes)}
    # jobs planned to start now on GPUs free by count but not on whole nodes took no node
    # from ``free``: the short jobs packed onto a victim's GPUs must leave them theirs
    gpus_of = {j.job_id: j.gpus for j in ordered}
    promised = sum(p.option.gpus if p.option is not None else gpus_of.get(i, 0)
                   for i, p in plans.items() if p.start_s == now)
    unplaced = max(0, promised - (sum(free_by_node(view)) - sum(free)))
    victims = sorted(((predicted_end_s(r, profiles, estimator, now) - now, r) for r in view.running
                      if r.job_id in profiles and profiles[r.job_id].plan.save_interval
                      and r.restarts < knobs.preempt_max_restarts
                      and r.start_time is not None and now - r.start_time >= knobs.preempt_min_run_s
                      and (r.queued_s(now) < knobs.promote_s or len(r.node_list) == 1) and r.node_list),
                     key=lambda pair: (-pair[0], pair[1].job_id))
    out: list[Decision] = []
    for remaining_s, victim in victims:
        if len(out) >= knobs.preempt_per_tick or not waiting:
            break
        trial = list(free)
        per_node = victim.gpus // len(victim.node_list)
        for name in victim.node_list:
            if name in index:
                trial[index[name]] += per_node
        packed, saved_s, longest_s = [], 0.0, 0.0
        for job in waiting:
            plan = plans[job.job_id]
            opt = plan.option
            assert opt is not None and plan.start_s is not None
            if opt.run_s * knobs.preempt_ratio > remaining_s:
                continue
            nodes = fits_now(trial, opt.config)
            if nodes is None or sum(trial) - opt.gpus < unplaced:
                continue
            for node in nodes:
                trial[node] -= opt.config.gpus_per_node
            packed.append(job)
            saved_s += plan.start_s - now
            longest_s = max(longest_s, opt.run_s)
        saved_s += queue_share_s(victim.gpus * longest_s, queued - len(packed), total_gpus)
        lost_s = longest_s + restart_cost_s(victim, profiles[victim.job_id], estimator, now)
        if not packed or saved_s < (1 + knobs.preempt_margin) * lost_s:
            continue
        if victim.queued_s(now) + (1 + knobs.preempt_margin) * lost_s > knobs.preempt_wait_share * knobs.wait_bound_s:
            continue  # the victim's own wait bound comes first
        queued -= len(packed)
        free[:] = trial
        for job in packed:
            plan = plans[job.job_id]
            plans[job.job_id] = Plan(plan.option, now, "start now on GPUs freed by requeueing job %d"
                                      % victim.job_id)
        waiting = [j for j in waiting if j not in packed]
        out.append(Decision(victim.job_id, requeue=True, site_factor=0,
                            reason="requeued for %d shorter jobs: they save %.0f s of waiting, it loses %.0f s"
                            % (len(packed), saved_s, lost_s)))
    return out

def queue_share_s(gpu_s: float, queued: int, total_gpus: int) -> float:
    """The waiting, summed over ``queued`` jobs of a saturated queue, that ``gpu_s``
    GPU-seconds make or save: the queue drains that much later or sooner, by
    ``gpu_s / total_gpus`` for each of them."""
    return gpu_s * queued / max(total_gpus, 1)

def restart_cost_s(job: Job, profile: JobProfile, estimator: EstimatorProtocol, now: float) -> float:
    """What a requeue costs a job besides waiting: its startup, and the work since its
    last checkpoint (``lost_work_s``)."""
    return float(estimator.startup_s(profile)) + lost_work_s(job, profile, estimator, now)

def lost_work_s(job: Job, profile: JobProfile, estimator: EstimatorProtocol, now: float) -> float:
    """The work a requeue loses: since the last checkpoint, half a save interval on
    average, at most what the job ran since its last start."""
    config = current_config(job, profile)
    iter_s = float(estimator.run_time_s(profile, config, 1) - estimator.run_time_s(profile, config, 0))
    ran_s = now - (job.start_time if job.start_time is not None else now)
    return min(ran_s, 0.5 * (profile.plan.save_interval or 0) * iter_s)

def idle_reserve(knobs: PipeSwiftKnobs, view: ClusterView) -> int:
    """GPUs a reshape leaves idle for new jobs when nobody waits."""
    return int(knobs.expand_reserve_fraction * view.total_gpus)

def reshapes(knobs: PipeSwiftKnobs, view: ClusterView, profiles: Mapping[int, JobProfile], estimator: EstimatorProtocol,
              free: list[int], reserve: int, shorter_than_s: float = math.inf,
              skip: Collection[int] = (), queued: int = 0, queued_gpu_s: float = 0.0) -> list[Decision]:
    """Requeue a running flexible job into a bigger shape when that is predicted to
    finish it sooner than continuing by more than the switch cost times (1 +
    reshape_margin). The new run counts its startup and the work since the job's last
    checkpoint (``lost_work_s``); a job without checkpoints would start over and is
    never reshaped. The new shape must fit now on whole nodes (``free``: GPUs free per
    node after this tick's starts, updated here) plus the job's own GPUs: a requeued job
    that cannot restart at once would be planned again, often smaller. ``reserve`` GPUs
    stay idle for new jobs. Shortest predicted remaining first; jobs in ``skip`` (this
    tick's preemption victims) are left alone, and the new run must be shorter than
    ``shorter_than_s``. With ``queued`` jobs waiting (``queued_gpu_s``: their work, each
    at its fewest GPU-seconds), the GPU-seconds the new run takes beyond the old one's,
    as far as the queue's work would have used them, count as the waiting they add to
    the queue (``queue_share_s``), as if the new run were that much longer: on a week of
    thousands of short jobs, growing one 1.6 x faster on twice the GPUs delays every job
    behind it (issue 24, b436b2 day 42). A job requeued ``preempt_max_restarts`` times
    is not requeued again, for a reshape either."""
    now, out = view.now, []
    index = {n.name: i for i, n in enumerate(view.nodes)}
    ends = {j.job_id: predicted_end_s(j, profiles, estimator, now) for j in view.running}
    for job in sorted(view.running, key=lambda j: (ends[j.job_id], j.job_id)):
        idle_gpus = sum(free) - reserve
        profile = profiles.get(job.job_id)
        if job.job_id in skip or profile is None or not profile.flexible or idle_gpus <= 0 or job.start_time is None \
                or not profile.plan.save_interval or job.restarts >= knobs.preempt_max_restarts:
            continue
        config = current_config(job, profile)
        iter_s = max(1e-9, float(estimator.run_time_s(profile, config, 1) - estimator.run_time_s(profile, config, 0)))
        left_s = ends[job.job_id] - now
        redo = math.ceil((left_s + lost_work_s(job, profile, estimator, now)) / iter_s)
        trial = list(free)
        for name in job.node_list:
            if name in index:
                trial[index[name]] += job.gpus // len(job.node_list)
        best: Optional[tuple[float, Any, list[int], float]] = None
        for gpus in range(min(profile.gpu_range[1], job.gpus + idle_gpus), job.gpus, -1):
            offered = estimator.option(profile, gpus)
            nodes = fits_now(trial, offered[0]) if offered is not None else None
            if offered is None or nodes is None:
                continue
            new_s = float(estimator.run_time_s(profile, offered[0], min(redo, profile.plan.iterations)))
            if new_s >= shorter_than_s:
                continue
            # the GPU-seconds the queue loses: beyond the old run's, and only while the
            # queue's own work would still fill the extra GPUs
            taken_gpu_s = min(gpus * new_s - job.gpus * left_s,
                              (gpus - job.gpus) * queued_gpu_s / max(view.total_gpus, 1))
            cost_s = new_s + queue_share_s(max(0.0, taken_gpu_s), queued, view.total_gpus)
            if best is None or cost_s < best[0]:
                best = (cost_s, offered[0], nodes, new_s)
        if best is None or best[0] * (1 + knobs.reshape_margin) >= left_s:
            continue
        _, new_config, nodes, new_s = best
        for node in nodes:
            trial[node] -= new_config.gpus_per_node
        free[:] = trial
        out.append(Decision(job.job_id, requeue=True, config=new_config, site_factor=knobs.site_factor_max,
                            reason="reshape to %d GPUs: %.0f s instead of %.0f s left"
                            % (new_config.gpus, new_s, left_s)))
    return out
