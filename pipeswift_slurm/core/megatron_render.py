"""Megatron-LM command lines out: rewrite the parallel-layout flags of an argv for an
ExecConfig, keeping every other argument as the user wrote it.

Pure: imports only ``core.model``, ``core.megatron`` (the flag table and argv grammar)
and ``core.megatron_rules`` (whether a split is uneven).
"""

from __future__ import annotations

from typing import Iterable, Optional, Sequence

from pipeswift_slurm.core.megatron import FLAGS, flag_width, parse_argv, split_flag
from pipeswift_slurm.core.megatron_rules import uneven
from pipeswift_slurm.core.model import ExecConfig, JobProfile


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
    if cfg.vp > 1 and "--num-layers-per-virtual-pipeline-stage" in values and profile and not uneven(cfg):
        # Megatron derives vp from (layers + accounted embedding/loss) / pp / this value
        plan = profile.plan
        layers = profile.shape.num_layers + plan.embedding_in_pipeline_split + plan.loss_in_pipeline_split
        flags["--num-layers-per-virtual-pipeline-stage"] = layers // cfg.pp // cfg.vp
        flags["--num-virtual-stages-per-pipeline-rank"] = None
    else:
        flags["--num-layers-per-virtual-pipeline-stage"] = None
        flags["--num-virtual-stages-per-pipeline-rank"] = cfg.vp if cfg.vp > 1 else None
    if cfg.tp == 1 and values.get("--sequence-parallel"):
        flags["--sequence-parallel"] = None  # Megatron forces it off with tp == 1
    if cfg.tp == 1 and values.get("--tp-comm-overlap"):
        flags["--tp-comm-overlap"] = None  # and then refuses TP overlap, which needs it (validate_args)
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
        flag, inline = split_flag(argv[i])
        width = flag_width(FLAGS.get(flag), inline)
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
    """Every Megatron flag this package reads."""
    return FLAGS.keys()
