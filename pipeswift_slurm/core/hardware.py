"""GPU types: peak speed, memory, interconnect, achieved-efficiency curve and startup cost.

Owns the built-in table and its TOML overrides (``[gpu."NAME"]`` tables with any of the
GpuType fields; a new name adds a type). Pure data plus a loader; no other imports from
the package. Sources for the built-in numbers: NVIDIA data sheets (dense 16-bit tensor
TFLOP/s without sparsity, HBM size and bandwidth, NVLink bandwidth per GPU) and DGX/HGX
reference designs (one InfiniBand NIC per GPU). The efficiency constants are fitted to the
published Megatron-LM throughputs in ``tests/data/fidelity`` (see README, "Fidelity"):
a grid search of (eff_max, work_half_gflop) minimising the median absolute error per GPU
type (A100-80GB: 18 rows, H100-80GB: 12 rows; A100-40GB copies A100-80GB; H200 takes
H100's values, slightly raised for its faster memory; V100 has no usable row and keeps
an estimate from the 2019 Megatron-LM 30%-of-peak figure).
"""

from __future__ import annotations

import re
import tomllib
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Optional, Union


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

    def efficiency(self, work_gflop: float) -> float:
        """Achieved fraction of peak for a layer whose per-GPU forward work is ``work_gflop``."""
        return self.eff_max * work_gflop / (work_gflop + self.work_half_gflop)


_BUILTIN = (
    GpuType("V100-32GB", peak_tflops=125, fp32_tflops=15.7, mem_gib=32, hbm_gbps=900,
            nvlink_gbps=130, inter_node_gbps=12.5, eff_max=0.52, work_half_gflop=6.0, startup_s=120,
            load_s_per_bparam=4.0),
    GpuType("A100-40GB", peak_tflops=312, fp32_tflops=156, mem_gib=40, hbm_gbps=1555,
            nvlink_gbps=240, inter_node_gbps=25, eff_max=0.70, work_half_gflop=5.0),
    GpuType("A100-80GB", peak_tflops=312, fp32_tflops=156, mem_gib=80, hbm_gbps=2039,
            nvlink_gbps=240, inter_node_gbps=25, eff_max=0.70, work_half_gflop=5.0),
    GpuType("H100-80GB", peak_tflops=989, fp32_tflops=494, mem_gib=80, hbm_gbps=3350,
            nvlink_gbps=360, inter_node_gbps=50, eff_max=0.78, work_half_gflop=120.0, startup_s=75),
    GpuType("H200-141GB", peak_tflops=989, fp32_tflops=494, mem_gib=131.3, hbm_gbps=4800,
            nvlink_gbps=360, inter_node_gbps=50, eff_max=0.80, work_half_gflop=120.0, startup_s=75),
)
DEFAULT_GPU_TYPE = "A100-80GB"


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


def _coerce(path: str, name: str, key: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
        raise HardwareError("%s: gpu.%s.%s must be a non-negative number (got %r)" % (path, name, key, value))
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
    try:
        data = tomllib.loads(Path(path).read_text())
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise HardwareError("%s: cannot read hardware file: %s" % (path, exc)) from None
    known = {f.name for f in fields(GpuType)} - {"name"}
    for name, table in (data.get("gpu") or {}).items():
        if not isinstance(table, dict):
            raise HardwareError("%s: gpu.%s must be a table" % (path, name))
        unknown = set(table) - known
        if unknown:
            raise HardwareError("%s: gpu.%s: unknown key(s) %s; known: %s"
                                % (path, name, ", ".join(sorted(unknown)), ", ".join(sorted(known))))
        values = {k: _coerce(str(path), name, k, v) for k, v in table.items()}
        if name in types:
            types[name] = replace(types[name], **values)  # type: ignore[arg-type]
        else:
            try:
                types[name] = GpuType(name=name, **values)
            except TypeError as exc:
                raise HardwareError("%s: gpu.%s: %s" % (path, name, exc)) from None
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
