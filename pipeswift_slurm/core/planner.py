"""Planner: every valid config for a job on a GPU count (or a range), ranked by predicted
iteration time, with the reason each excluded config was excluded on request.

Uses megatron_rules.enumerate_configs for Megatron's rules and CostModel for time and memory.
Results per (job shape and plan, GPU count) are memoised on the Planner instance, so a
controller or simulator that keeps one Planner pays for each shape once. Pure: no I/O.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Optional

from pipeswift_slurm.core.costmodel import CostModel, Estimate, per_profile
from pipeswift_slurm.core.megatron_rules import Problem, check_config, enumerate_configs
from pipeswift_slurm.core.model import ExecConfig, JobProfile


@dataclass(frozen=True)
class Excluded:
    """A config (or a whole GPU count when ``config`` is None) that was ruled out, and why."""

    gpus: int
    config: Optional[ExecConfig]
    reason: str


@dataclass(frozen=True)
class PlanResult:
    """Ranked valid configs (fastest iteration first) and, when asked, the excluded ones."""

    ranked: list[Estimate]
    excluded: list[Excluded]


def _plan_key(profile: JobProfile) -> tuple[object, ...]:
    """What the ranking depends on: everything but the training length."""
    user = profile.requested
    return (profile.shape, replace(profile.plan, train_iters=None, train_samples=None), profile.gpu_range,
            profile.min_micro_batch_size, profile.max_micro_batch_size, profile.allowed_pp,
            user.tp, user.cp, user.pp, user.decoder_first_pipeline_num_layers,
            user.decoder_last_pipeline_num_layers)


class Planner:
    """Ranks configs of a job per GPU count on one cluster shape.

    Args:
        cost: the cost model (GPU type and schedule).
        gpus_per_node: GPUs per node of the cluster.
        vary_tp: also search tensor-parallel sizes (else keep the user's).
        max_vp: largest interleaving (virtual stages per rank) considered.
    """

    def __init__(self, cost: CostModel, gpus_per_node: int, vary_tp: bool = True, max_vp: int = 4):
        self.cost = cost
        self.gpus_per_node = gpus_per_node
        self.vary_tp = vary_tp
        self.max_vp = max_vp
        self._ranked: dict[tuple[object, ...], list[Estimate]] = {}
        self._keys: dict[int, tuple[JobProfile, tuple[object, ...]]] = {}

    def _key(self, profile: JobProfile) -> tuple[object, ...]:
        """The plan key, memoised per profile object."""
        return per_profile(self._keys, profile, _plan_key)

    def ranked(self, profile: JobProfile, gpus: int) -> list[Estimate]:
        """Valid configs on exactly ``gpus`` GPUs that fit in memory, fastest first."""
        key = (self._key(profile), gpus)
        hit = self._ranked.get(key)
        if hit is None:
            hit = sorted((e for e in self._estimates(profile, gpus) if e.fits),
                         key=lambda e: (e.iter_time_s, e.mem_gib, e.config))
            self._ranked[key] = hit
        return hit

    def best(self, profile: JobProfile, gpus: int) -> Optional[Estimate]:
        """The fastest valid config on ``gpus`` GPUs, or None when none is valid."""
        ranked = self.ranked(profile, gpus)
        return ranked[0] if ranked else None

    def _estimates(self, profile: JobProfile, gpus: int) -> list[Estimate]:
        lo, hi = profile.gpu_range
        if not lo <= gpus <= hi:
            return []
        configs = enumerate_configs(profile, gpus, self.gpus_per_node, vary_tp=self.vary_tp, max_vp=self.max_vp,
                                    fits=lambda c: self.cost.fits(profile, c))
        return [self.cost.estimate(profile, c) for c in configs]

    def plan(self, profile: JobProfile, lo: int, hi: int, explain: bool = False) -> PlanResult:
        """All valid configs for ``lo``..``hi`` GPUs, ranked by predicted iteration time.

        With ``explain``, also every config the search considered and refused (Megatron
        rule, job limit or memory), and GPU counts with no valid config at all.
        """
        ranked: list[Estimate] = []
        excluded: list[Excluded] = []
        for gpus in range(lo, hi + 1):
            ranked.extend(self.ranked(profile, gpus))
            if explain:
                excluded.extend(self.explain_exclusions(profile, gpus))
        ranked.sort(key=lambda e: (e.iter_time_s, e.config.gpus, e.config))
        return PlanResult(ranked, excluded)

    def explain_exclusions(self, profile: JobProfile, gpus: int) -> list[Excluded]:
        """Why configs on ``gpus`` GPUs were refused (or why the count has none)."""
        out: list[Excluded] = []
        wide = replace(profile, min_gpus=gpus, max_gpus=gpus)
        for cfg in _raw_grid(wide, gpus, self.gpus_per_node, self.max_vp):
            problems: list[Problem] = check_config(wide, cfg, self.gpus_per_node)
            if problems:
                out.append(Excluded(gpus, cfg, "; ".join(str(p) for p in problems)))
                continue
            est = self.cost.estimate(profile, cfg)
            if not est.fits:
                out.append(Excluded(gpus, cfg, "needs %.1f GiB per GPU, %s has %.1f GiB"
                                    % (est.mem_gib, self.cost.gpu.name, self.cost.gpu.mem_gib)))
        lo, hi = profile.gpu_range
        if not lo <= gpus <= hi:
            out.insert(0, Excluded(gpus, None, "outside the job's allowed range %d-%d GPUs" % (lo, hi)))
        elif not out and not self.ranked(profile, gpus):
            out.append(Excluded(gpus, None, "no tp*pp*dp factorisation of %d GPUs divides the global batch %d"
                                % (gpus, profile.plan.global_batch_size)))
        return out


def _raw_grid(profile: JobProfile, gpus: int, gpus_per_node: int, max_vp: int) -> list[ExecConfig]:
    """The candidates the search looks at, before Megatron's rules: tp (powers of two up to a
    node), pp (up to the layer count), the integral dp, mbs dividing the per-replica batch."""
    from pipeswift_slurm.core.megatron_rules import node_shape

    nodes, gpn = node_shape(gpus, gpus_per_node)
    user, gbs = profile.requested, profile.plan.global_batch_size
    out = []
    tps = sorted({user.tp} | {1 << i for i in range(8) if (1 << i) <= max(gpn, 1)})
    for tp in tps:
        for pp in range(1, min(profile.shape.num_layers, gpus) + 1):
            if gpus % (tp * pp * user.cp):
                continue
            dp = gpus // (tp * pp * user.cp)
            per_replica = max(1, gbs // dp)
            for mbs in sorted({1, user.micro_batch_size, per_replica}):
                m = max(1, gbs // (mbs * dp))
                for vp in range(1, max_vp + 1):
                    out.append(ExecConfig(tp=tp, pp=pp, dp=dp, micro_batch_size=mbs, num_micro_batches=m,
                                          cp=user.cp, vp=vp, num_nodes=nodes, gpus_per_node=gpn))
    return out
