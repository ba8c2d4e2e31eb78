"""The site's limits, applied by the controller to whatever a policy decides.

Slurm exempts values an admin sets from partition, QOS and association checks, and the
controller runs as an admin: a raised TimeLimit or a wider job would pass unchecked. So
every job's request is clipped to its ``SiteCaps`` before planning (``gpu_cap``), and every
decision is checked against them before it is applied (``within_site_limits``), with
SiteFactor kept in the range Slurm accepts. Policies need not know any of it.
"""

from __future__ import annotations

import logging
from dataclasses import replace

from pipeswift_slurm.core.estimator import EstimatorProtocol
from pipeswift_slurm.core.model import Decision, Job, JobProfile
from pipeswift_slurm.policy.knobs import SITE_FACTOR_LIMIT

log = logging.getLogger(__name__)


def gpu_cap(job: Job, gpus_per_node: int, cluster_gpus: int) -> int:
    """The most GPUs ``job`` may be given: the cluster's, its QOS/association GPU limit and,
    with ``gpus_per_node``, its node limit (0: no GPUs at all)."""
    cap = cluster_gpus
    if job.caps.max_gpus is not None:
        cap = min(cap, job.caps.max_gpus) if cap else job.caps.max_gpus
    if job.caps.max_nodes is not None and gpus_per_node > 0:
        by_nodes = job.caps.max_nodes * gpus_per_node
        cap = min(cap, by_nodes) if cap else by_nodes
    return cap


def within_site_limits(decision: Decision, job: Job) -> tuple[Decision, str]:
    """``decision`` kept within ``job.caps``, and why it was changed ('' when it was not).

    A new shape over the GPU or node limit is dropped (the job keeps its size); so is one
    whose rescaled TimeLimit would pass the time limit (at that size it would be killed
    before it ends); a TimeLimit alone is lowered to the limit; SiteFactor is clipped to
    what Slurm accepts.
    """
    caps, why = job.caps, []
    config, limit = decision.config, decision.time_limit_s
    if config is not None:
        if caps.max_gpus is not None and config.gpus > caps.max_gpus:
            why.append("%d GPUs is over the limit of %d" % (config.gpus, caps.max_gpus))
        elif caps.max_nodes is not None and config.num_nodes > caps.max_nodes:
            why.append("%d nodes is over the limit of %d" % (config.num_nodes, caps.max_nodes))
        elif caps.max_time_s is not None and limit is not None and limit > caps.max_time_s:
            why.append("it would need a time limit of %d s, over the limit of %d s" % (limit, caps.max_time_s))
        if why:
            config, limit = None, None
    if limit is not None and caps.max_time_s is not None and limit > caps.max_time_s:
        why.append("time limit %d s lowered to the limit of %d s" % (limit, caps.max_time_s))
        limit = caps.max_time_s
    factor = decision.site_factor
    if factor is not None and abs(factor) > SITE_FACTOR_LIMIT:
        why.append("SiteFactor %d clipped to +-%d" % (factor, SITE_FACTOR_LIMIT))
        factor = max(-SITE_FACTOR_LIMIT, min(SITE_FACTOR_LIMIT, factor))
    if not why:
        return decision, ""
    if decision.config is not None and config is None:
        why[0] = "not resized: " + why[0]
    return replace(decision, config=config, time_limit_s=limit, site_factor=factor), "; ".join(why)


def within_time_limit(profile: JobProfile, job: Job, estimator: EstimatorProtocol,
                      user_factor: float = 1.0) -> JobProfile:
    """``profile`` with a ``run_time_factor``: the job's user's correction (``user_factor``,
    >= 1: ``slurm/calibrate.user_factors``), then capped so that the predicted run time at
    the job's present size stays within the job's own time limit (Slurm ends it there
    whatever it claims); ``profile`` itself when that changes nothing. Other sizes scale
    alike, so a resize still rescales the limit as before."""
    factor = max(1.0, user_factor)
    if job.time_limit_s:
        config = job.config if job.config is not None and job.config.gpus == job.gpus else profile.requested
        # the prediction without this job's factor (which scales every run time of the job):
        # a profile made anew at every tick would be planned from scratch at every tick
        predicted = estimator.run_time_s(profile, config) / profile.run_time_factor
        if predicted * factor > job.time_limit_s > 0:
            factor = job.time_limit_s / predicted
    return profile if factor == profile.run_time_factor else replace(profile, run_time_factor=factor)
