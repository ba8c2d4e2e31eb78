"""Cost model: iteration time, bubble, memory per GPU and job time of a Megatron job in a
given ExecConfig on a given GPU type, from the FLOPs of ``core/flops.py``. Pure Python, no I/O.

Sources (term by term in the docstrings below):
[N21] Narayanan et al., "Efficient Large-Scale Language Model Training on GPU Clusters
      Using Megatron-LM", SC'21 (1F1B/interleaved schedules, bubble, FLOPs).
[K22] Korthikanti et al., "Reducing Activation Recomputation in Large Transformer
      Models", 2022, arXiv 2205.05198 (activation memory, sequence parallelism).
[MLM] Megatron-LM training.py ``num_floating_point_operations`` and
      ``theoretical_memory_usage.py`` (core_r0.16.0).
Must not import SQLAlchemy, Slurm or torch.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any, Optional, Sequence

from pipeswift_slurm.core.error_band import ErrorBand, band_for, unmeasured_band
from pipeswift_slurm.core.flops import (attention_core_fwd_flops, flops_per_iteration, layer_fwd_flops,
                                        ring_allreduce_s)
from pipeswift_slurm.core.hardware import GpuType
from pipeswift_slurm.core.layer_profile import LayerProfileMismatch, layer_profile_mismatch, layer_profile_refusal
from pipeswift_slurm.core.megatron_rules import profile_stage_layers
from pipeswift_slurm.core.memo import per_profile
from pipeswift_slurm.core.model import ExecConfig, JobProfile
from pipeswift_slurm.core.overheads import data_parallel_s, elementwise_fwd_values, tp_backward_exposed_s, tp_exposed_s

GIB = 1024 ** 3


def _layers(profile: JobProfile, cfg: ExecConfig) -> list[int]:
    """Transformer layers per pipeline rank; for a split Megatron refuses (callers may ask
    about any config), the layers spread as evenly as whole layers allow."""
    layers = profile_stage_layers(profile, cfg)
    if layers is None:
        whole, extra = divmod(profile.shape.num_layers, cfg.pp)
        layers = [whole + (rank < extra) for rank in range(cfg.pp)]
    return layers


@dataclass(frozen=True)
class Estimate:
    """Predicted behaviour of one config. Times in seconds, memory in GiB.

    ``bubble_fraction`` is the idle share of the pipeline part of the iteration
    ((P-1)/(v*M+P-1) for uniform stages); ``tflops_per_gpu`` is model TFLOP/s per GPU
    (recompute not counted), Megatron's reported metric. ``band`` is the relative error
    band of ``iter_time_s`` for layouts like this one (``core.error_band``).
    """

    config: ExecConfig
    iter_time_s: float
    pipeline_s: float
    dp_allreduce_s: float
    optimizer_s: float
    bubble_fraction: float
    mem_gib: float
    tflops_per_gpu: float
    fits: bool
    band: ErrorBand = field(default_factory=unmeasured_band)


class _Memo:
    """Per shape and training settings: estimates and peak memory (GiB) per config; the
    max and sum of the stage times, and what peak memory reads, per layout."""

    def __init__(self) -> None:
        self.estimates: dict[ExecConfig, Estimate] = {}
        self.mem_gib: dict[ExecConfig, float] = {}
        self.stages: dict[tuple[object, ...], tuple[float, float]] = {}
        self.memory_parts: dict[tuple[object, ...], tuple[float, list[int], float, float, float]] = {}
        self.layer_pairs: dict[tuple[int, int, int], float] = {}  # (tp, cp, mbs) -> fwd + bwd of a layer


class CostModel:
    """Iteration time and memory of (profile, config) on one GPU type.

    ``schedule`` is "1f1b" (Megatron's default, interleaved when vp > 1) or "gpipe"
    (same time, all M micro-batches' activations held). Per-layer times and whole
    estimates are memoised on the instance (keyed by shape, training settings and layout),
    so repeated planning, and predicting the ends of running jobs every tick, are cheap.

    ``layer_profile`` (``core.profile_file.LayerProfile``) must have been measured on
    ``gpu`` (else LayerProfileMismatch); it replaces the table's layer time for the jobs
    whose precision and layer shape it measured, and only those (a site-wide profile covers
    the jobs of its model; ``check_layer_profile`` refuses the others for one-job callers).
    """

    def __init__(self, gpu: GpuType, schedule: str = "1f1b", layer_profile: Any = None):
        if schedule not in ("1f1b", "gpipe"):
            raise ValueError("schedule must be '1f1b' or 'gpipe'")
        self.gpu = gpu
        self.schedule = schedule
        if layer_profile is not None:
            reason = layer_profile_mismatch(layer_profile, gpu.name)
            if reason:
                raise LayerProfileMismatch(layer_profile_refusal(layer_profile, reason, gpu.name))
        self.layer_profile = layer_profile
        self._layer_cache: dict[tuple[object, ...], tuple[float, float]] = {}
        self._params_cache: dict[tuple[object, ...], float] = {}
        self._estimates: dict[tuple[object, ...], _Memo] = {}
        self._memo_by_profile: dict[int, tuple[Any, _Memo]] = {}

    def check_layer_profile(self, job: JobProfile) -> None:
        """Raise LayerProfileMismatch unless the layer profile (if any) measured ``job``'s
        precision and layer shape on this GPU type."""
        if self.layer_profile is not None:
            reason = layer_profile_mismatch(self.layer_profile, self.gpu.name, job)
            if reason:
                raise LayerProfileMismatch(layer_profile_refusal(self.layer_profile, reason, self.gpu.name))

    # ------------------------------------------------------------------ time
    def _bytes_per_value(self, precision: str) -> int:
        return 4 if precision == "fp32" else 2

    def layer_times_s(self, profile: JobProfile, cfg: ExecConfig) -> tuple[float, float]:
        """(forward, backward) seconds of one layer and one micro-batch on one GPU, term by term:

        GEMMs and attention: FLOPs / (tp*cp) / (peak * efficiency(work)); backward = 2x
        forward plus recompute (full: one more forward; selective: the attention core) [K22];
        elementwise: ``overheads.elementwise_fwd_values`` at HBM bandwidth, twice that
        backward (a measured layer profile already holds it); tensor parallelism: 2
        all-reduces of b*s*h values per layer in each direction (sequence parallelism:
        reduce-scatter + all-gather, same volume) [N21], of which ``--tp-comm-overlap`` hides
        all but ``overheads.tp_exposed_s`` and the backward pass without it hides what
        ``overheads.tp_backward_exposed_s`` says.
        """
        key = (profile.shape, profile.plan.precision, profile.plan.recompute_granularity,
               profile.plan.tp_comm_overlap, profile.plan.sequence_parallel, cfg.tp, cfg.cp, cfg.micro_batch_size)
        hit = self._layer_cache.get(key)
        if hit is not None:
            return hit
        shape, plan, gpu = profile.shape, profile.plan, self.gpu
        fwd_flops = layer_fwd_flops(shape, cfg.micro_batch_size) / (cfg.tp * cfg.cp)
        rate = gpu.peak_tflops_for(plan.precision) * 1e12 * gpu.efficiency(fwd_flops / 1e9)
        measured = self._measured_fwd_s(profile, cfg)
        value_bytes = self._bytes_per_value(plan.precision)
        elementwise = elementwise_fwd_values(shape, cfg, plan.sequence_parallel and cfg.tp > 1) * value_bytes \
            / (gpu.hbm_gbps * 1e9)
        if measured is not None:  # a profiling run of this very layer beats the table
            rate, elementwise = fwd_flops / measured, 0.0
        fwd = fwd_flops / rate
        recompute = {"full": fwd + elementwise, "selective": attention_core_fwd_flops(
            shape, cfg.micro_batch_size) / (cfg.tp * cfg.cp) / rate}.get(plan.recompute_granularity or "", 0.0)
        act_bytes = cfg.micro_batch_size * shape.seq_length // cfg.cp * shape.hidden_size * value_bytes
        tp_comm = 2 * ring_allreduce_s(act_bytes, cfg.tp, gpu.nvlink_gbps, gpu.latency_s)
        if plan.tp_comm_overlap:
            tp_fwd = tp_bwd = tp_exposed_s(tp_comm, cfg.tp, fwd)
        else:
            tp_fwd, tp_bwd = tp_comm, tp_backward_exposed_s(tp_comm, fwd)
        result = (fwd + elementwise + tp_fwd, 2 * (fwd + elementwise) + recompute + tp_bwd)
        self._layer_cache[key] = result
        return result

    def _measured_fwd_s(self, profile: JobProfile, cfg: ExecConfig) -> Optional[float]:
        """Forward seconds of one layer from the layer profile (``pipeswift profile``) when it
        measured this precision and layer shape: fwd = fwd+bwd / 3 at the nearest measured micro-batch size,
        scaled linearly in micro-batch size, and split over tp*cp at the efficiency ratio
        of the table's curve (the profile ran one layer on one GPU)."""
        lp, shape = self.layer_profile, profile.shape
        if lp is None or not lp.timings or layer_profile_mismatch(lp, self.gpu.name, profile):
            return None
        near = min(lp.timings, key=lambda t: (abs(t.micro_batch_size - cfg.micro_batch_size), -t.micro_batch_size))
        fwd_one_gpu: float = float(near.fwd_bwd_ms) / 3e3 * cfg.micro_batch_size / near.micro_batch_size
        split = cfg.tp * cfg.cp
        if split == 1:
            return fwd_one_gpu
        full = layer_fwd_flops(shape, cfg.micro_batch_size) / 1e9
        slowdown = self.gpu.efficiency(full) / max(self.gpu.efficiency(full / split), 1e-9)
        return fwd_one_gpu / split * slowdown

    def _logits_s(self, profile: JobProfile, cfg: ExecConfig) -> float:
        """Output layer on the last stage: 6*b*s*h*V_pad FLOPs (fwd + bwd), split over tp*cp."""
        shape = profile.shape
        flops = (6.0 * cfg.micro_batch_size * shape.seq_length * shape.hidden_size
                 * shape.padded_vocab_size(cfg.tp) / (cfg.tp * cfg.cp))
        return flops / (self.gpu.peak_tflops_for(profile.plan.precision) * 1e12 * self.gpu.efficiency(flops / 3e9))

    def _p2p_s(self, profile: JobProfile, cfg: ExecConfig) -> float:
        """One activation transfer at a stage boundary: b*s*h values (scattered over tp),
        over NVLink inside a node, else over the network (stages are the outermost
        dimension of Megatron's rank order, so a multi-node pipeline crosses nodes)."""
        if cfg.pp == 1:
            return 0.0
        shape = profile.shape
        nbytes = (cfg.micro_batch_size * shape.seq_length // cfg.cp * shape.hidden_size
                  * self._bytes_per_value(profile.plan.precision) / cfg.tp)
        bw = self.gpu.nvlink_gbps if cfg.num_nodes == 1 else self.gpu.inter_node_gbps
        return nbytes / (bw * 1e9) + self.gpu.latency_s

    def stage_times_s(self, profile: JobProfile, cfg: ExecConfig) -> list[float]:
        """Forward+backward seconds of one micro-batch on each pipeline rank, including
        the logits on the last rank and exposed p2p (2 transfers per micro-batch per
        chunk; half of it hidden when interleaving overlaps p2p, Megatron's default)."""
        layers = _layers(profile, cfg)
        fwd, bwd = self.layer_times_s(profile, cfg)
        p2p = self._p2p_s(profile, cfg) * 2 * cfg.vp * (0.5 if cfg.vp > 1 else 1.0)
        times = [n * (fwd + bwd) + p2p for n in layers]
        times[-1] += self._logits_s(profile, cfg)
        return times

    def pipeline_s(self, profile: JobProfile, cfg: ExecConfig) -> tuple[float, float]:
        """(pipeline seconds per iteration, bubble fraction) [N21 sec. 2.2]:

        T = M * t_max + (sum_i t_i - t_max) / v, where t_i is stage i's fwd+bwd time per
        micro-batch and v the virtual stages per rank; for uniform stages this is
        (M + (P-1)/v) * t, i.e. bubble share (P-1)/(v*M + P-1). GPipe and 1F1B take the
        same time; they differ in memory.
        """
        t_max, t_sum = self._stage_max_sum_s(profile, cfg)
        m = cfg.num_micro_batches
        total = m * t_max + (t_sum - t_max) / cfg.vp
        return total, 1.0 - m * t_max / total

    def pipeline_floor_s(self, profile: JobProfile, base: ExecConfig, levels: Sequence[tuple[int, int]],
                         max_vp: int) -> float:
        """A lower bound of ``pipeline_s`` over ``base``'s layout at each (micro-batch size,
        number of micro-batches) of ``levels`` with up to ``max_vp`` virtual stages: each
        stage's layers alone (t_i >= n_i * (fwd + bwd)), so T >= (fwd + bwd) * (M * n_max +
        (n_sum - n_max) / v_max); a hair lower, so that rounding cannot lift it above T."""
        layers = _layers(profile, base)
        most, rest = max(layers), sum(layers) - max(layers)
        memo = self._memo_of(profile).layer_pairs
        floor = math.inf
        for mbs, m in levels:
            pair = memo.get((base.tp, base.cp, mbs))
            if pair is None:
                pair = memo[base.tp, base.cp, mbs] = sum(self.layer_times_s(profile, replace(base, micro_batch_size=mbs)))
            floor = min(floor, pair * (m * most + rest / max_vp))
        return floor * (1 - 1e-9)

    def _stage_max_sum_s(self, profile: JobProfile, cfg: ExecConfig) -> tuple[float, float]:
        """max and sum of ``stage_times_s``, memoised per layout: they do not depend on the
        data-parallel size or the number of micro-batches (what GPU counts change)."""
        memo = self._memo_of(profile).stages
        key = (cfg.tp, cfg.cp, cfg.pp, cfg.vp, cfg.micro_batch_size, cfg.num_nodes == 1,
               cfg.decoder_first_pipeline_num_layers, cfg.decoder_last_pipeline_num_layers)
        hit = memo.get(key)
        if hit is None:
            times = self.stage_times_s(profile, cfg)
            hit = memo[key] = (max(times), sum(times))
        return hit

    def params_per_gpu(self, profile: JobProfile, cfg: ExecConfig) -> float:
        """Weights on the most loaded rank: its layers' weights plus the input embedding
        (first stage) or output layer (last stage), V_pad*h each, all split over tp."""
        shape = profile.shape
        key = (shape, cfg.tp, cfg.pp, cfg.decoder_first_pipeline_num_layers, cfg.decoder_last_pipeline_num_layers,
               profile.plan.embedding_in_pipeline_split, profile.plan.loss_in_pipeline_split)
        hit = self._params_cache.get(key)
        if hit is None:
            hit = self._params_cache[key] = self._params_most_loaded(profile, cfg)
        return hit

    @staticmethod
    def _params_most_loaded(profile: JobProfile, cfg: ExecConfig) -> float:
        shape = profile.shape
        layers = _layers(profile, cfg)
        embed = shape.padded_vocab_size(cfg.tp) * shape.hidden_size
        ppl = shape.params_per_layer
        if len(layers) == 1:
            return (layers[0] * ppl + 2 * embed) / cfg.tp
        return max(layers[0] * ppl + embed, layers[-1] * ppl + embed, max(layers) * ppl) / cfg.tp

    def dp_allreduce_s(self, profile: JobProfile, cfg: ExecConfig) -> float:
        """Exposed gradient reduction across data-parallel replicas (``overheads.data_parallel_s``:
        volume, the group's bandwidth, and what the overlap flags hide behind the backward
        (forward) pass of one micro-batch on the rank's layers)."""
        if cfg.dp <= 1:
            return 0.0
        fwd, bwd = self.layer_times_s(profile, cfg)
        layers = max(_layers(profile, cfg))
        return data_parallel_s(self.gpu, profile.plan, cfg, self.params_per_gpu(profile, cfg),
                               (layers * fwd, layers * bwd))

    def optimizer_s(self, profile: JobProfile, cfg: ExecConfig) -> float:
        """Adam step, memory bound: ~32 bytes moved per parameter (fp32 master, grad, m, v
        read; master, m, v, 16-bit copy written) over the rank's shard (/dp with the
        distributed optimizer) at HBM bandwidth."""
        params = self.params_per_gpu(profile, cfg)
        if profile.plan.use_distributed_optimizer:
            params /= cfg.dp
        return params * 32 / (self.gpu.hbm_gbps * 1e9)

    # ------------------------------------------------------------------ memory
    def activation_bytes_per_layer(self, profile: JobProfile, cfg: ExecConfig) -> float:
        """Activations one layer keeps for one micro-batch [K22 Table 2], flash attention
        assumed (no 5*a*s/h score term, as Megatron's own estimator): no recompute
        s*b*h*(10 + 24/t) (with sequence parallel 34*s*b*h/t); selective the same;
        full recompute keeps only the layer input, 2*s*b*h (/t with sequence parallel).
        16-bit values; fp32 doubles it; context parallelism divides s."""
        shape, plan = profile.shape, profile.plan
        sbh = shape.seq_length / cfg.cp * cfg.micro_batch_size * shape.hidden_size
        sp = plan.sequence_parallel and cfg.tp > 1
        if plan.recompute_granularity == "full":
            value = 2 * sbh / (cfg.tp if sp else 1)
        else:
            value = 34 * sbh / cfg.tp if sp else sbh * (10 + 24 / cfg.tp)
        return value * (2 if plan.precision == "fp32" else 1)

    def in_flight(self, cfg: ExecConfig, rank: int) -> float:
        """Micro-batches whose activations rank ``rank`` holds at peak: 1F1B warm-up
        min(M, P - rank); interleaved x (1 + (P-1)/(P*v)) [MLM]; GPipe all M."""
        if self.schedule == "gpipe":
            return float(cfg.num_micro_batches)
        held = float(min(cfg.num_micro_batches, cfg.pp - rank))
        if cfg.vp > 1:
            held *= 1 + (cfg.pp - 1) / (cfg.pp * cfg.vp)
        return held

    def memory_gib(self, profile: JobProfile, cfg: ExecConfig) -> float:
        """Peak memory on the most loaded rank, GiB [MLM theoretical_memory_usage]:
        weights+grads+optimizer = params * (18 bytes mixed precision with Adam, or
        6 + 12/dp with the distributed optimizer; fp32: 16, or 8 + 8/dp) plus
        activations = layers_on_rank * per-layer bytes * in-flight micro-batches, plus
        embedding activations on the first rank and 4*s*b*(h+V)/t for the logits and
        loss on the last, plus the GPU's reserved memory."""
        plan = profile.plan
        if plan.precision == "fp32":
            per_param = 8 + 8 / cfg.dp if plan.use_distributed_optimizer else 16
        else:
            per_param = 6 + 12 / cfg.dp if plan.use_distributed_optimizer else 18
        params, layers, per_layer, embedding, logits = self._memory_parts(profile, cfg)
        static = params * per_param
        first = self.in_flight(cfg, 0)
        peak = max(0.0, layers[0] * per_layer * first + embedding * first + (logits if cfg.pp == 1 else 0.0))
        if cfg.pp > 1:
            peak = max(peak, layers[-1] * per_layer * self.in_flight(cfg, cfg.pp - 1) + logits)
        return (static + peak) / GIB + self.gpu.reserved_gib

    def _memory_parts(self, profile: JobProfile, cfg: ExecConfig) -> tuple[float, list[int], float, float, float]:
        """What ``memory_gib`` reads of a layout, memoised per layout (not per data-parallel
        size or micro-batch count): weights on the most loaded rank, layers per rank,
        activation bytes per layer, the first rank's embedding bytes per micro-batch
        (8*s*b + s*b*h) and the last rank's logits and loss bytes."""
        memo = self._memo_of(profile).memory_parts
        key = (cfg.tp, cfg.cp, cfg.pp, cfg.micro_batch_size, cfg.decoder_first_pipeline_num_layers,
               cfg.decoder_last_pipeline_num_layers)
        hit = memo.get(key)
        if hit is None:
            shape = profile.shape
            sb = shape.seq_length / cfg.cp * cfg.micro_batch_size
            hit = memo[key] = (self.params_per_gpu(profile, cfg), _layers(profile, cfg),
                               self.activation_bytes_per_layer(profile, cfg), 8 * sb + sb * shape.hidden_size,
                               4 * sb * (shape.hidden_size + shape.padded_vocab_size(cfg.tp)) / cfg.tp)
        return hit

    # ------------------------------------------------------------------ totals
    def _memo_of(self, profile: JobProfile) -> _Memo:
        """The memo of estimates and peak memory per config for the profile's shape and
        training settings other than the length: what an estimate reads of a profile."""
        return per_profile(self._memo_by_profile, profile, self._new_memo)

    def _new_memo(self, profile: JobProfile) -> _Memo:
        plan = profile.plan
        return self._estimates.setdefault((profile.shape, plan.global_batch_size, plan.precision,
                                           plan.recompute_granularity, plan.sequence_parallel,
                                           plan.use_distributed_optimizer, plan.embedding_in_pipeline_split,
                                           plan.loss_in_pipeline_split, plan.overlap_grad_reduce,
                                           plan.overlap_param_gather, plan.tp_comm_overlap), _Memo())

    def estimate(self, profile: JobProfile, cfg: ExecConfig) -> Estimate:
        """Iteration time = pipeline + data-parallel reduction + optimizer step; memory;
        model TFLOP/s per GPU = F / (iteration time * world size)."""
        memo = self._memo_of(profile).estimates
        hit = memo.get(cfg)
        if hit is None:
            hit = memo[cfg] = self._estimate(profile, cfg)
        return hit

    def _memory_memo_gib(self, profile: JobProfile, cfg: ExecConfig) -> float:
        """``memory_gib``, memoised: the planner asks ``fits`` and then ``estimate``."""
        memo = self._memo_of(profile).mem_gib
        hit = memo.get(cfg)
        if hit is None:
            hit = memo[cfg] = self.memory_gib(profile, cfg)
        return hit

    def _estimate(self, profile: JobProfile, cfg: ExecConfig) -> Estimate:
        pipe, bubble = self.pipeline_s(profile, cfg)
        dp_s, opt_s = self.dp_allreduce_s(profile, cfg), self.optimizer_s(profile, cfg)
        iter_s = pipe + dp_s + opt_s
        mem = self._memory_memo_gib(profile, cfg)
        tflops = flops_per_iteration(profile.shape, profile.plan.global_batch_size) / (iter_s * cfg.world_size) / 1e12
        return Estimate(config=cfg, iter_time_s=iter_s, pipeline_s=pipe, dp_allreduce_s=dp_s,
                        optimizer_s=opt_s, bubble_fraction=bubble, mem_gib=mem, tflops_per_gpu=tflops,
                        fits=mem <= self.gpu.mem_gib, band=band_for(self.gpu.name, cfg))

    def fits(self, profile: JobProfile, cfg: ExecConfig) -> bool:
        """Whether the most loaded rank's peak memory fits in the GPU."""
        return self._memory_memo_gib(profile, cfg) <= self.gpu.mem_gib

    def iter_time_s(self, profile: JobProfile, cfg: ExecConfig) -> float:
        return self.estimate(profile, cfg).iter_time_s

    def startup_s(self, profile: JobProfile) -> float:
        """Start cost paid at every (re)start: fixed launch cost plus checkpoint load."""
        return self.gpu.startup_s + self.gpu.load_s_per_bparam * profile.shape.num_params / 1e9

    def job_time_s(self, profile: JobProfile, cfg: ExecConfig, iterations: Optional[int] = None) -> float:
        """Job run time = startup + iterations * iteration time (iterations default: the plan's)."""
        iters = profile.plan.iterations if iterations is None else iterations
        return self.startup_s(profile) + iters * self.iter_time_s(profile, cfg)
