"""Workloads for the simulator: trace CSV files and a seeded synthetic LLM-cluster
generator, both turned into Megatron jobs the same documented way.

Trace rows (schema of ``shared/workloads/README.md``: job_id, submit_time_s,
duration_s, num_gpus, user, ..., cluster) carry no model. Each row becomes a Megatron
job (``to_megatron_job``):
  * the model comes from ``ZOO`` by GPU count (``_BANDS``: 1 GPU -> 125M/350M, ...,
    128+ -> 30B/70B; the seeded choice within a band), never a model whose user config
    does not fit in memory on that count;
  * the user's configuration is the zoo default (tp, pp, micro-batch) with the rest as
    data parallelism, and the global batch rounded up to a multiple of mbs*dp;
  * ``--train-iters`` = (recorded duration - startup) / predicted iteration time of the
    user's config on the recorded GPU count (at least 1 iteration), so the user's own
    config reproduces the recorded duration;
  * a share ``flex`` of jobs (seeded) allows resizing over half to double its GPUs
    (within the cluster); the others are rigid at their recorded count;
  * the user's time limit over-estimates the true run time: 1.5x, rounded up to 30 min;
  * a row without a user gets one of 20 synthetic users (``synthetic_user``, Zipf-like, by job_id);
  * ``Conversion.layouts = "expert"``: instead the planner's best config on that count, the
    iterations from its iteration time (sim/layouts.py: what an expert would run);
  * every job saves and loads checkpoints (``--save``, ``--load``) about every 30 min of
    its user config's run (``--save-interval``), so a requeued job resumes from its last
    checkpoint (see sim/engine.py);
Optional knobs (all off by default; the default conversion never reads them):
``Conversion.bands`` replaces ``_BANDS`` with another table over ``ZOO`` and
``EXTRA_ZOO`` (e.g. a gpt and a llama-style model in the same band, so the model
family is drawn per row); ``synthetic_trace(mix=...)`` replaces ``SYNTHETIC_MIX``.
Trace files and the synthetic generator are ``sim/trace.py``; this module is pure.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, replace
from typing import Iterable, Optional

from pipeswift_slurm.core.costmodel import CostModel
from pipeswift_slurm.core.megatron import MegatronArgError, profile_from_argv
from pipeswift_slurm.core.megatron_rules import node_shape
from pipeswift_slurm.core.model import JobProfile
from pipeswift_slurm.core.planner import Planner
from pipeswift_slurm.sim.layouts import LAYOUTS, own_argv, own_layout
from pipeswift_slurm.sim.trace import (TRACE_COLUMNS, DATED_AFTER_S, SYNTHETIC_MIX, TraceRow,  # noqa: F401 (re-exported)
                                       WorkloadError, offered_load, read_trace, rescale_load, select_window,
                                       synthetic_trace, window_start_s)
from pipeswift_slurm.sim.truth import ShapeNoise

TIME_LIMIT_FACTOR = 1.5
TIME_LIMIT_ROUND_S = 1800
CHECKPOINT_EVERY_S = 1800.0  # every job saves a checkpoint about every 30 min of its run


@dataclass(frozen=True)
class ZooModel:
    """A GPT-style model and the configuration a user would typically pick for it."""

    name: str
    num_layers: int
    hidden_size: int
    num_attention_heads: int
    tp: int
    pp: int
    micro_batch_size: int
    global_batch_size: int
    seq_length: int = 2048
    num_query_groups: Optional[int] = None
    ffn_hidden_size: Optional[int] = None
    swiglu: bool = False
    vocab_size: int = 50257

    def argv(self, world: int, gbs: int, iters: int) -> list[str]:
        """Megatron argv of this model with its default layout on ``world`` GPUs."""
        args = ["pretrain_gpt.py", "--num-layers", str(self.num_layers), "--hidden-size", str(self.hidden_size),
                "--num-attention-heads", str(self.num_attention_heads), "--seq-length", str(self.seq_length),
                "--max-position-embeddings", str(self.seq_length), "--vocab-size", str(self.vocab_size),
                "--tensor-model-parallel-size", str(self.tp), "--pipeline-model-parallel-size", str(self.pp),
                "--micro-batch-size", str(self.micro_batch_size), "--global-batch-size", str(gbs),
                "--train-iters", str(iters), "--bf16", "--use-distributed-optimizer"]
        if self.swiglu:
            args.append("--swiglu")
        if self.ffn_hidden_size:
            args += ["--ffn-hidden-size", str(self.ffn_hidden_size)]
        if self.num_query_groups:
            args += ["--group-query-attention", "--num-query-groups", str(self.num_query_groups)]
        return args


ZOO = {m.name: m for m in (
    ZooModel("gpt-125m", 12, 768, 12, tp=1, pp=1, micro_batch_size=4, global_batch_size=256),
    ZooModel("gpt-350m", 24, 1024, 16, tp=1, pp=1, micro_batch_size=4, global_batch_size=256),
    ZooModel("gpt-760m", 24, 1536, 16, tp=1, pp=1, micro_batch_size=2, global_batch_size=256),
    ZooModel("gpt-1.3b", 24, 2048, 16, tp=1, pp=2, micro_batch_size=2, global_batch_size=512),
    ZooModel("gpt-2.7b", 32, 2560, 32, tp=2, pp=2, micro_batch_size=2, global_batch_size=512),
    ZooModel("gpt-6.7b", 32, 4096, 32, tp=4, pp=2, micro_batch_size=1, global_batch_size=1024),
    ZooModel("gpt-13b", 40, 5120, 40, tp=8, pp=2, micro_batch_size=1, global_batch_size=1024),
    ZooModel("gpt-30b", 48, 7168, 56, tp=8, pp=4, micro_batch_size=1, global_batch_size=1536),
    ZooModel("llama-70b", 80, 8192, 64, tp=8, pp=8, micro_batch_size=1, global_batch_size=1536,
             num_query_groups=8, ffn_hidden_size=28672, swiglu=True, vocab_size=32000),
)}
# (largest GPU count of the band, candidate models); the last band takes everything above.
_BANDS = ((1, ("gpt-125m", "gpt-350m")), (2, ("gpt-350m", "gpt-760m")), (4, ("gpt-760m", "gpt-1.3b")),
          (8, ("gpt-1.3b", "gpt-2.7b")), (16, ("gpt-2.7b", "gpt-6.7b")), (32, ("gpt-6.7b", "gpt-13b")),
          (64, ("gpt-13b", "gpt-30b")), (10 ** 9, ("gpt-30b", "llama-70b")))

# Small llama-style models (SwiGLU, grouped-query attention, 32k vocabulary; after
# Llama-3.2-1B/3B with Llama-2's vocabulary): job classes "gpt-swiglu-gqa-<2B" and
# "gpt-swiglu-gqa-<8B", a second model FAMILY at the sizes of gpt-1.3b and gpt-2.7b.
# Kept out of ZOO so the default conversion (bands and fallback order) is unchanged;
# only a ``Conversion.bands`` table that names them draws them.
EXTRA_ZOO = {m.name: m for m in (
    ZooModel("llama-1b", 16, 2048, 32, tp=1, pp=2, micro_batch_size=2, global_batch_size=512,
             num_query_groups=8, ffn_hidden_size=8192, swiglu=True, vocab_size=32000),
    ZooModel("llama-3b", 28, 3072, 24, tp=2, pp=2, micro_batch_size=2, global_batch_size=512,
             num_query_groups=8, ffn_hidden_size=8192, swiglu=True, vocab_size=32000),
)}
ALL_MODELS = {**ZOO, **EXTRA_ZOO}
Bands = tuple[tuple[int, tuple[str, ...]], ...]


@dataclass(frozen=True)
class WorkloadJob:
    """A simulated submission: the Megatron job and the truth the simulator uses.

    ``truth_factor`` multiplies the cost model's run time to give the true one (class
    bias x per-job noise); ``time_limit_s`` is the user's limit for the user's config.
    ``profile`` None: a history job replayed as it ran (sim/replay.py: ``as_ran_nodes`` x
    ``as_ran_gpus_per_node`` GPUs for ``recorded_duration_s``); ``as_ran_jct_s``: its real JCT.
    On a mixed cluster (sim/mixed.py), ``partition`` is the one it was submitted to and
    ``partitions`` those it allows (empty: only that one).
    """

    job_id: int
    name: str
    user: str
    submit_s: float
    argv: tuple[str, ...]
    profile: Optional[JobProfile]
    recorded_duration_s: float
    time_limit_s: int
    model: str
    category: str = ""
    truth_factor: float = 1.0
    as_ran_nodes: int = 0
    as_ran_gpus_per_node: int = 0
    as_ran_jct_s: Optional[float] = None
    partition: str = ""
    partitions: tuple[str, ...] = ()

    @property
    def gpus(self) -> int:
        return self.profile.requested.gpus if self.profile else self.as_ran_nodes * self.as_ran_gpus_per_node

    @property
    def flexible(self) -> bool:
        return self.profile is not None and self.profile.flexible


# ---------------------------------------------------------------- reaMegatron jobs

@dataclass(frozen=True)
class Conversion:
    """How trace rows become Megatron jobs (see the module docstring).

    ``bands`` (optional): a table like ``_BANDS`` ((largest GPU count, model names), the
    last band taking everything above) naming models of ``ZOO`` or ``EXTRA_ZOO``; the
    seeded draw within a band is the same as the default's, and the fallback when no
    model of the band fits is every other model of the table, last named first. None
    (the default) is ``_BANDS`` over ``ZOO``, unchanged. ``layouts``: one of ``LAYOUTS``.
    """

    cost: CostModel
    cluster_gpus: int
    gpus_per_node: int
    flex: float = 1.0
    seed: int = 0
    class_bias: tuple[tuple[str, float], ...] = ()
    noise_sigma: float = 0.0
    bands: Optional[Bands] = None
    shape_noise: ShapeNoise = ShapeNoise()  # the truth's factor per config shape (sim/truth.py)
    layouts: str = "user"

    def __post_init__(self) -> None:
        if self.layouts not in LAYOUTS:
            raise WorkloadError("layouts %r: expected one of %s" % (self.layouts, ", ".join(LAYOUTS)))


def _candidates(row: TraceRow, conv: Conversion, rng: random.Random) -> tuple[list[str], dict[str, ZooModel]]:
    """Model names to try for a row, in order, and the table they come from."""
    if conv.bands is None:
        band = next(models for top, models in _BANDS if row.num_gpus <= top)
        order = list(band)
        rng.shuffle(order)
        smaller = [name for name in ZOO if name not in band][::-1]
        return order + smaller, ZOO
    if not conv.bands:
        raise WorkloadError("bands: empty table; give (largest GPU count, model names) pairs or None")
    unknown = sorted({n for _, names in conv.bands for n in names} - set(ALL_MODELS))
    if unknown:
        raise WorkloadError("bands: unknown model(s) %s; known: %s" % (", ".join(unknown), ", ".join(ALL_MODELS)))
    band = next((models for top, models in conv.bands if row.num_gpus <= top), conv.bands[-1][1])
    order = list(band)
    rng.shuffle(order)
    named = list(dict.fromkeys(n for _, names in conv.bands for n in names))
    return order + [name for name in named if name not in band][::-1], ALL_MODELS


def _fit_model(row: TraceRow, conv: Conversion, rng: random.Random) -> tuple[ZooModel, JobProfile]:
    names, table = _candidates(row, conv, rng)
    for name in names:
        model = table[name]
        if row.num_gpus % (model.tp * model.pp):
            continue
        dp = row.num_gpus // (model.tp * model.pp)
        step = model.micro_batch_size * dp
        gbs = -(-model.global_batch_size // step) * step
        try:
            profile = profile_from_argv(model.argv(row.num_gpus, gbs, 1), world_size=row.num_gpus,
                                        gpus_per_node=conv.gpus_per_node)
        except MegatronArgError:
            continue  # e.g. its tensor-parallel size does not fit this node size
        if profile.requested.num_nodes <= conv.cluster_gpus // conv.gpus_per_node and \
                conv.cost.fits(profile, profile.requested):
            return model, profile
    raise WorkloadError("job %s: no model of the zoo runs on %d GPUs" % (row.name, row.num_gpus))


def _truth_factor(job_class: str, conv: Conversion, rng: random.Random) -> float:
    bias = 1.0
    for prefix, value in conv.class_bias:
        if job_class.startswith(prefix):
            bias = value
    noise = math.exp(rng.gauss(0.0, conv.noise_sigma)) if conv.noise_sigma > 0 else 1.0
    return bias * noise


def user_time_limit_s(run_s: float) -> int:
    """The time limit a user gives a job that runs ``run_s``: an over-estimate,
    ``TIME_LIMIT_FACTOR`` x, rounded up to ``TIME_LIMIT_ROUND_S``."""
    return math.ceil(TIME_LIMIT_FACTOR * run_s / TIME_LIMIT_ROUND_S) * TIME_LIMIT_ROUND_S


def to_megatron_job(index: int, row: TraceRow, conv: Conversion,
                    planner: Optional[Planner] = None) -> WorkloadJob:
    """Turn one trace row into a Megatron job (seeded per row, so order-independent)."""
    rng = random.Random("%d:%s" % (conv.seed, row.name))
    model, profile = _fit_model(row, conv, rng)
    profile = own_layout(profile, conv.layouts, conv.cost, conv.gpus_per_node, planner)
    iter_s = conv.cost.iter_time_s(profile, profile.requested)
    iters = max(1, round((row.duration_s - conv.cost.startup_s(profile)) / iter_s))
    save_interval = max(1, round(CHECKPOINT_EVERY_S / iter_s))
    ckpt = "/checkpoints/%s" % row.name
    argv = tuple(own_argv(model.argv(row.num_gpus, profile.plan.global_batch_size, iters), profile, conv.layouts)
                 + ["--save", ckpt, "--load", ckpt, "--save-interval", str(save_interval)])
    profile = replace(profile, plan=replace(profile.plan, train_iters=iters, save_interval=save_interval))
    if rng.random() < conv.flex:
        lo, hi = max(1, row.num_gpus // 2), min(2 * row.num_gpus, conv.cluster_gpus)
        profile = profile.with_range(lo, hi)
    factor = _truth_factor(profile.job_class, conv, rng)
    shape = conv.shape_noise.factor(profile.requested, profile.requested)  # the user knows it
    limit = user_time_limit_s((conv.cost.startup_s(profile) + iters * iter_s * shape) * factor)
    return WorkloadJob(job_id=index + 1, name=row.name, user=row.user or synthetic_user(row.name),
                       submit_s=row.submit_s, argv=argv, profile=profile, recorded_duration_s=row.duration_s,
                       time_limit_s=limit, model=model.name, category=row.category, truth_factor=factor)


def synthetic_user(row_name: str, users: int = 20) -> str:
    """'u00'..'u19' for a row without a user: weight 1/(k+1) for user k, seeded by the row's
    name alone (the same user whatever ``--seed``; the row's own draws are untouched)."""
    weights = [1.0 / (k + 1) for k in range(users)]
    return "u%02d" % random.Random("user:" + row_name).choices(range(users), weights)[0]


def build_workload(rows: Iterable[TraceRow], conv: Conversion, drop_oversized: bool = False) -> list[WorkloadJob]:
    """Convert rows to jobs. A job larger than the cluster is an error unless dropped.

    Raises:
        WorkloadError: a job needs more GPUs than the cluster has (names it and how many).
    """
    rows = list(rows)
    nodes = conv.cluster_gpus // conv.gpus_per_node
    too_big = [r for r in rows if r.num_gpus > conv.cluster_gpus
               or node_shape(r.num_gpus, conv.gpus_per_node)[0] > nodes]
    if too_big and not drop_oversized:
        raise WorkloadError("%d job(s) do not fit the cluster's %d nodes x %d GPUs (first: %s with %d GPUs); use"
                            " a bigger --gpus or --drop-oversized" % (len(too_big), nodes, conv.gpus_per_node,
                                                                      too_big[0].name, too_big[0].num_gpus))
    dropped = {id(r) for r in too_big}
    kept = [r for r in rows if id(r) not in dropped]
    if rows and not kept:
        raise WorkloadError("all %d job(s) are larger than the cluster's %d nodes x %d GPUs (--drop-oversized"
                            " left nothing to simulate); use a bigger --gpus" % (len(rows), nodes, conv.gpus_per_node))
    planner = Planner(conv.cost, conv.gpus_per_node)  # shared: each model shape is ranked once
    return [to_megatron_job(i, r, conv, planner) for i, r in enumerate(kept)]
