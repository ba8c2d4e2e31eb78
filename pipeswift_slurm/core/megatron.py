"""Megatron-LM command lines: parse them into a JobProfile, check an ExecConfig against
Megatron's own validity rules, and render a config back into the argument list.

This is the only module that knows Megatron flag spelling. Rules follow Megatron-LM
``megatron/training/arguments.py`` (validate_args) and megatron-core 0.16.1
(TransformerConfig, num_microbatches_calculator, schedules). Pure: no I/O, and it
never imports torch or megatron (tests cross-check against megatron-core separately).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Callable, Iterable, Iterator, Optional, Sequence

from pipeswift_slurm.core.model import ExecConfig, JobProfile, ModelShape, TrainingPlan

# flag -> kind. "int", "bool" (store_true), "str", "int3" (three integers).
FLAGS: dict[str, str] = {
    "--num-layers": "int", "--hidden-size": "int", "--num-attention-heads": "int",
    "--ffn-hidden-size": "int", "--kv-channels": "int", "--seq-length": "int",
    "--max-position-embeddings": "int", "--vocab-size": "int", "--swiglu": "bool",
    "--group-query-attention": "bool", "--num-query-groups": "int",
    "--make-vocab-size-divisible-by": "int",
    "--tensor-model-parallel-size": "int", "--pipeline-model-parallel-size": "int",
    "--num-layers-per-virtual-pipeline-stage": "int",
    "--num-virtual-stages-per-pipeline-rank": "int",
    "--decoder-first-pipeline-num-layers": "int", "--decoder-last-pipeline-num-layers": "int",
    "--context-parallel-size": "int", "--sequence-parallel": "bool",
    "--micro-batch-size": "int", "--global-batch-size": "int", "--rampup-batch-size": "int3",
    "--train-iters": "int", "--train-samples": "int", "--recompute-granularity": "str",
    "--recompute-activations": "bool", "--recompute-method": "str",
    "--use-distributed-optimizer": "bool", "--bf16": "bool", "--fp16": "bool",
    "--model-parallel-size": "int", "--pipeline-model-parallel-layout": "str",
    "--untie-embeddings-and-output-weights": "bool",
    # checkpointing: whether a requeued job resumes, and how much work it loses
    "--save": "path", "--load": "path", "--save-interval": "int",
}
REQUIRED_SHAPE_FLAGS = ("--num-layers", "--hidden-size", "--num-attention-heads", "--seq-length")


class MegatronArgError(ValueError):
    """A Megatron argument that is malformed or contradicts another; names the flag."""

    def __init__(self, flag: str, message: str):
        super().__init__("%s: %s" % (flag, message))
        self.flag = flag


@dataclass(frozen=True)
class ParsedArgs:
    """Known flags found in an argv (flag -> value) and where each occurs (flag -> index)."""

    values: dict[str, object]
    positions: dict[str, int]


def _split(arg: str) -> tuple[str, Optional[str]]:
    if arg.startswith("--") and "=" in arg:
        flag, _, value = arg.partition("=")
        return flag, value
    return arg, None


def _to_int(flag: str, text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise MegatronArgError(flag, "%r is not an integer" % text) from None


def _width(kind: Optional[str], inline: Optional[str]) -> int:
    """How many argv items a flag occupies (itself plus its separate values)."""
    if kind is None or kind == "bool" or inline is not None:
        return 1
    return 4 if kind == "int3" else 2


def parse_argv(argv: Sequence[str]) -> ParsedArgs:
    """Find the known Megatron flags in ``argv`` (``--flag value`` or ``--flag=value``).

    Unknown arguments are skipped untouched. A repeated flag keeps its last value, as
    argparse does.

    Raises:
        MegatronArgError: a known flag without its value, or a value of the wrong type.
    """
    values: dict[str, object] = {}
    positions: dict[str, int] = {}
    i = 0
    while i < len(argv):
        flag, inline = _split(argv[i])
        kind = FLAGS.get(flag)
        width = _width(kind, inline)
        if kind is not None:
            positions[flag] = i
            values[flag] = _flag_value(flag, kind, inline, list(argv[i + 1:i + width]))
        i += width
    return ParsedArgs(values, positions)


def _flag_value(flag: str, kind: str, inline: Optional[str], items: list[str]) -> object:
    if kind == "bool":
        if inline is not None:
            raise MegatronArgError(flag, "takes no value (got %r)" % inline)
        return True
    if kind == "int3" and inline is not None:
        raise MegatronArgError(flag, "expects 3 values separated by spaces")
    if inline is not None:
        items = [inline]
    nargs = 3 if kind == "int3" else 1
    if len(items) < nargs or any(x.startswith("--") for x in items):
        raise MegatronArgError(flag, "expects %d value%s" % (nargs, "s" if nargs > 1 else ""))
    if kind == "int":
        return _to_int(flag, items[0])
    if kind == "int3":
        return tuple(_to_int(flag, x) for x in items)
    return items[0]


def _positive(values: dict[str, object], flag: str) -> Optional[int]:
    value = values.get(flag)
    if value is None:
        return None
    assert isinstance(value, int)
    if value < 1:
        raise MegatronArgError(flag, "must be >= 1 (got %d)" % value)
    return value


def shape_from_args(values: dict[str, object]) -> ModelShape:
    """Build the model shape, applying Megatron's defaults for ffn, kv channels and groups.

    Raises:
        MegatronArgError: a required shape flag is missing or the shape is inconsistent.
    """
    for flag in REQUIRED_SHAPE_FLAGS:
        if flag not in values:
            raise MegatronArgError(flag, "is required (the model shape cannot be known without it)")
    layers, hidden = _positive(values, "--num-layers"), _positive(values, "--hidden-size")
    heads, seq = _positive(values, "--num-attention-heads"), _positive(values, "--seq-length")
    assert layers and hidden and heads and seq
    swiglu = bool(values.get("--swiglu"))
    kv = _positive(values, "--kv-channels")
    if kv is None:
        if hidden % heads:
            raise MegatronArgError("--num-attention-heads", "hidden size %d is not divisible by %d heads"
                                   % (hidden, heads))
        kv = hidden // heads
    ffn = _positive(values, "--ffn-hidden-size")
    if ffn is None:
        ffn = int(8 * hidden / 3 / 64) * 64 if swiglu else 4 * hidden
    groups = heads
    if values.get("--group-query-attention"):
        groups = _positive(values, "--num-query-groups") or 1
        if heads % groups:
            raise MegatronArgError("--num-query-groups", "%d heads are not divisible by %d groups"
                                   % (heads, groups))
    max_pos = _positive(values, "--max-position-embeddings") or seq
    if max_pos < seq:
        raise MegatronArgError("--max-position-embeddings", "%d is smaller than --seq-length %d"
                               % (max_pos, seq))
    return ModelShape(num_layers=layers, hidden_size=hidden, num_attention_heads=heads,
                      seq_length=seq, ffn_hidden_size=ffn, kv_channels=kv, num_query_groups=groups,
                      vocab_size=_positive(values, "--vocab-size") or 50257, swiglu=swiglu,
                      max_position_embeddings=max_pos,
                      make_vocab_size_divisible_by=_positive(values, "--make-vocab-size-divisible-by") or 128)


def plan_from_args(values: dict[str, object], micro_batch_size: int, dp: int) -> TrainingPlan:
    """Build the training plan (global batch, length, precision, memory savers).

    Raises:
        MegatronArgError: both or neither of --train-iters/--train-samples, bad ramp-up.
    """
    iters, samples = _positive(values, "--train-iters"), _positive(values, "--train-samples")
    if iters is not None and samples is not None:
        raise MegatronArgError("--train-samples", "give only one of --train-iters and --train-samples")
    gbs = _positive(values, "--global-batch-size") or micro_batch_size * dp
    if values.get("--bf16") and values.get("--fp16"):
        raise MegatronArgError("--fp16", "cannot be combined with --bf16")
    precision = "bf16" if values.get("--bf16") else "fp16" if values.get("--fp16") else "fp32"
    recompute = values.get("--recompute-granularity")
    if recompute is None and values.get("--recompute-activations"):
        recompute = "selective"
    if recompute not in (None, "full", "selective"):
        raise MegatronArgError("--recompute-granularity", "must be 'full' or 'selective' (got %r)" % recompute)
    rampup = values.get("--rampup-batch-size")
    save_interval = _positive(values, "--save-interval")
    resumes = bool(values.get("--save")) and bool(values.get("--load")) and save_interval is not None
    return TrainingPlan(global_batch_size=gbs, train_iters=iters, train_samples=samples,
                        rampup_batch_size=rampup, precision=precision,  # type: ignore[arg-type]
                        use_distributed_optimizer=bool(values.get("--use-distributed-optimizer")),
                        recompute_granularity=recompute,
                        sequence_parallel=bool(values.get("--sequence-parallel")),
                        save_interval=save_interval if resumes else None)


def _vp_from_args(values: dict[str, object], layers: int, pp: int) -> int:
    per_stage = values.get("--num-layers-per-virtual-pipeline-stage")
    stages = values.get("--num-virtual-stages-per-pipeline-rank")
    if per_stage is not None and stages is not None:
        raise MegatronArgError("--num-virtual-stages-per-pipeline-rank",
                               "cannot be combined with --num-layers-per-virtual-pipeline-stage")
    if per_stage is not None:
        assert isinstance(per_stage, int)
        if per_stage < 1 or layers % pp or (layers // pp) % per_stage:
            raise MegatronArgError("--num-layers-per-virtual-pipeline-stage",
                                   "%d layers per stage (%d layers / pp %d) are not divisible by %d"
                                   % (layers // pp, layers, pp, per_stage))
        return (layers // pp) // per_stage
    if stages is not None:
        assert isinstance(stages, int)
        if stages < 1:
            raise MegatronArgError("--num-virtual-stages-per-pipeline-rank", "must be >= 1")
        return stages
    return 1


def profile_from_argv(argv: Sequence[str], *, world_size: Optional[int] = None,
                      gpus_per_node: int = 8, gpu_range: Optional[tuple[int, int]] = None,
                      min_micro_batch_size: Optional[int] = None,
                      allowed_pp: Optional[tuple[int, ...]] = None, job_class: str = "") -> JobProfile:
    """Parse a Megatron command line into a JobProfile and check the user's config.

    Args:
        argv: the training command (unknown arguments are ignored).
        world_size: GPUs the user's job runs on; default tp*pp*cp (data-parallel size 1).
        gpus_per_node: GPUs per node of the target cluster.
        gpu_range: (min, max) GPUs the user allows; default rigid at world_size.
        min_micro_batch_size: smallest micro-batch allowed; default 1 (the global batch stays
            fixed, so the micro-batch size does not change the learning trajectory).
        allowed_pp: pipeline sizes allowed; default any.
        job_class: calibration key; default derived from the model shape.

    Raises:
        MegatronArgError: a malformed flag, a missing shape flag, or a user config that
            Megatron itself would refuse (the message names the flag).
    """
    values = parse_argv(argv).values
    if "--model-parallel-size" in values:
        raise MegatronArgError("--model-parallel-size", "is obsolete; use --tensor-model-parallel-size")
    shape = shape_from_args(values)
    tp = _positive(values, "--tensor-model-parallel-size") or 1
    pp = _positive(values, "--pipeline-model-parallel-size") or 1
    cp = _positive(values, "--context-parallel-size") or 1
    mbs = _positive(values, "--micro-batch-size") or 1
    world = world_size or tp * pp * cp
    if world % (tp * pp * cp):
        raise MegatronArgError("--tensor-model-parallel-size", "world size %d is not divisible by tp*pp*cp = %d"
                               % (world, tp * pp * cp))
    dp = world // (tp * pp * cp)
    plan = plan_from_args(values, mbs, dp)
    if plan.iterations == 0 and plan.train_iters is None and plan.train_samples is None:
        plan = replace(plan, train_iters=None)
    vp = _vp_from_args(values, shape.num_layers, pp)
    nodes, gpn = node_shape(world, gpus_per_node)
    requested = ExecConfig(tp=tp, pp=pp, dp=dp, micro_batch_size=mbs,
                           num_micro_batches=max(1, plan.global_batch_size // (mbs * dp)), cp=cp, vp=vp,
                           num_nodes=nodes, gpus_per_node=gpn,
                           decoder_first_pipeline_num_layers=values.get("--decoder-first-pipeline-num-layers"),  # type: ignore[arg-type]
                           decoder_last_pipeline_num_layers=values.get("--decoder-last-pipeline-num-layers"))  # type: ignore[arg-type]
    lo, hi = gpu_range or (world, world)
    profile = JobProfile(shape=shape, plan=plan, requested=requested,
                         min_micro_batch_size=min_micro_batch_size or 1, min_gpus=lo, max_gpus=hi,
                         allowed_pp=allowed_pp, job_class=job_class or default_job_class(shape))
    problems = check_config(profile, requested, gpus_per_node, job_limits=False)
    if problems:
        raise MegatronArgError(problems[0].flag, problems[0].message)
    return profile


def require_length(profile: JobProfile) -> JobProfile:
    """``profile``, when it says how long the job trains: PipeSwift plans jobs by their
    length (the controller and psbatch opt in only such jobs; ``estimate`` and ``plan``
    work without it).

    Raises:
        MegatronArgError: neither --train-iters nor --train-samples.
    """
    if not profile.plan.iterations:
        raise MegatronArgError("--train-iters", "neither it nor --train-samples is given (Megatron needs one,"
                               " and PipeSwift plans a job by its length)")
    return profile


def default_job_class(shape: ModelShape) -> str:
    """Calibration key: model family (gpt / gpt-swiglu / gpt-gqa) and size bucket (B params)."""
    family = "gpt" + ("-swiglu" if shape.swiglu else "") + (
        "-gqa" if shape.num_query_groups != shape.num_attention_heads else "")
    billions = shape.num_params / 1e9
    for bucket in (0.5, 2, 8, 20, 80, 200):
        if billions < bucket:
            return "%s-<%gB" % (family, bucket)
    return family + "->200B"


def node_shape(gpus: int, gpus_per_node: int) -> tuple[int, int]:
    """Fewest nodes that hold ``gpus`` with an equal count per node: (nodes, gpus per node)."""
    if gpus_per_node <= 0 or gpus <= gpus_per_node:
        return 1, gpus
    for nodes in range(-(-gpus // gpus_per_node), gpus + 1):
        if gpus % nodes == 0 and gpus // nodes <= gpus_per_node:
            return nodes, gpus // nodes
    return gpus, 1


# ---------------------------------------------------------------- validity


@dataclass(frozen=True)
class Problem:
    """Why a config is invalid: the Megatron flag (or job option) at fault and a message."""

    flag: str
    message: str

    def __str__(self) -> str:
        return "%s: %s" % (self.flag, self.message)


def stage_layers(num_layers: int, config: ExecConfig) -> Optional[list[int]]:
    """Layers per pipeline rank, or None when the split is invalid (Megatron's rules)."""
    pp = config.pp
    first, last = config.decoder_first_pipeline_num_layers, config.decoder_last_pipeline_num_layers
    if first is None and last is None:
        return [num_layers // pp] * pp if num_layers % pp == 0 else None
    if pp < 2:
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


def _split_problems(shape: ModelShape, cfg: ExecConfig) -> list[Problem]:
    out = []
    layers = stage_layers(shape.num_layers, cfg)
    uneven = cfg.decoder_first_pipeline_num_layers is not None or cfg.decoder_last_pipeline_num_layers is not None
    if layers is None:
        flag = "--decoder-first-pipeline-num-layers" if uneven else "--pipeline-model-parallel-size"
        out.append(Problem(flag, "%d layers cannot be split over %d pipeline stages%s"
                           % (shape.num_layers, cfg.pp, " with that first/last split" if uneven else "")))
        return out
    if cfg.vp > 1:
        if cfg.pp < 2:
            out.append(Problem("--num-virtual-stages-per-pipeline-rank", "interleaving needs pp >= 2"))
        if any(n % cfg.vp for n in layers):
            out.append(Problem("--num-virtual-stages-per-pipeline-rank",
                               "layers per stage %s not divisible by %d virtual stages" % (layers, cfg.vp)))
        if cfg.num_micro_batches < cfg.pp or cfg.num_micro_batches % cfg.pp:
            out.append(Problem("--micro-batch-size", "interleaved schedule needs a number of micro-batches"
                               " that is a multiple of pp (M=%d, pp=%d)" % (cfg.num_micro_batches, cfg.pp)))
    return out


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
    (layers % pp) or a valid uneven first/last split; interleaving needs pp >= 2, layers
    per stage divisible by vp, and M a multiple of pp (M >= pp); global batch divisible by
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
    out += _split_problems(shape, cfg)
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

    Keeps the user's context-parallel size and uneven-split choice; varies tp (powers of
    two dividing the heads, within a node) when ``vary_tp``, pp over divisors of the
    layers (or the user's uneven split at the user's pp), micro-batch sizes that divide
    the per-replica batch, and interleaving up to ``max_vp`` virtual stages. With a
    memory predicate ``fits``, only fitting configs are yielded, and larger micro-batches
    are skipped once none fits (activation memory grows with the micro-batch size).
    """
    user = profile.requested
    nodes, gpn = node_shape(gpus, gpus_per_node)
    tps = _tp_choices(profile, gpn) if vary_tp else [user.tp]
    gbs = profile.plan.global_batch_size
    uneven_user = user.decoder_first_pipeline_num_layers is not None or user.decoder_last_pipeline_num_layers is not None
    for tp in tps:
        for pp in _pp_choices(profile):
            if gpus % (tp * pp * user.cp) or gbs % (gpus // (tp * pp * user.cp)):
                continue
            dp = gpus // (tp * pp * user.cp)
            base = ExecConfig(tp=tp, pp=pp, dp=dp, micro_batch_size=1, num_micro_batches=1, cp=user.cp,
                              num_nodes=nodes, gpus_per_node=gpn,
                              decoder_first_pipeline_num_layers=user.decoder_first_pipeline_num_layers
                              if uneven_user and pp == user.pp else None,
                              decoder_last_pipeline_num_layers=user.decoder_last_pipeline_num_layers
                              if uneven_user and pp == user.pp else None)
            yield from _micro_batch_variants(profile, base, gpus_per_node, max_vp, fits)


def _micro_batch_variants(profile: JobProfile, base: ExecConfig, gpus_per_node: int, max_vp: int,
                          fits: Optional[Callable[[ExecConfig], bool]]) -> Iterator[ExecConfig]:
    gbs, layers = profile.plan.global_batch_size, profile.shape.num_layers
    for mbs in _divisors(gbs // base.dp):
        if mbs < profile.min_micro_batch_size or (profile.max_micro_batch_size and mbs > profile.max_micro_batch_size):
            continue
        m = gbs // (mbs * base.dp)
        any_fit = False
        for vp in range(1, max_vp + 1):
            if vp > 1 and (base.pp < 2 or m % base.pp or layers % (base.pp * vp)):
                continue
            cfg = replace(base, micro_batch_size=mbs, num_micro_batches=m, vp=vp)
            if check_config(profile, cfg, gpus_per_node):
                continue
            if fits is not None and not fits(cfg):
                continue
            any_fit = True
            yield cfg
        if fits is not None and not any_fit and mbs >= profile.min_micro_batch_size:
            valid = [vp for vp in range(1, max_vp + 1) if not check_config(profile, replace(
                base, micro_batch_size=mbs, num_micro_batches=m, vp=vp), gpus_per_node)]
            if valid:
                return  # valid but out of memory: larger micro-batches need even more


def _tp_choices(profile: JobProfile, gpn: int) -> list[int]:
    heads, groups = profile.shape.num_attention_heads, profile.shape.num_query_groups
    choices = {profile.requested.tp}
    tp = 1
    while tp <= gpn:
        if heads % tp == 0 and groups % tp == 0 and gpn % tp == 0:
            choices.add(tp)
        tp *= 2
    return sorted(t for t in choices if t <= max(gpn, 1))


def _pp_choices(profile: JobProfile) -> list[int]:
    pps = set(_divisors(profile.shape.num_layers))
    if profile.requested.decoder_first_pipeline_num_layers is not None or \
            profile.requested.decoder_last_pipeline_num_layers is not None:
        pps.add(profile.requested.pp)
    if profile.allowed_pp:
        pps &= set(profile.allowed_pp)
    return sorted(pps)


# ---------------------------------------------------------------- rendering


def _config_flags(argv: Sequence[str], profile: Optional[JobProfile], cfg: ExecConfig) -> dict[str, object]:
    """Flag -> new value (None = remove; True = present switch) for ``cfg``."""
    values = parse_argv(argv).values
    flags: dict[str, object] = {
        "--tensor-model-parallel-size": cfg.tp,
        "--pipeline-model-parallel-size": cfg.pp,
        "--micro-batch-size": cfg.micro_batch_size,
        "--decoder-first-pipeline-num-layers": cfg.decoder_first_pipeline_num_layers,
        "--decoder-last-pipeline-num-layers": cfg.decoder_last_pipeline_num_layers,
    }
    if cfg.cp > 1 or "--context-parallel-size" in values:
        flags["--context-parallel-size"] = cfg.cp
    gbs = profile.plan.global_batch_size if profile else values.get("--global-batch-size")
    flags["--global-batch-size"] = gbs or cfg.micro_batch_size * cfg.dp * cfg.num_micro_batches
    if cfg.vp > 1 and "--num-layers-per-virtual-pipeline-stage" in values and profile:
        layers = stage_layers(profile.shape.num_layers, cfg) or [0]
        flags["--num-layers-per-virtual-pipeline-stage"] = layers[0] // cfg.vp
        flags["--num-virtual-stages-per-pipeline-rank"] = None
    else:
        flags["--num-layers-per-virtual-pipeline-stage"] = None
        flags["--num-virtual-stages-per-pipeline-rank"] = cfg.vp if cfg.vp > 1 else None
    if cfg.tp == 1 and values.get("--sequence-parallel"):
        flags["--sequence-parallel"] = None  # Megatron forces it off with tp == 1
    return flags


def render_args(argv: Sequence[str], cfg: ExecConfig, profile: Optional[JobProfile] = None) -> list[str]:
    """Rewrite the parallel-layout flags of ``argv`` for ``cfg``.

    Existing flags are replaced in place (``--flag value`` and ``--flag=value`` both keep
    their form), flags that no longer apply are removed, missing ones are appended at
    the end; every other argument keeps its text and order. The global batch size stays
    as the user set it.
    """
    wanted = _config_flags(argv, profile, cfg)
    out: list[str] = []
    done: set[str] = set()
    i = 0
    while i < len(argv):
        flag, inline = _split(argv[i])
        width = _width(FLAGS.get(flag), inline)
        if flag in wanted:
            value = wanted[flag]
            if value is not None and flag not in done:
                out.extend(_emit(flag, value, inline is not None))
            done.add(flag)
        else:
            out.extend(argv[i:i + width])
        i += width
    for flag, value in wanted.items():
        if flag not in done and value is not None:
            out.extend(_emit(flag, value, False))
    return out


def _emit(flag: str, value: object, inline: bool) -> list[str]:
    if value is True:
        return [flag]
    return ["%s=%s" % (flag, value)] if inline else [flag, str(value)]


def render_config_args(cfg: ExecConfig) -> list[str]:
    """The parallel-layout flags of ``cfg`` alone (for display and fresh command lines)."""
    return render_args([], cfg)


def iter_flag_names() -> Iterable[str]:
    return FLAGS.keys()
