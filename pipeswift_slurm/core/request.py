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
from pipeswift_slurm.core.token import ProfileRequest, TokenError

# GPU counts in a request are user text too: past the largest clusters, they only cost the
# planner time (a prime world size of 10^9 kept node_shape busy for 30 s).
MAX_GPUS = 131_072


def request_profile(req: ProfileRequest, *, world_size: Optional[int] = None, gpus_per_node: int = 8,
                    cluster_gpus: Optional[int] = None, allocated: bool = False) -> JobProfile:
    """The JobProfile ``req`` asks for, validated as Megatron would.

    Args:
        req: the request (Megatron argv, GPU range, minimum micro-batch, allowed pp). A
            ``class=`` in it is not used: the class keys calibration, so it is derived from
            the model shape (``default_job_class``), never chosen by the user (who could
            otherwise dodge or poison the correction of their own jobs' run times).
        world_size: the GPUs the job asks for (or has); the request's own ``world_size``,
            when it carries one, wins unless ``allocated``. None: the argv's tp*pp*cp.
        gpus_per_node: GPUs per node of the job's nodes.
        cluster_gpus: the cluster's GPU count. Given (the controller, ``explain``): the
            request's range is clipped to the cluster. None (psbatch): taken as written.
        allocated: ``world_size`` is exactly the allocation the job runs in (the launcher):
            the profile is pinned to it, the user's own layout need not fit it (the shape
            and plan are then read at the user's size), and the job need not say its length.

    Raises:
        MegatronArgError: the Megatron arguments are invalid (for a request: at this size,
            or without --train-iters/--train-samples).
    """
    argv = list(req.argv)
    for what, count in (("world size", world_size), ("recorded world size", req.world_size),
                        ("GPU range", max(req.gpus or (0, 0)))):
        if count is not None and count > MAX_GPUS:
            raise MegatronArgError("--pipeswift-gpus", "%s %d is beyond any cluster (at most %d)"
                                   % (what, count, MAX_GPUS))

    def parse(world: Optional[int], gpu_range: Optional[tuple[int, int]] = None) -> JobProfile:
        return profile_from_argv(argv, world_size=world, gpus_per_node=gpus_per_node, gpu_range=gpu_range,
                                 min_micro_batch_size=req.min_micro_batch_size, allowed_pp=req.allowed_pp)

    if allocated:
        try:
            profile = parse(world_size)
        except MegatronArgError:
            profile = parse(None)
        pinned = world_size or profile.requested.gpus
        return replace(profile, min_gpus=pinned, max_gpus=pinned)
    # The size the user submitted, as psbatch recorded it: a job the controller resized has
    # another size now, and the user's own layout need not fit that one.
    world = req.world_size or world_size
    gpu_range = req.gpus
    if cluster_gpus and gpu_range is not None:
        # the user's range, as asked, clipped to the cluster (never widened: "gpus=16" on a
        # 4-GPU submission means 16)
        hi = min(gpu_range[1], cluster_gpus)
        gpu_range = (min(gpu_range[0], hi), hi)
    profile = require_length(parse(world, gpu_range))
    return replace(profile, partitions=req.partitions) if req.partitions else profile


def submitted_profile(req: ProfileRequest, submitted_gpus: int, *, gpus_per_node: int,
                      cluster_gpus: Optional[int]) -> JobProfile:
    """The profile the controller plans a job by (``explain`` re-reads it the same way):
    ``req`` read at the size the job was submitted with (``submitted_gpus``: Slurm's, or the
    controller's own record in the AdminComment, ``token.submitted_gpus``). The size the
    request records (``world=``, user text) is never taken for it: a request that records
    another size is refused (TokenError)."""
    if req.world_size is not None and req.world_size != submitted_gpus:
        raise TokenError("world=%d, but the job was submitted with %d GPUs" % (req.world_size, submitted_gpus))
    return request_profile(req, world_size=submitted_gpus, gpus_per_node=gpus_per_node, cluster_gpus=cluster_gpus)
