"""Megatron's validity rules for an ExecConfig on a job, and the enumeration of every
valid config on a GPU count.

Rules follow Megatron-LM ``megatron/training/arguments.py`` (validate_args) and
megatron-core 0.16.1 (TransformerConfig, num_microbatches_calculator, schedules); tests
cross-check them against megatron-core separately. Pure: imports only ``core.model``.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Callable, Iterator, Optional

from pipeswift_slurm.core.model import ExecConfig, JobProfile


def node_shape(gpus: int, gpus_per_node: int) -> tuple[int, int]:
    """Fewest nodes that hold ``gpus`` with an equal count per node: (nodes, gpus per node)."""
    if gpus_per_node <= 0 or gpus <= gpus_per_node:
        return 1, gpus
    for per_node in range(gpus_per_node, 0, -1):  # the most per node that divides: fewest nodes
        if gpus % per_node == 0:
            return gpus // per_node, per_node
    return gpus, 1


@dataclass(frozen=True)
class Problem:
    """Why a config is invalid: the Megatron flag (or job option) at fault and a message."""

    flag: str
    message: str

    def __str__(self) -> str:
        return "%s: %s" % (self.flag, self.message)


def stage_layers(num_layers: int, config: ExecConfig, embedding: bool = False,
                 loss: bool = False) -> Optional[list[int]]:
    """Transformer layers per pipeline rank, or None when the split is invalid (megatron-core
    0.16.1 ``TransformerConfig.__post_init__`` and ``get_num_layers_to_build``).

    Even: layers / pp each. Uneven (``--decoder-first/last-pipeline-num-layers``): the first
    (last) rank holds its given count (>= 1), the other ranks share the rest evenly (at
    least one layer each). ``embedding`` / ``loss`` (``--account-for-embedding/loss-in-
    pipeline-split``, not combinable with first/last): the embedding (loss) counts as one
    more layer, (layers + embedding + loss) / pp per rank, and the first (last) rank builds
    one transformer layer fewer.
    """
    pp = config.pp
    first, last = config.decoder_first_pipeline_num_layers, config.decoder_last_pipeline_num_layers
    if first is None and last is None:
        total = num_layers + embedding + loss
        if total % pp:
            return None
        layers = [total // pp] * pp
        layers[0] -= embedding
        layers[-1] -= loss
        return layers if min(layers) >= 0 else None
    if pp < 2 or embedding or loss:
        return None
    if (first is not None and first < 1) or (last is not None and last < 1):
        return None
    middle_layers = num_layers - (first or 0) - (last or 0)
    middle_stages = pp - (first is not None) - (last is not None)
    if middle_layers < 0 or (middle_stages == 0 and middle_layers) or (
            middle_stages and (middle_layers < middle_stages or middle_layers % middle_stages)):
        return None
    per = middle_layers // middle_stages if middle_stages else 0
    layers = [per] * pp
    if first is not None:
        layers[0] = first
    if last is not None:
        layers[-1] = last
    return layers


def profile_stage_layers(profile: JobProfile, config: ExecConfig) -> Optional[list[int]]:
    """:func:`stage_layers` of ``profile``'s model under ``config``, with the job's own
    embedding/loss accounting."""
    plan = profile.plan
    return stage_layers(profile.shape.num_layers, config, plan.embedding_in_pipeline_split,
                        plan.loss_in_pipeline_split)


def uneven(config: ExecConfig) -> bool:
    """Whether ``config`` sets a first or last stage of its own size."""
    return config.decoder_first_pipeline_num_layers is not None or config.decoder_last_pipeline_num_layers is not None


def _split_problems(profile: JobProfile, cfg: ExecConfig) -> list[Problem]:
    shape, plan = profile.shape, profile.plan
    accounted = plan.embedding_in_pipeline_split or plan.loss_in_pipeline_split
    if uneven(cfg) and accounted:
        return [Problem("--account-for-embedding-in-pipeline-split", "cannot be combined with"
                        " --decoder-first/last-pipeline-num-layers (megatron-core refuses both)")]
    layers = profile_stage_layers(profile, cfg)
    if layers is None:
        flag = "--decoder-first-pipeline-num-layers" if uneven(cfg) else "--pipeline-model-parallel-size"
        extra = " with that first/last split" if uneven(cfg) else (
            " counting the embedding/loss as layers" if accounted else "")
        return [Problem(flag, "%d layers cannot be split over %d pipeline stages%s"
                        % (shape.num_layers, cfg.pp, extra))]
    out = []
    if cfg.vp > 1:
        if cfg.pp < 2:
            out.append(Problem("--num-virtual-stages-per-pipeline-rank", "interleaving needs pp >= 2"))
        per_rank = _interleaved_layers(profile, cfg.pp, layers)
        if any(n % cfg.vp for n in per_rank):
            out.append(Problem("--num-virtual-stages-per-pipeline-rank",
                               "layers per stage %s not divisible by %d virtual stages" % (per_rank, cfg.vp)))
        if cfg.num_micro_batches < cfg.pp or cfg.num_micro_batches % cfg.pp:
            out.append(Problem("--micro-batch-size", "interleaved schedule needs a number of micro-batches"
                               " that is a multiple of pp (M=%d, pp=%d)" % (cfg.num_micro_batches, cfg.pp)))
    return out


def _interleaved_layers(profile: JobProfile, pp: int, layers: list[int]) -> list[int]:
    """The layer counts per rank that interleaving splits into virtual stages (each divisible
    by vp): the ranks' own (``layers``), or their common share with the embedding/loss."""
    plan = profile.plan
    if plan.embedding_in_pipeline_split or plan.loss_in_pipeline_split:
        return [(profile.shape.num_layers + plan.embedding_in_pipeline_split + plan.loss_in_pipeline_split) // pp]
    return layers


def _batch_problems(profile: JobProfile, cfg: ExecConfig) -> list[Problem]:
    out = []
    gbs = profile.plan.global_batch_size
    step = cfg.micro_batch_size * cfg.dp
    if gbs % step:
        out.append(Problem("--global-batch-size", "%d is not divisible by micro batch size %d times data"
                           " parallel size %d" % (gbs, cfg.micro_batch_size, cfg.dp)))
    elif gbs // step != cfg.num_micro_batches:
        out.append(Problem("--micro-batch-size", "number of micro-batches %d != %d/(%d*%d)"
                           % (cfg.num_micro_batches, gbs, cfg.micro_batch_size, cfg.dp)))
    ramp = profile.plan.rampup_batch_size
    if ramp is not None:
        start, inc, samples = ramp
        if start < 1 or inc < 1 or samples < 0 or start > gbs or (gbs - start) % inc:
            out.append(Problem("--rampup-batch-size", "start %d, increment %d must be positive, start at"
                               " most global %d, and (global - start) divisible by increment" % (start, inc, gbs)))
        elif any(b % step for b in range(start, gbs + 1, inc)):
            out.append(Problem("--rampup-batch-size", "an intermediate batch size is not divisible by"
                               " micro batch size %d times dp %d" % (cfg.micro_batch_size, cfg.dp)))
    return out


def _job_limit_problems(profile: JobProfile, cfg: ExecConfig, gpus_per_node: int) -> list[Problem]:
    out = []
    lo, hi = profile.gpu_range
    if not lo <= cfg.gpus <= hi:
        out.append(Problem("--pipeswift-gpus", "%d GPUs outside the allowed range %d-%d" % (cfg.gpus, lo, hi)))
    if cfg.micro_batch_size < profile.min_micro_batch_size:
        out.append(Problem("--pipeswift-min-micro-batch", "micro batch %d below the job's minimum %d"
                           % (cfg.micro_batch_size, profile.min_micro_batch_size)))
    if profile.max_micro_batch_size and cfg.micro_batch_size > profile.max_micro_batch_size:
        out.append(Problem("--micro-batch-size", "micro batch %d above the job's maximum %d"
                           % (cfg.micro_batch_size, profile.max_micro_batch_size)))
    if profile.allowed_pp and cfg.pp not in profile.allowed_pp:
        out.append(Problem("--pipeswift-pp", "pp %d not in the allowed %s" % (cfg.pp, profile.allowed_pp)))
    return out


def check_config(profile: JobProfile, cfg: ExecConfig, gpus_per_node: int = 8,
                 job_limits: bool = True) -> list[Problem]:
    """Every reason Megatron (or the job's own limits) would refuse ``cfg``; [] if valid.

    Rules (Megatron-LM validate_args, megatron-core TransformerConfig and schedules):
    world = tp*pp*cp*dp; heads % tp == 0 and query groups % tp == 0; even layer split
    (layers % pp, counting the embedding/loss when the job does) or a valid uneven
    first/last split (not both); interleaving needs pp >= 2, layers per stage divisible by
    vp, and M a multiple of pp (M >= pp); global batch divisible by
    micro batch * dp, M >= 1; ramp-up steps divisible too; with cp > 1, seq % (2*cp) == 0;
    a tensor-parallel group stays inside a node. ``job_limits`` adds the job's own range,
    minimum micro-batch and allowed pp.
    """
    shape = profile.shape
    out = []
    if min(cfg.tp, cfg.pp, cfg.cp, cfg.dp, cfg.micro_batch_size, cfg.vp) < 1 or cfg.num_micro_batches < 1:
        return [Problem("--micro-batch-size", "sizes must be >= 1 (%s)" % cfg.short())]
    if cfg.num_nodes * cfg.gpus_per_node != cfg.world_size:
        out.append(Problem("--nodes", "%d nodes x %d GPUs != world size %d (tp*pp*cp*dp)"
                           % (cfg.num_nodes, cfg.gpus_per_node, cfg.world_size)))
    if shape.num_attention_heads % cfg.tp:
        out.append(Problem("--tensor-model-parallel-size", "%d attention heads are not divisible by tp %d"
                           % (shape.num_attention_heads, cfg.tp)))
    elif shape.num_query_groups % cfg.tp:
        out.append(Problem("--num-query-groups", "%d query groups are not divisible by tp %d"
                           % (shape.num_query_groups, cfg.tp)))
    if cfg.tp > 1 and (cfg.gpus_per_node % cfg.tp or (gpus_per_node and cfg.tp > gpus_per_node)):
        out.append(Problem("--tensor-model-parallel-size", "tp %d does not fit inside a node of %d GPUs"
                           % (cfg.tp, cfg.gpus_per_node)))
    if cfg.cp > 1 and shape.seq_length % (2 * cfg.cp):
        out.append(Problem("--context-parallel-size", "seq length %d not divisible by 2*cp = %d"
                           % (shape.seq_length, 2 * cfg.cp)))
    out += _split_problems(profile, cfg)
    out += _batch_problems(profile, cfg)
    if job_limits:
        out += _job_limit_problems(profile, cfg, gpus_per_node)
    return out


def _divisors(n: int) -> list[int]:
    small = [d for d in range(1, int(n ** 0.5) + 1) if n % d == 0]
    return sorted(set(small + [n // d for d in small]))


def enumerate_configs(profile: JobProfile, gpus: int, gpus_per_node: int, *, vary_tp: bool = True,
                      max_vp: int = 4, fits: Optional[Callable[[ExecConfig], bool]] = None) -> Iterator[ExecConfig]:
    """All structurally valid configs on exactly ``gpus`` GPUs.

    Keeps the user's context-parallel size and embedding/loss accounting; varies tp (powers
    of two dividing the heads, within a node) when ``vary_tp``, pp over the sizes that divide
    the GPUs, the layer split (even where pp divides the layers, else the best uneven first/last
    split of :func:`uneven_splits`, and the user's own split at the user's pp), micro-batch
    sizes that divide the per-replica batch, and interleaving up to ``max_vp`` virtual
    stages. With a memory predicate ``fits``, only fitting configs are yielded, and larger
    micro-batches are skipped once none fits (activation memory grows with the micro-batch size).
    """
    for base, vps in config_bases(profile, gpus, gpus_per_node, vary_tp=vary_tp, max_vp=max_vp):
        for mbs, m in micro_batch_levels(profile, base):
            found, last_level = level_configs(profile, interleavings(base, mbs, m, vps), gpus_per_node, fits)
            yield from found
            if last_level:
                break


def config_bases(profile: JobProfile, gpus: int, gpus_per_node: int, *, vary_tp: bool = True,
                 max_vp: int = 4) -> Iterator[tuple[ExecConfig, list[int]]]:
    """The layouts :func:`enumerate_configs` varies the micro-batch size of: (a config with
    micro-batch size and count 1, the interleavings its layer split allows, ascending)."""
    user = profile.requested
    nodes, gpn = node_shape(gpus, gpus_per_node)
    tps = _tp_choices(profile, gpn) if vary_tp else [user.tp]
    gbs = profile.plan.global_batch_size
    splits: dict[int, list[tuple[Optional[int], Optional[int], list[int]]]] = {}  # per pp, whatever tp
    for tp in tps:
        for pp in _pp_choices(profile, gpus):
            if gpus % (tp * pp * user.cp) or gbs % (gpus // (tp * pp * user.cp)):
                continue
            if pp not in splits:
                splits[pp] = _splits_with_interleavings(profile, pp, max_vp)
            for first, last, vps in splits[pp]:
                # positional: tp, pp, dp, micro-batch size and count, cp, vp, nodes, GPUs per node, split
                yield ExecConfig(tp, pp, gpus // (tp * pp * user.cp), 1, 1, user.cp, 1, nodes, gpn, first, last), vps


def _splits_with_interleavings(profile: JobProfile, pp: int,
                               max_vp: int) -> list[tuple[Optional[int], Optional[int], list[int]]]:
    """The layer splits over ``pp`` stages that are valid, with the interleavings each allows."""
    out = []
    for first, last in _split_choices(profile, pp):
        layers = profile_stage_layers(profile, ExecConfig(1, pp, 1, 1, 1, 1, 1, 1, 0, first, last))
        if layers is None:
            continue  # check_config refuses every config of this split (_split_problems)
        out.append((first, last, [vp for vp in range(1, max_vp + 1) if vp == 1 or (
            pp >= 2 and not any(n % vp for n in _interleaved_layers(profile, pp, layers)))]))
    return out


def micro_batch_levels(profile: JobProfile, base: ExecConfig) -> list[tuple[int, int]]:
    """(micro-batch size, number of micro-batches) of ``base``'s data-parallel size, the
    sizes dividing the per-replica batch within the job's limits, ascending."""
    gbs, dp = profile.plan.global_batch_size, base.dp
    return [(mbs, gbs // (mbs * dp)) for mbs in _divisors(gbs // dp) if mbs >= profile.min_micro_batch_size
            and not (profile.max_micro_batch_size and mbs > profile.max_micro_batch_size)]


def interleavings(base: ExecConfig, mbs: int, m: int, vps: list[int]) -> list[ExecConfig]:
    """``base`` with ``mbs`` x ``m`` micro-batches at each of ``vps`` (vp > 1: pp >= 2, pp | M)."""
    return [ExecConfig(base.tp, base.pp, base.dp, mbs, m, base.cp, vp, base.num_nodes, base.gpus_per_node,
                       base.decoder_first_pipeline_num_layers, base.decoder_last_pipeline_num_layers)
            for vp in vps if vp == 1 or (base.pp >= 2 and not m % base.pp)]


def level_configs(profile: JobProfile, configs: list[ExecConfig], gpus_per_node: int,
                  fits: Optional[Callable[[ExecConfig], bool]]) -> tuple[list[ExecConfig], bool]:
    """Of one micro-batch size's ``configs``, those check_config accepts (and that ``fits``),
    and whether the size is the last to try (:func:`last_micro_batch`)."""
    valid = [cfg for cfg in configs if not check_config(profile, cfg, gpus_per_node)]
    found = valid if fits is None else [cfg for cfg in valid if fits(cfg)]
    return found, fits is not None and not found and last_micro_batch(profile, valid, gpus_per_node, fits)


def last_micro_batch(profile: JobProfile, configs: list[ExecConfig], gpus_per_node: int,
                     fits: Callable[[ExecConfig], bool]) -> bool:
    """Whether one micro-batch size's ``configs`` end the search of larger ones: some are
    valid but none fits in memory (larger micro-batches need even more)."""
    valid = False
    for cfg in configs:
        if not check_config(profile, cfg, gpus_per_node):
            if fits(cfg):
                return False
            valid = True
    return valid


def uneven_splits(num_layers: int, pp: int) -> list[tuple[Optional[int], Optional[int]]]:
    """(first, last) stage sizes that split ``num_layers`` over ``pp`` stages when pp does not
    divide them: the other stages hold floor or ceil(layers / pp) each, and the first and
    last at most one more than those (Megatron's rules still apply: :func:`stage_layers`).
    Best first: the fewest layers on the fullest stage, then the smallest spread, then the
    fewest on the last (which also computes the logits and the loss)."""
    if pp < 2 or num_layers % pp == 0:
        return []
    out: list[tuple[Optional[int], Optional[int]]] = []
    for middle in sorted({num_layers // pp, -(-num_layers // pp)}):
        if middle < 1:
            continue
        rest = num_layers - middle * (pp - 2)  # first + last
        out += [(f, rest - f) for f in range(max(1, rest - middle - 1), min(middle + 1, rest - 1) + 1)]
        one = num_layers - middle * (pp - 1)  # only the first (or only the last) stage differs
        if 1 <= one <= middle + 1:
            out += [(one, None), (None, one)]
    def rank(split: tuple[Optional[int], Optional[int]]) -> tuple[int, int, int, int]:
        layers = stage_layers(num_layers, ExecConfig(tp=1, pp=pp, dp=1, micro_batch_size=1, num_micro_batches=1,
                                                     decoder_first_pipeline_num_layers=split[0],
                                                     decoder_last_pipeline_num_layers=split[1]))
        return (max(layers), max(layers) - min(layers), layers[-1], -layers[0]) if layers else (num_layers + 1, 0, 0, 0)

    return sorted(set(out), key=lambda fl: (rank(fl), fl[0] or 0, fl[1] or 0))


def _split_choices(profile: JobProfile, pp: int) -> list[tuple[Optional[int], Optional[int]]]:
    user, plan = profile.requested, profile.plan
    if plan.embedding_in_pipeline_split or plan.loss_in_pipeline_split:
        return [(None, None)]  # Megatron takes no first/last split beside it
    splits = uneven_splits(profile.shape.num_layers, pp)[:1] or [(None, None)]  # the best only: planning stays fast
    if uneven(user) and pp == user.pp:
        mine = (user.decoder_first_pipeline_num_layers, user.decoder_last_pipeline_num_layers)
        splits = [mine] + [s for s in splits if s != mine]
    return splits


def _tp_choices(profile: JobProfile, gpn: int) -> list[int]:
    heads, groups = profile.shape.num_attention_heads, profile.shape.num_query_groups
    choices = {profile.requested.tp}
    tp = 1
    while tp <= gpn:
        if heads % tp == 0 and groups % tp == 0 and gpn % tp == 0:
            choices.add(tp)
        tp *= 2
    return sorted(t for t in choices if t <= max(gpn, 1))


def _pp_choices(profile: JobProfile, gpus: int) -> list[int]:
    """Pipeline sizes that divide the GPUs, up to the layers (each stage needs one)."""
    pps = {pp for pp in _divisors(gpus) if pp <= profile.shape.num_layers}
    if profile.allowed_pp:
        pps &= set(profile.allowed_pp)
    return sorted(pps)


def user_layout_at(profile: JobProfile, gpus: int, gpus_per_node: int) -> Optional[ExecConfig]:
    """The user's own layout on ``gpus`` GPUs, as Megatron runs the user's command there: the
    requested tp, pp, cp, interleaving, micro-batch size and stage split, dp = gpus / (tp*pp*cp),
    M = global batch / (micro-batch x dp), on the planner's node shape (:func:`node_shape`);
    None when that is not a valid config (:func:`check_config`, the job's limits included)."""
    user = profile.requested
    group = user.tp * user.pp * user.cp
    if gpus < 1 or gpus % group:
        return None
    dp = gpus // group
    gbs = profile.plan.global_batch_size
    if gbs % (user.micro_batch_size * dp):
        return None
    nodes, gpn = node_shape(gpus, gpus_per_node)
    cfg = replace(user, dp=dp, num_micro_batches=gbs // (user.micro_batch_size * dp), num_nodes=nodes,
                  gpus_per_node=gpn)
    return None if check_config(profile, cfg, gpus_per_node) else cfg


def user_layout_at_most(profile: JobProfile, gpus: int, gpus_per_node: int) -> Optional[ExecConfig]:
    """The user's layout on ``gpus`` GPUs (:func:`user_layout_at`), else on the largest
    smaller count where it is valid; None when no count up to ``gpus`` has it."""
    for count in range(gpus, 0, -1):
        mine = user_layout_at(profile, count, gpus_per_node)
        if mine is not None:
            return mine
    return None


def same_layout(a: ExecConfig, b: ExecConfig) -> bool:
    """Whether ``a`` and ``b`` are one layout, whatever their data-parallel size, number of
    micro-batches and node shape (what a GPU count changes): the same tp, pp, cp,
    interleaving, micro-batch size and stage split."""
    def key(c: ExecConfig) -> tuple[object, ...]:
        return (c.tp, c.pp, c.cp, c.vp, c.micro_batch_size, c.decoder_first_pipeline_num_layers,
                c.decoder_last_pipeline_num_layers)

    return key(a) == key(b)


def config_for_allocation(cfg: ExecConfig, profile: JobProfile, num_nodes: int,
                          gpus_per_node: int) -> tuple[Optional[ExecConfig], str]:
    """The controller's decided ``cfg`` as the launcher runs it in an allocation of
    ``num_nodes`` x ``gpus_per_node``: (config, "") when it fits that allocation and Megatron
    accepts it, else (None, why). The launcher (which config to run) and the history (which
    config ran) both ask this, so the two can never disagree.
    """
    if cfg.gpus_per_node == 0 and cfg.gpus == num_nodes * gpus_per_node:
        cfg = replace(cfg, num_nodes=num_nodes, gpus_per_node=gpus_per_node)
    if (cfg.num_nodes, cfg.gpus_per_node) != (num_nodes, gpus_per_node):
        return None, "stale: %dx%d GPUs decided, %dx%d allocated" % (
            cfg.num_nodes, cfg.gpus_per_node, num_nodes, gpus_per_node)
    problems = check_config(profile, cfg, gpus_per_node)
    if problems:
        return None, "invalid: %s" % problems[0]
    return cfg, ""
