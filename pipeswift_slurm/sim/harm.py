"""Do no harm, measured per job (issue 25, item 4): did a policy run a job slower than its
user's own layout would have run, under the simulator's truth?

Two comparisons, because a user sees two kinds of change:

* **Layout, at the GPU count the job ran on** (``layout_harm``): for every job that ran in a
  layout other than its user's (``megatron_rules.same_layout``), its true run time in the
  config it ran against the true run time of the user's own layout on the same GPU count:
  the config it asked for when it ran on its own count, else the user's layout scaled to
  that count (``megatron_rules.user_layout_at``, what the planner's rule compares with).
  Where the user's layout is not valid on that count (its tp x pp x cp does not divide it),
  the GPU-count change hides the layout change: the job is compared with the user's layout
  on the largest smaller count where it is valid (``user_layout_at_most``, as the planner's
  rule across counts does; ``vs_fewer_gpus`` counts these: a job
  slower there ran slower on more GPUs), and has no comparison (``no_user_layout``) only
  when no smaller count has it either. Both sides are the whole job's true run time
  (``metrics.true_run_s``: the truth's shape factor, the user's favour, and the job's own
  noise draw, the same on both sides, so the ratio is the layouts' alone). Jobs on their
  own count and on another count are counted apart (``same_gpus``, ``other_gpus``).
* **Completion, for jobs resized** (``resized_jct``): a user whose job ran on another GPU
  count calls it "made slower" when it finished later than it would have finished as
  submitted, in the user's layout on the user's count. That counterfactual is the same job
  in the base run (``slurm``: the same workload, the users' own layouts and counts, the
  scheduler sites run today), so the figure is the job's JCT over its JCT there. It holds
  the queue order's effect too (a policy's order can delay a job it did not resize), so it
  is reported beside the layout figure, not folded into it.

"Slower" means beyond ``TOLERANCE_REL`` (2 %): the comparison itself is exact (one truth
for both layouts), but a Megatron job's step time varies by about 1-2 % from run to run
on the same layout and nodes (data loading, the collectives on a shared fabric), so a user
cannot tell a smaller change from the spread of the job's own runs. ``slower_jobs`` counts
every job slower at all, so nothing hides under the tolerance. GPU-hours: the true run-time
difference times the GPUs the job ran on, summed over the jobs slower (``gpu_hours_lost``)
and faster (``gpu_hours_gained``) than in the user's layout. Pure: no I/O.
"""

from __future__ import annotations

import statistics
from typing import Any, Mapping, Optional, Sequence

from pipeswift_slurm.core.megatron_rules import same_layout, user_layout_at_most
from pipeswift_slurm.sim.engine import JobRecord
from pipeswift_slurm.sim.metrics import true_run_s
from pipeswift_slurm.sim.workload import WorkloadJob

TOLERANCE_REL = 0.02


def _tally(pairs: Sequence[tuple[JobRecord, float, float]]) -> dict[str, Any]:
    """Figures of (record, true run s as ran, true run s in the user's layout) pairs."""
    ratios = [(ran / mine, rec.job_id) for rec, ran, mine in pairs]
    delta_h = [(ran - mine) * rec.gpus / 3600.0 for rec, ran, mine in pairs]
    worst = max(ratios, default=None)
    return {
        "jobs": len(pairs),
        "slower_jobs": sum(1 for r, _ in ratios if r > 1.0),
        "slower_beyond_tolerance": sum(1 for r, _ in ratios if r > 1.0 + TOLERANCE_REL),
        "worst_ratio": worst[0] if worst else None,
        "worst_job_id": worst[1] if worst else None,
        "median_ratio": statistics.median(r for r, _ in ratios) if ratios else None,
        "gpu_hours_lost": sum(d for d in delta_h if d > 0),
        "gpu_hours_gained": -sum(d for d in delta_h if d < 0),
    }



def layout_harm(records: Sequence[JobRecord], jobs: Sequence[WorkloadJob], truth: Any,
                gpus_per_node: int) -> dict[str, Any]:
    """The layout comparison of one run (module docstring): {"tolerance_rel", "same_gpus",
    "other_gpus"}, each with ``jobs``, ``slower_jobs``, ``slower_beyond_tolerance``,
    ``worst_ratio`` (true run time as ran / in the user's layout; None: no job relaid out),
    ``worst_job_id``, ``median_ratio``, ``gpu_hours_lost``, ``gpu_hours_gained``;
    ``other_gpus`` also ``vs_fewer_gpus`` and ``no_user_layout`` (module docstring)."""
    by_id = {j.job_id: j for j in jobs}
    same: list[tuple[JobRecord, float, float]] = []
    other: list[tuple[JobRecord, float, float]] = []
    fewer = missing = 0
    for rec in records:
        job = by_id[rec.job_id]
        if job.profile is None or rec.config is None:
            continue
        at_own = rec.gpus == job.profile.requested.gpus
        mine = job.profile.requested if at_own else user_layout_at_most(job.profile, rec.gpus, gpus_per_node)
        if mine is None:
            missing += 1
            continue
        if same_layout(rec.config, mine):
            continue
        fewer += mine.gpus < rec.gpus
        (same if at_own else other).append((rec, true_run_s(job, truth, rec.config), true_run_s(job, truth, mine)))
    return {"tolerance_rel": TOLERANCE_REL, "same_gpus": _tally(same),
            "other_gpus": {**_tally(other), "vs_fewer_gpus": fewer, "no_user_layout": missing}}


def resized_jct(records: Sequence[JobRecord], base: Mapping[int, JobRecord]) -> Optional[dict[str, Any]]:
    """Jobs run on another GPU count than asked, their JCT over their JCT in the base run
    (``base``: map from job_id to the base policy's record): ``jobs``,
    ``slower_beyond_tolerance``, ``worst_ratio``, ``worst_job_id``, ``median_ratio``;
    None when there is no base run."""
    if not base:
        return None
    ratios = sorted((r.jct_s / base[r.job_id].jct_s, r.job_id) for r in records
                    if r.reconfigured and r.job_id in base and base[r.job_id].jct_s > 0)
    return {"jobs": len(ratios),
            "slower_beyond_tolerance": sum(1 for x, _ in ratios if x > 1.0 + TOLERANCE_REL),
            "worst_ratio": ratios[-1][0] if ratios else None,
            "worst_job_id": ratios[-1][1] if ratios else None,
            "median_ratio": statistics.median(x for x, _ in ratios) if ratios else None}
