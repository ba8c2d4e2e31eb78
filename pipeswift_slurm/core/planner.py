"""Planner: every valid config for a job on a GPU count (or a range), ranked by predicted
iteration time, with the reason each excluded config was excluded on request.

Uses megatron_rules.enumerate_configs for Megatron's rules and CostModel for time and memory.
``Planner.choose`` is the config to run on a GPU count, for the policies and the launcher
alike: the fastest, unless the user's own layout is as fast within the error band
(:func:`keep_user_layout`, "do no harm"); ``Planner.offer`` is the
same rule across GPU counts, for the policies, which choose the count.
Results per (job shape and plan, GPU count) are memoised on the Planner instance, so a
controller or simulator that keeps one Planner pays for each shape once; jobs that differ
only in GPU range, length or checkpoint interval share them. A cron tick starts with an
empty Planner, so the fastest config alone (``best``, what ``choose`` needs) does not rank:
it estimates in full only the candidates whose pipeline time is within the fastest found.
Pure: no I/O.
"""

from __future__ import annotations

import heapq
import itertools
import math
from dataclasses import dataclass, fields, replace
from operator import attrgetter
from typing import Any, Callable, Optional, Sequence

from pipeswift_slurm.core.costmodel import CostModel, Estimate
from pipeswift_slurm.core.megatron_rules import (Problem, check_config, config_bases, enumerate_configs,
                                                interleavings, last_micro_batch, micro_batch_levels,
                                                user_layout_at, user_layout_at_most)
from pipeswift_slurm.core.memo import per_profile
from pipeswift_slurm.core.model import ExecConfig, JobProfile, TrainingPlan


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


# what the ranking reads of a TrainingPlan: all but the training length and the checkpoint interval
_PLAN_FIELDS = attrgetter(*(f.name for f in fields(TrainingPlan)
                            if f.name not in ("train_iters", "train_samples", "save_interval")))


def _plan_key(profile: JobProfile) -> tuple[object, ...]:
    """What the ranking on a GPU count inside the job's range depends on: everything but
    the training length, the checkpoint interval and the range itself."""
    user = profile.requested
    return (profile.shape, _PLAN_FIELDS(profile.plan),
            profile.min_micro_batch_size, profile.max_micro_batch_size, profile.allowed_pp,
            user.tp, user.cp, user.pp, user.decoder_first_pipeline_num_layers,
            user.decoder_last_pipeline_num_layers)


def _in_range(profile: JobProfile, gpus: int) -> bool:
    lo, hi = profile.gpu_range
    return lo <= gpus <= hi


# true / predicted iteration time of a config as the site measured it (the calibration's
# learned layout terms, ``layout_fit.layout_factor``); None: no such terms (every factor 1)
LayoutFactor = Optional[Callable[[ExecConfig], float]]


def keep_user_layout(user: Optional[Estimate], best: Optional[Estimate],
                     factor: LayoutFactor = None) -> Optional[Estimate]:
    """Do no harm: of the user's own layout on a GPU count (``user``, None where it is not
    valid there) and the fastest layout there (``best``), the one to run. The fastest
    replaces the user's only when its predicted gain, 1 - best / user iteration time, exceeds
    the larger of the two layouts' error bands (``Estimate.band``): each prediction may be off
    by its band, and layouts of one job on one GPU type err alike (the bands come from
    systematic errors per layout group), so the wider band bounds how wrong their ratio is.
    With ``factor`` (what the site's runs taught about each layout), the ratio is corrected
    by what was measured, only ever toward the user's layout: a user's layout measured
    faster than the model says is kept where the model alone would replace it, while a
    learned term (itself a noisy estimate) never makes a bet the model alone would not. A
    user's layout that does not fit in memory is always replaced."""
    if user is None or not user.fits or best is None:
        return best
    if best.config == user.config:
        return user
    ratio = best.iter_time_s / user.iter_time_s
    if factor is not None:
        ratio *= max(1.0, factor(best.config) / factor(user.config))
    return best if 1.0 - ratio > max(user.band.rel, best.band.rel) else user


class Planner:
    """Ranks configs of a job per GPU count on one cluster shape.

    Args:
        cost: the cost model (GPU type and schedule).
        gpus_per_node: GPUs per node of the cluster.
        vary_tp: also search tensor-parallel sizes (else keep the user's).
        max_vp: largest interleaving (virtual stages per rank) considered.
        do_no_harm: ``choose`` keeps the user's layout unless the fastest gains more than
            the error band (:func:`keep_user_layout`); off: ``choose`` is ``best``.
    """

    def __init__(self, cost: CostModel, gpus_per_node: int, vary_tp: bool = True, max_vp: int = 4,
                 do_no_harm: bool = True):
        self.cost = cost
        self.gpus_per_node = gpus_per_node
        self.vary_tp = vary_tp
        self.max_vp = max_vp
        self.do_no_harm = do_no_harm
        self._ranked: dict[tuple[int, int], list[Estimate]] = {}
        self._mine: dict[tuple[int, int, int, int], Optional[Estimate]] = {}  # the user's layout on a count
        self._mine_below: dict[tuple[int, int, int, int, int], Optional[Estimate]] = {}  # ... at most a count
        self._best: dict[tuple[int, int], Optional[Estimate]] = {}
        self._offers: dict[tuple[int, int, int, int, int, int], tuple[tuple[int, Estimate], ...]] = {}
        self._key_ids: dict[tuple[object, ...], int] = {}
        self._keys: dict[int, tuple[Any, int]] = {}

    def _key(self, profile: JobProfile) -> int:
        """The plan key as a small number (equal keys, equal numbers), memoised per profile
        object: hashing the key's nested dataclasses on every call would be slow."""
        return per_profile(self._keys, profile, lambda p: self._key_ids.setdefault(_plan_key(p), len(self._key_ids)))

    def ranked(self, profile: JobProfile, gpus: int) -> list[Estimate]:
        """Valid configs on exactly ``gpus`` GPUs that fit in memory, fastest first."""
        if not _in_range(profile, gpus):
            return []
        key = (self._key(profile), gpus)
        hit = self._ranked.get(key)
        if hit is None:
            hit = sorted((e for e in self._estimates(profile, gpus) if e.fits),
                         key=lambda e: (e.iter_time_s, e.mem_gib, e.config))
            self._ranked[key] = hit
        return hit

    def best(self, profile: JobProfile, gpus: int) -> Optional[Estimate]:
        """The fastest valid config on ``gpus`` GPUs (``ranked``'s first), or None when none
        is valid. Without the ranking at hand, only the configs whose pipeline time alone
        (a lower bound of the iteration time) is within the fastest found so far are
        estimated in full."""
        if not _in_range(profile, gpus):
            return None
        key = (self._key(profile), gpus)
        ranked = self._ranked.get(key)
        if ranked is not None:
            return ranked[0] if ranked else None
        if key not in self._best:
            self._best[key] = self._search_best(profile, gpus)
        return self._best[key]

    def _search_best(self, profile: JobProfile, gpus: int) -> Optional[Estimate]:
        """``ranked(profile, gpus)[0]`` without ranking. Best first by pipeline time, a lower
        bound of the iteration time: layouts (``megatron_rules.config_bases``) by a floor of
        their pipeline time (``CostModel.pipeline_floor_s``), each one's candidates (its
        micro-batch sizes up to the last that fits, as ``enumerate_configs``) added to the
        queue once the floor is reached; candidates checked (valid, fits) and estimated in
        order until the queue's and the layouts' bounds pass the fastest found."""
        def fits(cfg: ExecConfig) -> bool:
            return self.cost.fits(profile, cfg)

        bases: list[tuple[float, int, ExecConfig, list[int], list[tuple[int, int]]]] = []
        for base, vps in config_bases(profile, gpus, self.gpus_per_node, vary_tp=self.vary_tp, max_vp=self.max_vp):
            levels = micro_batch_levels(profile, base)
            if levels:
                bases.append((self.cost.pipeline_floor_s(profile, base, levels, vps[-1]), len(bases), base, vps, levels))
        bases.sort(reverse=True)  # by floor; the index is unique, configs are never compared
        queue: list[tuple[float, int, ExecConfig]] = []
        order = itertools.count()  # ties in the queue go first in, first out; configs are never compared
        found: Optional[Estimate] = None
        while bases or queue:
            bound = min(bases[-1][0] if bases else math.inf, queue[0][0] if queue else math.inf)
            if found is not None and bound > found.iter_time_s:
                break  # iteration time >= pipeline time >= bound: none of the rest can be faster
            if bases and bases[-1][0] == bound:
                _, _, base, vps, levels = bases.pop()
                for mbs, m in levels:
                    configs = interleavings(base, mbs, m, vps)
                    if last_micro_batch(profile, configs, self.gpus_per_node, fits):
                        break
                    for cfg in configs:
                        heapq.heappush(queue, (self.cost.pipeline_s(profile, cfg)[0], next(order), cfg))
                continue
            cfg = heapq.heappop(queue)[2]
            if check_config(profile, cfg, self.gpus_per_node) or not fits(cfg):
                continue
            est = self.cost.estimate(profile, cfg)
            if found is None or (est.iter_time_s, est.mem_gib, est.config) < (found.iter_time_s, found.mem_gib,
                                                                              found.config):
                found = est
        return found

    def choose(self, profile: JobProfile, gpus: int, factor: LayoutFactor = None) -> Optional[Estimate]:
        """The config to run on ``gpus`` GPUs: the fastest (``best``), unless the user's own
        layout there (``megatron_rules.user_layout_at``) is within the error band of it
        (:func:`keep_user_layout`, with the site's learned ``factor`` when given); None when
        no config is valid."""
        best = self.best(profile, gpus)
        if not self.do_no_harm or best is None:
            return best
        user = profile.requested
        key = (self._key(profile), user.micro_batch_size, user.vp, gpus)
        if key not in self._mine:
            mine = user_layout_at(profile, gpus, self.gpus_per_node)
            self._mine[key] = None if mine is None else self.cost.estimate(profile, mine)
        return keep_user_layout(self._mine[key], best, factor)

    def offer(self, profile: JobProfile, gpus: int, factor: LayoutFactor = None) -> Optional[Estimate]:
        """What a policy may run on ``gpus`` GPUs: ``choose``, or None where the count enters
        only through a layout change that the band does not back. On a count where the user's
        layout is not valid (another tp x pp x cp does not divide it), any config is another
        layout, which ``choose`` cannot weigh against the user's there; it is offered only
        when it beats the user's layout on the largest smaller count where that is valid
        (``user_layout_at_most``, fewer GPUs) by more than the band (:func:`keep_user_layout`),
        else that smaller count serves the job with fewer GPUs and no bet. A count with no
        user's layout at or below it (a shrink below the user's smallest) is offered as is.
        ``factor``: the site's learned layout terms (``choose``)."""
        if not self.do_no_harm:
            return self.best(profile, gpus)
        user = profile.requested
        # the user's layout is looked for down to the job's smallest count: part of the key
        key = (self._key(profile), user.micro_batch_size, user.vp, gpus, profile.gpu_range[0])
        chosen = self.choose(profile, gpus, factor)
        if chosen is None:
            return None
        if key not in self._mine_below:
            mine = user_layout_at_most(profile, gpus, self.gpus_per_node)
            self._mine_below[key] = None if mine is None else self.cost.estimate(profile, mine)
        below = self._mine_below[key]
        if below is None or below.config.gpus == gpus:
            return chosen
        return chosen if keep_user_layout(below, chosen, factor) is chosen else None

    def offers(self, profile: JobProfile, lo: int, hi: int,
               factor: LayoutFactor = None) -> tuple[tuple[int, Estimate], ...]:
        """(GPU count, ``offer``) for every count from ``lo`` to ``hi`` that offers one,
        ascending; memoised (``offers_key``) without ``factor``, so the jobs of one shape and
        range share one search and one tuple."""
        key = self.offers_key(profile, lo, hi)
        hit = self._offers.get(key) if factor is None else None
        if hit is None:
            found = ((gpus, self.offer(profile, gpus, factor)) for gpus in range(key[4], key[5] + 1))
            hit = tuple((gpus, est) for gpus, est in found if est is not None)
            if factor is None:
                self._offers[key] = hit
        return hit

    def offers_key(self, profile: JobProfile, lo: int, hi: int) -> tuple[int, int, int, int, int, int]:
        """Equal for profiles whose ``offers(profile, lo, hi)`` are equal: the plan key, the
        user's micro-batch size and interleaving, the job's smallest count, and the range
        within the job's."""
        user = profile.requested
        return (self._key(profile), user.micro_batch_size, user.vp, profile.gpu_range[0],
                max(lo, profile.gpu_range[0]), min(hi, profile.gpu_range[1]))

    def _estimates(self, profile: JobProfile, gpus: int) -> list[Estimate]:
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
        elif not self.ranked(profile, gpus):
            out.append(Excluded(gpus, None, self.why_none(profile, gpus).text()))
        return out

    def why_none(self, profile: JobProfile, gpus: int) -> NoLayout:
        """Why no config runs on exactly ``gpus`` GPUs: outside the job's range, Megatron's
        rules (which ones excluded every tp x pp x dp split), or memory (some split is
        valid, none fits). Meaningful only when ``ranked(profile, gpus)`` is empty."""
        lo, hi = profile.gpu_range
        if not lo <= gpus <= hi:
            return NoLayout("range", ("outside the job's allowed range %d-%d GPUs" % (lo, hi),))
        wide = replace(profile, min_gpus=gpus, max_gpus=gpus)
        rules: dict[str, str] = {}
        least_gib: Optional[float] = None
        # vp 1 only: interleaving is optional, so its own rules never exclude a GPU count
        for cfg in _raw_grid(wide, gpus, self.gpus_per_node, 1):
            problems = check_config(wide, cfg, self.gpus_per_node)
            for problem in problems:
                rules.setdefault(problem.flag, rule_words(problem, profile))
            if not problems:
                mem_gib = self.cost.estimate(profile, cfg).mem_gib
                least_gib = mem_gib if least_gib is None else min(least_gib, mem_gib)
        if least_gib is not None:
            return NoLayout("memory", ("%s has %.0f GiB per GPU" % (self.cost.gpu.name, self.cost.gpu.mem_gib),),
                            least_gib)
        return NoLayout("rules", tuple(rules.values()) or ("no tp x pp x dp split of %d GPUs" % gpus,))


@dataclass(frozen=True)
class NoLayout:
    """Why a GPU count has no layout: ``kind`` is "range", "rules" or "memory"; ``reasons``
    name the rules (or the limit) in words that do not depend on the count; ``least_gib``
    is the memory per GPU the smallest valid layout needs (kind "memory")."""

    kind: str
    reasons: tuple[str, ...]
    least_gib: float = 0.0

    def text(self) -> str:
        if self.kind == "memory":
            return "memory: the smallest valid layout needs %.1f GiB per GPU, %s" % (
                self.least_gib, self.reasons[0])
        if self.kind == "rules":
            return "every tp x pp x dp split breaks a Megatron rule: %s" % "; ".join(self.reasons)
        return self.reasons[0]


def rule_words(problem: Problem, profile: JobProfile) -> str:
    """The rule behind ``problem`` in words that hold for every split of the job."""
    shape, plan = profile.shape, profile.plan
    words = {
        "--global-batch-size": "global batch %d not divisible by micro-batch x data-parallel size"
                               % plan.global_batch_size,
        "--pipeline-model-parallel-size": "%d layers not divisible by the pipeline size" % shape.num_layers,
        "--decoder-first-pipeline-num-layers": "the first/last layer split does not fit the pipeline size",
        "--num-query-groups": "%d query groups not divisible by the tensor size" % shape.num_query_groups,
        "--context-parallel-size": "sequence length %d not divisible by 2 x the context-parallel size"
                                   % shape.seq_length,
        "--pipeswift-pp": "pipeline sizes limited to %s" % (profile.allowed_pp,),
        "--pipeswift-min-micro-batch": "micro-batch at least %d" % profile.min_micro_batch_size,
    }
    if problem.flag == "--tensor-model-parallel-size":
        return ("%d attention heads not divisible by the tensor size" % shape.num_attention_heads
                if "heads" in problem.message else "a tensor-parallel group must fit inside a node")
    return words.get(problem.flag, str(problem))


def no_layout_groups(planner: Planner, profile: JobProfile, counts: Sequence[int]) -> list[tuple[list[int], str]]:
    """The GPU counts of ``counts`` that have no layout, grouped by cause: [(counts, why)],
    in the order first seen; a memory cause quotes the least memory over its counts."""
    groups: dict[tuple[str, tuple[str, ...]], tuple[list[int], float]] = {}
    for gpus in counts:
        if planner.ranked(profile, gpus):
            continue
        why = planner.why_none(profile, gpus)
        found, least = groups.get((why.kind, why.reasons), ([], math.inf))
        groups[(why.kind, why.reasons)] = (found + [gpus], min(least, why.least_gib or math.inf))
    return [(found, NoLayout(kind, reasons, least if kind == "memory" else 0.0).text())
            for (kind, reasons), (found, least) in groups.items()]


def describe_no_layout(planner: Planner, profile: JobProfile, counts: Sequence[int]) -> list[str]:
    """One line per cause, e.g. "no valid layout on 3, 5 GPUs: every tp x pp x dp split
    breaks a Megatron rule: 8 layers not divisible by the pipeline size; ..."."""
    return ["no valid layout on %s GPUs: %s" % (", ".join(str(g) for g in found), why)
            for found, why in no_layout_groups(planner, profile, counts)]


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
