"""Megatron-LM command lines in: the flag table, argv parsing, and the JobProfile a
command line describes (shape, training plan, the user's config, checked).

The three ``megatron*`` modules are the only ones that know Megatron flag spelling: this
one reads argv, ``megatron_rules`` holds the validity rules and the config enumeration,
``megatron_render`` writes a config back into argv. Defaults follow Megatron-LM
``megatron/training/arguments.py``. Pure: imports only ``core.model`` and
``core.megatron_rules``; never torch or megatron.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Optional, Sequence

from pipeswift_slurm.core.megatron_rules import check_config, node_shape
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
    "--account-for-embedding-in-pipeline-split": "bool", "--account-for-loss-in-pipeline-split": "bool",
    "--context-parallel-size": "int", "--sequence-parallel": "bool",
    "--micro-batch-size": "int", "--global-batch-size": "int", "--rampup-batch-size": "int3",
    "--train-iters": "int", "--train-samples": "int", "--recompute-granularity": "str",
    "--recompute-activations": "bool", "--recompute-method": "str",
    "--use-distributed-optimizer": "bool", "--bf16": "bool", "--fp16": "bool",
    "--model-parallel-size": "int", "--pipeline-model-parallel-layout": "str",
    "--untie-embeddings-and-output-weights": "bool",
    "--overlap-grad-reduce": "bool", "--overlap-param-gather": "bool", "--tp-comm-overlap": "bool",
    # checkpointing: whether a requeued job resumes, and how much work it loses
    "--save": "path", "--load": "path", "--save-interval": "int",
    # read only to refuse the job (``NOT_MODELLED``)
    "--num-experts": "int", "--expert-model-parallel-size": "int", "--expert-tensor-parallel-size": "int",
}
# Flags of models whose valid layouts depend on what the planner does not model: a job with
# one is never relaid out (psbatch submits it as written, the controller does not plan it),
# since a layout the rules here call valid could be one Megatron refuses (mixture-of-experts:
# the expert-parallel sizes must divide the data-parallel ranks, experts the expert ranks).
NOT_MODELLED = {
    "--num-experts": "mixture-of-experts models are not modelled (expert parallelism constrains their layouts)",
    "--expert-model-parallel-size": "expert parallelism is not modelled",
    "--expert-tensor-parallel-size": "expert parallelism is not modelled",
}
REQUIRED_SHAPE_FLAGS = ("--num-layers", "--hidden-size", "--num-attention-heads", "--seq-length")

# The largest value each integer flag may take. Arguments are user text that the controller
# (running as the Slurm admin) reads every tick: a number past any real model (a world size
# of 10^9, a batch of 10^18, 10^300 iterations) would cost seconds of arithmetic or overflow
# a float, so it is refused, naming the flag, like any other invalid argument. The limits are
# orders of magnitude above the largest published runs (Llama 3.1 405B: 126 layers, hidden
# 16384, 16,384 GPUs, global batch 2,048 at 8,192 tokens).
MAX_INT_DIGITS = 15
INT_LIMITS: dict[str, int] = {
    "--num-layers": 10_000, "--hidden-size": 1_000_000, "--ffn-hidden-size": 10_000_000,
    "--kv-channels": 1_000_000, "--num-attention-heads": 100_000, "--num-query-groups": 100_000,
    "--seq-length": 100_000_000, "--max-position-embeddings": 100_000_000, "--vocab-size": 100_000_000,
    "--make-vocab-size-divisible-by": 1_000_000,
    "--tensor-model-parallel-size": 65_536, "--pipeline-model-parallel-size": 65_536,
    "--context-parallel-size": 65_536, "--model-parallel-size": 65_536,
    "--num-layers-per-virtual-pipeline-stage": 10_000, "--num-virtual-stages-per-pipeline-rank": 10_000,
    "--decoder-first-pipeline-num-layers": 10_000, "--decoder-last-pipeline-num-layers": 10_000,
    "--micro-batch-size": 100_000_000, "--global-batch-size": 100_000_000, "--rampup-batch-size": 100_000_000,
    "--train-iters": 10_000_000_000, "--train-samples": 10_000_000_000_000, "--save-interval": 10_000_000_000,
    "--num-experts": 1_000_000, "--expert-model-parallel-size": 65_536, "--expert-tensor-parallel-size": 65_536,
}


class MegatronArgError(ValueError):
    """A Megatron argument that is malformed or contradicts another; names the flag."""

    def __init__(self, flag: str, message: str):
        super().__init__("%s: %s" % (flag, message))
        self.flag = flag
        self.not_modelled = flag in NOT_MODELLED  # valid for Megatron, not planned here


@dataclass(frozen=True)
class ParsedArgs:
    """Known flags found in an argv (flag -> value) and where each occurs (flag -> index)."""

    values: dict[str, object]
    positions: dict[str, int]


def split_flag(arg: str) -> tuple[str, Optional[str]]:
    """``--flag=value`` -> (flag, value); anything else -> (arg, None)."""
    if arg.startswith("--") and "=" in arg:
        flag, _, value = arg.partition("=")
        return flag, value
    return arg, None


def _to_int(flag: str, text: str) -> int:
    """A whole number written in ASCII digits (``int()`` also reads ``+2``, ``1_000``,
    Arabic or fullwidth digits: argparse in Megatron would read those differently or not at
    all), within the flag's limit."""
    digits = text[1:] if text.startswith("-") else text
    if not digits or len(digits) > MAX_INT_DIGITS or not all("0" <= c <= "9" for c in digits):
        raise MegatronArgError(flag, "%r is not a whole number written in digits 0-9" % text[:40])
    value = int(text)
    limit = INT_LIMITS.get(flag, 10 ** MAX_INT_DIGITS)
    if abs(value) > limit:
        raise MegatronArgError(flag, "%d is beyond any real run (at most %d)" % (value, limit))
    return value


def flag_width(kind: Optional[str], inline: Optional[str]) -> int:
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
        flag, inline = split_flag(argv[i])
        kind = FLAGS.get(flag)
        width = flag_width(kind, inline)
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
                        save_interval=save_interval if resumes else None,
                        embedding_in_pipeline_split=bool(values.get("--account-for-embedding-in-pipeline-split")),
                        loss_in_pipeline_split=bool(values.get("--account-for-loss-in-pipeline-split")),
                        overlap_grad_reduce=bool(values.get("--overlap-grad-reduce")),
                        overlap_param_gather=bool(values.get("--overlap-param-gather")),
                        tp_comm_overlap=bool(values.get("--tp-comm-overlap")))


def _vp_from_args(values: dict[str, object], layers: int, pp: int) -> int:
    """Virtual stages per rank (Megatron-LM validate_args): given, or the layers per stage
    (counting an embedding/loss that the split accounts for) over the layers per virtual
    stage, which an uneven first/last split does not accept."""
    per_stage = values.get("--num-layers-per-virtual-pipeline-stage")
    stages = values.get("--num-virtual-stages-per-pipeline-rank")
    if per_stage is not None and stages is not None:
        raise MegatronArgError("--num-virtual-stages-per-pipeline-rank",
                               "cannot be combined with --num-layers-per-virtual-pipeline-stage")
    if per_stage is not None and ("--decoder-first-pipeline-num-layers" in values
                                  or "--decoder-last-pipeline-num-layers" in values):
        raise MegatronArgError("--num-layers-per-virtual-pipeline-stage", "an uneven first/last split needs"
                               " --num-virtual-stages-per-pipeline-rank instead")
    layers += bool(values.get("--account-for-embedding-in-pipeline-split"))
    layers += bool(values.get("--account-for-loss-in-pipeline-split"))
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
    for flag, why in NOT_MODELLED.items():
        if flag in values:
            raise MegatronArgError(flag, why)
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
