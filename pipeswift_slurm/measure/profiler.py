"""Per-layer profiler: median forward+backward time of one transformer layer of a job's shape,
per candidate micro-batch size, on the local device (``profile_layer``), and what
``pipeswift profile`` does with it (``main_profile``: label it with the device's GPU type
and precision, write the file of ``core.profile_file``).

The layer is megatron-core's ``TransformerLayer`` when megatron-core is installed (the
Transformer-Engine spec on GPU when TE is present, else the local spec), or a plain torch layer
(pre-norm attention with SDPA + MLP of the same shape). GPU runs use the job's precision
(bf16 by default) and CUDA events; CPU runs use fp32 and ``time.perf_counter``, only prove
the structure (CPU times say nothing about GPU speed), and are labelled "cpu", never with a
GPU type. Timing is ``warmup`` untimed runs, then the median of ``repeats``.

Must not import torch or megatron at module level (only inside functions), nor the store,
backends or CLI: ``import pipeswift_slurm.measure.profiler`` stays light.
"""

from __future__ import annotations

import contextlib
import importlib.util
import logging
import statistics
import time
import warnings
from collections.abc import Callable, Iterator, Sequence
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

from pipeswift_slurm.core.flops import layer_fwd_flops
from pipeswift_slurm.core.hardware import builtin_gpu_types, gpu_type_for_device
from pipeswift_slurm.core.layer_profile import CPU_GPU_TYPE, LAYER_SHAPE_KEYS
from pipeswift_slurm.core.model import ModelShape
from pipeswift_slurm.core.profile_file import (
    BACKEND_MEGATRON,
    BACKEND_TORCH,
    DTYPES,
    LayerProfile,
    MicroBatchTiming,
    write_profile_toml,
)

if TYPE_CHECKING:
    import torch

log = logging.getLogger(__name__)


class ProfileLabelError(ValueError):
    """A profile that would be filed under a GPU type it was not measured on."""


def layer_flops_fwd_bwd(shape: ModelShape, micro_batch_size: int) -> float:
    """Floating-point operations of forward + backward of one layer for one micro-batch:
    3x the forward count of ``core.flops.layer_fwd_flops`` (backward = 2x forward;
    Megatron's ``num_floating_point_operations`` restricted to one layer, recompute not
    counted), so the profiler's TFLOP/s and the cost model use one formula."""
    return 3.0 * layer_fwd_flops(shape, micro_batch_size)


def megatron_available() -> bool:
    """True when megatron-core can be imported (checked without importing it)."""
    try:
        return importlib.util.find_spec("megatron.core") is not None
    except (ImportError, ValueError):  # a broken parent package counts as missing
        return False


def profile_layer(shape: ModelShape, micro_batch_sizes: Sequence[int], *, device: str | None = None,
                  use_megatron: bool | None = None, warmup: int = 2, repeats: int = 5,
                  dtype: str | None = None) -> LayerProfile:
    """Time forward+backward of one transformer layer of ``shape`` per micro-batch size.

    Args:
        shape: the job's model shape (only the per-layer fields matter).
        micro_batch_sizes: candidate micro-batch sizes, each timed separately.
        device: "cuda", "cuda:N" or "cpu"; default: the GPU when present, else the CPU.
        use_megatron: megatron-core's layer (True), a plain torch layer (False), or
            megatron-core when installed (None).
        warmup: untimed runs before timing each micro-batch size.
        repeats: timed runs; the median is kept.
        dtype: "bf16", "fp16" or "fp32"; default bf16 on GPU, fp32 on CPU.

    Returns:
        The LayerProfile, gpu_type set to the built-in type the GPU is (else its name; "cpu"
        on a CPU).

    Raises:
        ValueError: bad arguments. ImportError: megatron-core asked for but missing.
        RuntimeError: no micro-batch size fitted in GPU memory.
    """
    import torch

    dev = _resolve_device(device)
    on_cuda = dev.type == "cuda"
    dtype = dtype or ("bf16" if on_cuda else "fp32")
    if (dtype not in DTYPES or repeats < 1 or warmup < 0 or not micro_batch_sizes
            or min(micro_batch_sizes) < 1):
        raise ValueError(f"bad profile request: dtype={dtype} repeats={repeats} warmup={warmup} "
                         f"micro_batch_sizes={list(micro_batch_sizes)}")
    use_megatron = megatron_available() if use_megatron is None else use_megatron
    torch_dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[dtype]
    build = _build_megatron_layer if use_megatron else _build_torch_layer
    with warnings.catch_warnings(), (_megatron_runtime(on_cuda) if use_megatron else contextlib.nullcontext()):
        warnings.filterwarnings("ignore", module=r"megatron\.")  # deprecation chatter per layer
        make_step, layer_spec = build(shape, dev, torch_dtype)
        timings = _time_micro_batches(make_step, shape, sorted(set(micro_batch_sizes)), dev,
                                      (warmup, repeats))
    name, mem_gib = _device_name_mem(dev)
    described = f"{dev} ({name})" if name else f"cpu ({torch.get_num_threads()} threads)"
    return LayerProfile(
        gpu_type=profile_label(None, name, mem_gib), device=described, backend=BACKEND_MEGATRON if use_megatron else BACKEND_TORCH,
        layer_spec=layer_spec, dtype=dtype, timings=tuple(timings), warmup=warmup, repeats=repeats,
        torch_version=torch.__version__.split("+")[0], **{key: getattr(shape, key) for key in LAYER_SHAPE_KEYS})


def _device_name_mem(dev: torch.device) -> tuple[str | None, float]:
    """(CUDA device name, memory in GiB), or (None, 0.0) on the CPU."""
    import torch

    if dev.type != "cuda":
        return None, 0.0
    return torch.cuda.get_device_name(dev), torch.cuda.get_device_properties(dev).total_memory / 2**30


def _resolve_device(device: str | None):
    """The torch.device to profile on (a CUDA device always with its index, made current)."""
    import torch

    dev = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    if dev.type == "cuda":
        dev = dev if dev.index is not None else torch.device("cuda", torch.cuda.current_device())
        torch.cuda.set_device(dev)
    return dev


def _time_micro_batches(make_step, shape: ModelShape, micro_batch_sizes: list[int], dev,
                        warmup_repeats: tuple[int, int]) -> list[MicroBatchTiming]:
    import torch

    warmup, repeats = warmup_repeats
    timings = []
    for mbs in micro_batch_sizes:
        try:
            fwd_bwd_ms = _median_ms(make_step(mbs), dev, warmup, repeats)
        except torch.cuda.OutOfMemoryError:
            log.warning("micro-batch size %d does not fit in GPU memory; left out", mbs)
            torch.cuda.empty_cache()
            continue
        tflops = layer_flops_fwd_bwd(shape, mbs) / (fwd_bwd_ms * 1e-3) / 1e12
        log.info("layer h=%d s=%d mbs=%d: %.3f ms fwd+bwd, %.3g TFLOP/s",
                 shape.hidden_size, shape.seq_length, mbs, fwd_bwd_ms, tflops)
        timings.append(MicroBatchTiming(mbs, fwd_bwd_ms, tflops))
    if not timings:
        raise RuntimeError(f"no micro-batch size in {micro_batch_sizes} fitted on {dev}")
    return timings


def _median_ms(step: Callable[[], None], dev, warmup: int, repeats: int) -> float:
    """Median wall time of ``step``: CUDA events on a GPU, perf_counter on the CPU."""
    import torch

    for _ in range(warmup):
        step()
    samples_ms = []
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)
        for _ in range(repeats):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            step()
            end.record()
            end.synchronize()
            samples_ms.append(start.elapsed_time(end))
    else:
        for _ in range(repeats):
            start_s = time.perf_counter()
            step()
            samples_ms.append((time.perf_counter() - start_s) * 1e3)
    return statistics.median(samples_ms)


def _build_torch_layer(shape: ModelShape, dev, torch_dtype):
    """A plain pre-norm transformer layer of ``shape`` (SDPA causal attention, GQA, GELU or
    SwiGLU MLP). Returns (make_step(mbs) -> step(), "sdpa")."""
    import torch
    from torch import nn
    from torch.nn import functional as F

    h, heads, groups, kv = (shape.hidden_size, shape.num_attention_heads,
                            shape.num_query_groups, shape.kv_channels)
    ffn = shape.ffn_hidden_size

    class Layer(nn.Module):
        def __init__(self):
            super().__init__()
            self.norm1, self.norm2 = nn.LayerNorm(h), nn.LayerNorm(h)
            self.qkv = nn.Linear(h, (heads + 2 * groups) * kv)
            self.proj = nn.Linear(heads * kv, h)
            self.fc1 = nn.Linear(h, ffn * (2 if shape.swiglu else 1))
            self.fc2 = nn.Linear(ffn, h)

        def forward(self, x):  # [b, s, h]
            b, s, _ = x.shape
            q, k, v = self.qkv(self.norm1(x)).split([heads * kv, groups * kv, groups * kv], dim=-1)
            q = q.view(b, s, heads, kv).transpose(1, 2)
            k, v = (t.view(b, s, groups, kv).transpose(1, 2).repeat_interleave(heads // groups, dim=1)
                    for t in (k, v))
            attn = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            x = x + self.proj(attn.transpose(1, 2).reshape(b, s, heads * kv))
            y = self.fc1(self.norm2(x))
            if shape.swiglu:
                gate, up = y.chunk(2, dim=-1)
                y = F.silu(gate) * up
            else:
                y = F.gelu(y)
            return x + self.fc2(y)

    module = Layer().to(device=dev, dtype=torch_dtype)

    def make_step(mbs: int):
        x = torch.randn(mbs, shape.seq_length, h, device=dev, dtype=torch_dtype, requires_grad=True)
        grad = torch.randn_like(x)
        return lambda: module(x).backward(grad)
    return make_step, "sdpa"


def _build_megatron_layer(shape: ModelShape, dev, torch_dtype):
    """megatron-core ``TransformerLayer`` of ``shape``: TE spec on GPU when transformer_engine
    is installed, else the local spec. Returns (make_step(mbs) -> step(), spec name)."""
    import torch
    from megatron.core.models.gpt import gpt_layer_specs
    from megatron.core.transformer import TransformerConfig
    from megatron.core.transformer.transformer_layer import TransformerLayer
    from torch.nn import functional as F

    use_te = dev.type == "cuda" and importlib.util.find_spec("transformer_engine") is not None
    spec = (gpt_layer_specs.get_gpt_layer_with_transformer_engine_spec() if use_te
            else gpt_layer_specs.get_gpt_layer_local_spec())
    config = TransformerConfig(
        num_layers=1, hidden_size=shape.hidden_size, num_attention_heads=shape.num_attention_heads,
        num_query_groups=shape.num_query_groups, kv_channels=shape.kv_channels,
        ffn_hidden_size=shape.ffn_hidden_size, gated_linear_unit=shape.swiglu,
        activation_func=F.silu if shape.swiglu else F.gelu, bias_activation_fusion=False,
        params_dtype=torch_dtype, bf16=torch_dtype == torch.bfloat16, fp16=torch_dtype == torch.float16,
        pipeline_dtype=torch_dtype, use_cpu_initialization=dev.type == "cpu",
        hidden_dropout=0.0, attention_dropout=0.0)
    # cast wholly to the job's precision, as Megatron's Float16Module does (the local spec's norms
    # are built in fp32, which CUDA refuses beside bf16 inputs)
    layer = TransformerLayer(config, spec.submodules, layer_number=1).to(device=dev, dtype=torch_dtype)
    s, h = shape.seq_length, shape.hidden_size
    # The local spec needs an explicit mask on CPU (its default mask is built on "cuda").
    mask = None if use_te else torch.triu(torch.ones(1, 1, s, s, dtype=torch.bool, device=dev), diagonal=1)

    def make_step(mbs: int):
        x = torch.randn(s, mbs, h, device=dev, dtype=torch_dtype, requires_grad=True)
        grad = torch.randn_like(x)

        def step():
            out = layer(hidden_states=x, attention_mask=mask)
            (out[0] if isinstance(out, tuple) else out).backward(grad)
        return step
    return make_step, "transformer-engine" if use_te else "local"


@contextlib.contextmanager
def _megatron_runtime(on_cuda: bool) -> Iterator[None]:
    """A world-of-one process group and megatron's model-parallel state, created only if
    absent and torn down after. On a CPU-only torch, megatron-core 0.16.1's local layers
    allocate on ``torch.cuda.current_device()`` and fork the CUDA RNG tracker: both are
    redirected for the duration and restored afterwards."""
    import torch
    import torch.distributed as dist
    from megatron.core import parallel_state, tensor_parallel
    from megatron.core.tensor_parallel import random as tp_random

    own_group = not dist.is_initialized()
    if own_group:
        dist.init_process_group("nccl" if on_cuda else "gloo", store=dist.HashStore(), rank=0, world_size=1)
    own_state = not parallel_state.model_parallel_is_initialized()
    if own_state:
        parallel_state.initialize_model_parallel(1, 1)
    saved = (torch.cuda.current_device, tp_random._CUDA_RNG_STATE_TRACKER,
             tp_random._CUDA_RNG_STATE_TRACKER_INITIALIZED)
    if on_cuda:
        tensor_parallel.model_parallel_cuda_manual_seed(1234)
    else:
        torch.cuda.current_device = lambda: torch.device("cpu")
        tp_random._CUDA_RNG_STATE_TRACKER = _cpu_rng_tracker(tp_random)
        tp_random._CUDA_RNG_STATE_TRACKER_INITIALIZED = True
    try:
        yield
    finally:
        (torch.cuda.current_device, tp_random._CUDA_RNG_STATE_TRACKER,
         tp_random._CUDA_RNG_STATE_TRACKER_INITIALIZED) = saved
        if own_state:
            parallel_state.destroy_model_parallel()
        if own_group:
            dist.destroy_process_group()


def _cpu_rng_tracker(tp_random):
    class CpuRNGStatesTracker(tp_random.CudaRNGStatesTracker):
        """fork() is a no-op: dropout (zero here) draws from the default CPU generator."""

        @contextlib.contextmanager
        def fork(self, name="model-parallel-rng"):
            yield
    return CpuRNGStatesTracker()



def main_profile(shape: ModelShape, micro_batch_sizes: Sequence[int], gpu_type: str | None,
                 out_path: str | Path | None, dtype: str | None = None) -> LayerProfile:
    """What ``pipeswift profile`` does: profile the layer on this machine's GPU (else the CPU),
    label it with the GPU type it ran on, write the file.

    Args:
        shape: the job's model shape (parsed from its Megatron arguments).
        micro_batch_sizes: candidate micro-batch sizes.
        gpu_type: the hardware-table key to file the profile under; None: the built-in type
            the device's name and memory match, else the device's own name. On the CPU only
            None or "cpu" is accepted; on a GPU the table type of the device, when it is one.
        out_path: TOML file to write, or None to only return the profile.
        dtype: precision to measure in on a GPU (the job's: "bf16", "fp16", "fp32"); default
            bf16. A CPU run is always fp32.

    Returns:
        The LayerProfile as written.

    Raises:
        ProfileLabelError: ``gpu_type`` names a GPU this machine is not (checked before
            measuring). ValueError: bad arguments.
    """
    dev = _resolve_device(None)
    label = profile_label(gpu_type, *_device_name_mem(dev))  # refuse a mislabel before measuring
    profile = profile_layer(shape, micro_batch_sizes, device=str(dev), dtype=dtype if dev.type == "cuda" else None)
    profile = replace(profile, gpu_type=label)
    if out_path is not None:
        write_profile_toml(profile, out_path)
        log.info("wrote layer profile for %s (%s, %s) to %s", profile.gpu_type, profile.backend,
                 profile.dtype, out_path)
    return profile


def profile_label(gpu_type: str | None, device_name: str | None, mem_gib: float) -> str:
    """The gpu_type to file a profile under.

    Args:
        gpu_type: what the user asked for (``--gpu-type``), or None.
        device_name: the CUDA device's name (``torch.cuda.get_device_name``); None on the CPU.
        mem_gib: the device's memory (picks among a family's sizes).

    Returns:
        "cpu" on the CPU; on a GPU ``gpu_type`` when given, else the built-in type the device
        is, else the device's own name.

    Raises:
        ProfileLabelError: a GPU type named on the CPU, or a built-in type other than the one
            the device is.
    """
    if device_name is None:
        if gpu_type and gpu_type.lower() != CPU_GPU_TYPE:
            raise ProfileLabelError(
                f"--gpu-type {gpu_type}: this machine has no GPU, so the layer ran on the CPU in fp32 and "
                f"says nothing about GPU type {gpu_type}; run pipeswift profile on a {gpu_type} node, or leave "
                f"--gpu-type out to write a profile labelled '{CPU_GPU_TYPE}' (structure only)")
        return CPU_GPU_TYPE
    known = gpu_type_for_device(device_name, mem_gib)
    if gpu_type and known and gpu_type.lower() != known.lower() and gpu_type.lower() in {
            name.lower() for name in builtin_gpu_types()}:
        raise ProfileLabelError(
            f"--gpu-type {gpu_type}: this machine's GPU is a {device_name} ({known}); run pipeswift "
            f"profile on a {gpu_type} node, or leave --gpu-type out to file it under {known}")
    return gpu_type or known or device_name
