"""A profile request turned into a validated JobProfile: the one place that rule lives.

psbatch (at submission), the controller (every tick), ``explain`` (reading the history)
and the launcher (inside the allocation) all start from the same ``ProfileRequest`` (the
Megatron argv and the user's flexibility, as the profile token carries it) and need the
same JobProfile from it; only what they know of the GPUs differs, which the arguments
say. Pure: imports only the core.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Optional

from pipeswift_slurm.core.megatron import MegatronArgError, profile_from_argv, require_length
from pipeswift_slurm.core.model import JobProfile
from pipeswift_slurm.core.token import ProfileRequest


def request_profile(req: ProfileRequest, *, world_size: Optional[int] = None, gpus_per_node: int = 8,
                    cluster_gpus: Optional[int] = None, allocated: bool = False) -> JobProfile:
    """The JobProfile ``req`` asks for, validated as Megatron would.

    Args:
        req: the request (Megatron argv, GPU range, minimum micro-batch, allowed pp, class).
        world_size: the GPUs the job asks for (or has); the request's own ``world_size``,
            when it carries one, wins unless ``allocated``. None: the argv's tp*pp*cp.
        gpus_per_node: GPUs per node of the job's nodes.
        cluster_gpus: the cluster's GPU count. Given (the controller, ``explain``): the
            request's range is widened to hold the world size and clipped to the cluster.
            None (psbatch): the range is taken as the user wrote it.
        allocated: ``world_size`` is exactly the allocation the job runs in (the launcher):
            the profile is pinned to it, the user's own layout need not fit it (the shape
            and plan are then read at the user's size), and the job need not say its length.

    Raises:
        MegatronArgError: the Megatron arguments are invalid (for a request: at this size,
            or without --train-iters/--train-samples).
    """
    limits = dict(gpus_per_node=gpus_per_node, min_micro_batch_size=req.min_micro_batch_size,
                  allowed_pp=req.allowed_pp, job_class=req.job_class)
    argv = list(req.argv)
    if allocated:
        try:
            profile = profile_from_argv(argv, world_size=world_size, **limits)  # type: ignore[arg-type]
        except MegatronArgError:
            profile = profile_from_argv(argv, **limits)  # type: ignore[arg-type]
        return replace(profile, min_gpus=world_size or profile.requested.gpus,
                       max_gpus=world_size or profile.requested.gpus)
    world = req.world_size or world_size
    gpu_range = req.gpus
    if cluster_gpus is not None:
        lo, hi = req.gpus or (world, world)
        gpu_range = (max(1, min(lo, world)), min(max(hi, world), cluster_gpus or hi))  # type: ignore[type-var, arg-type]
    return require_length(profile_from_argv(argv, world_size=world, gpu_range=gpu_range,  # type: ignore[arg-type]
                                            **limits))
