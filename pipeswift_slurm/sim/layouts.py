"""The layout a simulated user runs a job with (``Conversion.layouts`` in sim/workload.py):

* ``user``: the zoo's default for the model (tp, pp, micro-batch), the rest data
  parallelism: a hand-picked layout, often slower than the best;
* ``expert``: what a tuned recipe would run: the planner's best config for the same model
  on the job's own GPU count (``Planner.best``, the ranking the policy uses at a fixed GPU
  count). The recorded duration still defines the work as for ``user``: the iterations
  come from this config's iteration time, so it reproduces the recorded duration and the
  offered load is the same; a policy then gains nothing by changing the config at the
  job's own GPU count.

Pure: imports only core.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Optional, Sequence

from pipeswift_slurm.core.costmodel import CostModel
from pipeswift_slurm.core.megatron_render import render_args
from pipeswift_slurm.core.model import JobProfile
from pipeswift_slurm.core.planner import Planner

LAYOUTS = ("user", "expert")


def own_layout(profile: JobProfile, layouts: str, cost: CostModel, gpus_per_node: int,
               planner: Optional[Planner] = None) -> JobProfile:
    """``profile`` (rigid on its GPU count, the zoo's layout) with the user's own config for
    ``layouts``: itself for ``user``; for ``expert`` the planner's best on its GPU count
    (``planner``: share one over a workload so each model is ranked once; default a new one)."""
    if layouts != "expert":
        return profile
    best = (planner or Planner(cost, gpus_per_node)).best(profile, profile.requested.gpus)
    return replace(profile, requested=best.config) if best is not None else profile


def own_argv(argv: Sequence[str], profile: JobProfile, layouts: str) -> list[str]:
    """The zoo's command line ``argv`` with ``profile``'s own config for ``layouts`` (the
    layout flags rewritten for ``expert``; ``user`` keeps the zoo's line as it is)."""
    return render_args(argv, profile.requested, profile) if layouts == "expert" else list(argv)
