"""GPU types: peak speed, memory, interconnect, achieved-efficiency curve and startup cost.

Owns the built-in table and its TOML overrides (``[gpu."NAME"]`` tables with any of the
GpuType fields; a new name adds a type), and which built-in type a CUDA device is. Pure data
plus a loader; no other imports from the package. Sources for the built-in numbers: NVIDIA
data sheets (dense 16-bit tensor TFLOP/s without sparsity, HBM size and bandwidth, NVLink
bandwidth per GPU) and DGX/HGX reference designs (one InfiniBand NIC per GPU), named row by
row in the table. The efficiency constants (``eff_max``, ``work_half_gflop``: what a layer's
GEMMs and attention achieve; the cost model adds elementwise work and communication on top)
are fitted by ``bench/fit_efficiency.py`` to published Megatron step times, each on every
other row of its GPU type (the other rows held out): A100-80GB on the 18 A100 rows of
``tests/data/fidelity/published_megatron.csv`` (NAR21, KOR22; a grid of both constants);
H100-80GB on the 54 H100 rows and GB200-186GB on the 9 GB200 rows of the shared
``megatron_published.csv`` (NVIDIA DGX Cloud recipes; ``eff_max`` only: every published
layer is far past the knee). A100-40GB copies A100-80GB; H200 takes H100's values, slightly
raised for its faster memory; B200 takes GB200's; V100 has no usable row and keeps an
estimate from the 2019 Megatron-LM 30%-of-peak figure. Blackwell's ``work_half_gflop`` is
H100's scaled by peak (the same fixed per-kernel overhead on a faster GPU needs that much
more work to be hidden).
"""

from __future__ import annotations

import math
import re
import tomllib
from dataclasses import MISSING, dataclass, fields, replace
from pathlib import Path
from typing import Any, Optional, Union

from pipeswift_slurm.core.files import read_plain


class HardwareError(ValueError):
    """Unknown GPU type or a malformed hardware file."""


@dataclass(frozen=True)
class GpuType:
    """One GPU model as the cost model sees it.

    Attributes:
        name: e.g. "A100-80GB".
        peak_tflops: dense bf16/fp16 tensor-core peak, TFLOP/s.
        fp32_tflops: peak for fp32 training (TF32 where the GPU has it), TFLOP/s.
        mem_gib: device memory, GiB.
        hbm_gbps: memory bandwidth, GB/s (optimizer step is memory bound).
        nvlink_gbps: intra-node bandwidth per GPU usable by a ring collective, GB/s.
        inter_node_gbps: inter-node bandwidth per GPU (one NIC per GPU), GB/s.
        eff_max: largest achievable fraction of peak for transformer-layer GEMMs.
        work_half_gflop: per-GPU forward work of one layer and micro-batch (GFLOP) at
            which half of ``eff_max`` is reached: achieved = eff_max * w / (w + w_half).
        startup_s: fixed job start cost (allocation to first iteration: launch,
            process-group init, data loader), s.
        load_s_per_bparam: checkpoint load cost per billion parameters, s.
        reserved_gib: memory not available to the model (CUDA context, allocator slack).
        latency_s: per-message latency of a collective or p2p transfer, s.
        gpus_per_node: GPUs in one node of the reference design (8 in DGX/HGX; 4 in a
            GB200 NVL72 compute tray), for callers that are not told a node size.
        nvlink_domain_gpus: GPUs that one NVLink fabric joins (8 in DGX/HGX, where it is the
            node; 72 in a GB200 NVL72 rack). Where a layout is known to stay inside domains
            (the published GB200 runs), a domain is laid out as one node.
    """

    name: str
    peak_tflops: float
    fp32_tflops: float
    mem_gib: float
    hbm_gbps: float
    nvlink_gbps: float
    inter_node_gbps: float
    eff_max: float = 0.6
    work_half_gflop: float = 20.0
    startup_s: float = 90.0
    load_s_per_bparam: float = 2.0
    reserved_gib: float = 3.0
    latency_s: float = 20e-6
    gpus_per_node: int = 8
    nvlink_domain_gpus: int = 8

    def peak_tflops_for(self, precision: str) -> float:
        """The data-sheet peak a job training in ``precision`` can reach: fp32 (TF32 where the
        GPU has it) or the bf16/fp16 tensor peak."""
        return self.fp32_tflops if precision == "fp32" else self.peak_tflops

    def efficiency(self, work_gflop: float) -> float:
        """Achieved fraction of peak for a layer whose per-GPU forward work is ``work_gflop``."""
        return self.eff_max * work_gflop / (work_gflop + self.work_half_gflop)


# One row per GPU type, each with its sources. Conventions for every row: peak_tflops is the
# data sheet's dense BF16/FP16 tensor figure (sheets quote "with sparsity", i.e. 2x, for
# Ampere and later: halved here); fp32_tflops is dense TF32 (FP32 on V100); mem_gib is the
# nominal GB / 2**30; nvlink_gbps is 80 % of the one-direction NVLink bandwidth per GPU (half
# the sheet's bidirectional figure), what a ring all-reduce achieves; inter_node_gbps is one
# NIC per GPU as in the DGX/HGX reference design.
_BUILTIN = (
    # V100 SXM2 32GB data sheet (2018): 125 TFLOP/s tensor, 15.7 FP32, 900 GB/s HBM2, NVLink 2
    # 300 GB/s bidirectional; DGX-1/DGX-2: 100 Gb/s EDR InfiniBand per GPU.
    GpuType("V100-32GB", peak_tflops=125, fp32_tflops=15.7, mem_gib=32, hbm_gbps=900,
            nvlink_gbps=130, inter_node_gbps=12.5, eff_max=0.52, work_half_gflop=6.0, startup_s=120,
            load_s_per_bparam=4.0),
    # A100 data sheet (2021): BF16 312 dense, TF32 156 dense, 40GB HBM2 1,555 GB/s, NVLink 3
    # 600 GB/s bidirectional; DGX A100: 200 Gb/s HDR InfiniBand per GPU.
    GpuType("A100-40GB", peak_tflops=312, fp32_tflops=156, mem_gib=40, hbm_gbps=1555,
            nvlink_gbps=240, inter_node_gbps=25, eff_max=0.725, work_half_gflop=80.0),
    # A100 data sheet (2021), 80GB SXM: as the 40GB, with HBM2e at 2,039 GB/s; DGX A100 as above.
    # eff_max and work_half_gflop fitted on every other A100 row of tests/data/fidelity (9 of 18).
    GpuType("A100-80GB", peak_tflops=312, fp32_tflops=156, mem_gib=80, hbm_gbps=2039,
            nvlink_gbps=240, inter_node_gbps=25, eff_max=0.725, work_half_gflop=80.0),
    # H100 SXM data sheet: BF16 1,979 with sparsity (989 dense), TF32 989 with sparsity (494
    # dense), 80GB HBM3 3.35 TB/s, NVLink 4 900 GB/s bidirectional; DGX H100: 400 Gb/s NDR per GPU.
    # eff_max fitted on every other H100 row of the shared file (27 of 54); the knee is release 1's.
    GpuType("H100-80GB", peak_tflops=989, fp32_tflops=494, mem_gib=80, hbm_gbps=3350,
            nvlink_gbps=360, inter_node_gbps=50, eff_max=0.61, work_half_gflop=120.0, startup_s=75),
    # H200 SXM data sheet: H100's compute and NVLink, 141GB HBM3e at 4.8 TB/s; HGX H200: 400 Gb/s
    # NDR per GPU.
    GpuType("H200-141GB", peak_tflops=989, fp32_tflops=494, mem_gib=131.3, hbm_gbps=4800,
            nvlink_gbps=360, inter_node_gbps=50, eff_max=0.63, work_half_gflop=120.0, startup_s=75),
    # HGX B200 (nvidia.com/en-us/data-center/hgx, 8 GPUs): FP16/BF16 36 PFLOP/s and TF32 18
    # PFLOP/s with sparsity (2,250 and 1,125 TFLOP/s dense per GPU), 180GB HBM3e per GPU
    # (MLPerf system description "B200-SXM-180GB"), NVLink 5 1.8 TB/s bidirectional per GPU
    # (14.4 TB/s per 8); HBM3e 7.7 TB/s (DGX B200 quotes 64 TB/s per 8; the driver's bus width
    # and clock give 7.68, pytorch/ao#4002); DGX B200: 400 Gb/s ConnectX-7 per GPU.
    # No published Megatron row to fit: efficiency as GB200's (same Blackwell GPU), knee scaled by peak.
    GpuType("B200-180GB", peak_tflops=2250, fp32_tflops=1125, mem_gib=167.6, hbm_gbps=7700,
            nvlink_gbps=720, inter_node_gbps=50, eff_max=0.505, work_half_gflop=273.0, startup_s=75),
    # GB200 NVL72 (nvidia.com/en-us/data-center/gb200-nvl72, 72 GPUs): FP16/BF16 360 PFLOP/s
    # and TF32 180 PFLOP/s with sparsity (2,500 and 1,250 TFLOP/s dense per GPU), up to 13.4 TB
    # HBM3e at 576 TB/s (186GB and 8 TB/s per GPU), NVLink 5 1.8 TB/s bidirectional per GPU.
    # A Slurm node is one compute tray: two GB200 superchips, 4 GPUs. Between the 18 trays of one
    # rack NVLink continues (nvlink_domain_gpus 72); inter_node_gbps is the 400 Gb/s NIC per GPU
    # that leaves the rack (set it to nvlink_gbps in a hardware file when jobs stay inside one
    # NVL72 rack).
    # eff_max fitted on every other GB200 row of the shared file (bench/fit_efficiency.py);
    # work_half_gflop is H100's x 2500/989.
    GpuType("GB200-186GB", peak_tflops=2500, fp32_tflops=1250, mem_gib=173.2, hbm_gbps=8000,
            nvlink_gbps=720, inter_node_gbps=50, eff_max=0.505, work_half_gflop=303.0, startup_s=75,
            gpus_per_node=4, nvlink_domain_gpus=72),
)
DEFAULT_GPU_TYPE = "A100-80GB"
# bandwidths, peaks, memory and efficiency: a 0 there is a typo that divides by zero
POSITIVE_KEYS = frozenset({"peak_tflops", "fp32_tflops", "mem_gib", "hbm_gbps", "nvlink_gbps", "inter_node_gbps",
                           "eff_max"})
MAX_HARDWARE_NUMBER = 1e6  # in any key's unit; the largest real figure is a few thousand (hbm_gbps)
MAX_HARDWARE_BYTES = 1 << 20  # a hardware table is a few kB; a job may be pointed at any file


def builtin_gpu_types() -> dict[str, GpuType]:
    return {g.name: g for g in _BUILTIN}


def gpu_type_for_device(device_name: str, mem_gib: float = 0.0) -> Optional[str]:
    """The built-in type a CUDA device is, from its name and memory, or None if none is.

    The family is the first of the table's name prefixes ("H200", "A100", ...) that occurs in
    ``device_name`` as a word (so "NVIDIA A100-SXM4-80GB" is an A100, "NVIDIA GB200" is not a
    B200); among that family's sizes the one nearest ``mem_gib`` wins (a device reports a
    little less than its nominal size).
    """
    types = builtin_gpu_types()
    families: dict[str, list[GpuType]] = {}
    for gpu in types.values():
        families.setdefault(gpu.name.split("-")[0], []).append(gpu)
    for family, members in families.items():
        if re.search(r"(?<![A-Za-z0-9])%s(?![0-9])" % re.escape(family), device_name, re.IGNORECASE):
            return min(members, key=lambda g: abs(g.mem_gib - mem_gib)).name
    return None


def _coerce(path: str, name: str, key: str, value: object) -> Union[int, float]:
    if key in ("gpus_per_node", "nvlink_domain_gpus"):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise HardwareError("%s: gpu.%s.%s must be a positive integer (got %r)" % (path, name, key, value))
        return value
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
        raise HardwareError("%s: gpu.%s.%s must be a finite non-negative number (got %r)" % (path, name, key, value))
    if key in POSITIVE_KEYS and not value >= (0.01 if key == "eff_max" else 1e-3):
        raise HardwareError("%s: gpu.%s.%s must be at least %g (got %r): every time the model predicts divides by it"
                            % (path, name, key, 0.01 if key == "eff_max" else 1e-3, value))
    if key == "eff_max" and value > 1:
        raise HardwareError("%s: gpu.%s.eff_max is a fraction of peak: at most 1 (got %r)" % (path, name, value))
    if value > MAX_HARDWARE_NUMBER:
        raise HardwareError("%s: gpu.%s.%s must be at most %g (got %r): no GPU figure comes near it"
                            % (path, name, key, MAX_HARDWARE_NUMBER, value))
    return float(value)


def load_gpu_types(path: Optional[Union[str, Path]] = None) -> dict[str, GpuType]:
    """Built-in GPU types, overridden and extended by a TOML file when ``path`` is given.

    A table for a known name overrides only the keys it sets; a new name must set every
    field except those with defaults.

    Raises:
        HardwareError: unreadable file, unknown key, wrong type, or a new type missing keys.
    """
    types = builtin_gpu_types()
    if path is None:
        return types
    try:  # a FIFO or a device named there must not hang a job's start
        data = tomllib.loads(read_plain(path, MAX_HARDWARE_BYTES).decode("utf-8"))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise HardwareError("%s: cannot read hardware file: %s" % (path, exc)) from None
    known = {f.name for f in fields(GpuType)} - {"name"}
    if set(data) - {"gpu"} or not isinstance(data.get("gpu", {}), dict):
        raise HardwareError("%s: a hardware file holds [gpu.\"NAME\"] tables only (found %s)"
                            % (path, ", ".join(sorted(k if k != "gpu" else "gpu = %r" % data[k] for k in data))))
    for name, table in (data.get("gpu") or {}).items():
        if not isinstance(table, dict):
            raise HardwareError("%s: gpu.%s must be a table" % (path, name))
        unknown = set(table) - known
        if unknown:
            raise HardwareError("%s: gpu.%s: unknown key(s) %s; known: %s"
                                % (path, name, ", ".join(sorted(unknown)), ", ".join(sorted(known))))
        values: dict[str, Any] = {k: _coerce(str(path), name, k, v) for k, v in table.items()}
        if name in types:
            types[name] = replace(types[name], **values)
        else:
            missing = [f.name for f in fields(GpuType) if f.name not in values and f.name != "name"
                       and f.default is f.default_factory is MISSING]
            if missing:
                raise HardwareError("%s: gpu.%s: a new GPU type needs %s (or name a known type to change some of"
                                    " its values: %s)" % (path, name, ", ".join(missing), ", ".join(sorted(types))))
            types[name] = GpuType(name=name, **values)
    return types


def get_gpu_type(name: str, path: Optional[Union[str, Path]] = None) -> GpuType:
    """Look up a GPU type by name (case-insensitive).

    Raises:
        HardwareError: unknown name (the message lists the known ones).
    """
    types = load_gpu_types(path)
    for key, gpu in types.items():
        if key.lower() == name.lower():
            return gpu
    raise HardwareError("unknown GPU type %r; known: %s (add one with a [gpu.\"NAME\"] table in a"
                        " hardware TOML file)" % (name, ", ".join(types)))
