"""The layer-profile file: what one profiling run measured (``LayerProfile``) and its TOML
form (``write_profile_toml`` / ``read_profile_toml``, ``format_version = 1``).

A profile records the device it ran on (``device``, and ``gpu_type``: the hardware-table
key of that GPU, or "cpu"), the precision (``dtype``) and the layer shape, so that the cost
model can refuse a profile of another GPU type, precision or shape
(``core.layer_profile.layer_profile_mismatch``). Pure data and text: no torch, so the CLI,
the controller and a job's launcher (the site model names the site's profile) read
profiles on any machine.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pipeswift_slurm.core.files import read_plain
from pipeswift_slurm.core.layer_profile import LAYER_SHAPE_KEYS
from pipeswift_slurm.core.model import ModelShape

FORMAT_VERSION = 1
MAX_BYTES = 1 << 20  # a profile is a few hundred bytes; a job may be pointed at any file
# every number a profile holds (ms, counts, sizes): a tiny or huge one is a typo that turns
# a prediction into 0, inf or nan
MIN_PROFILE_NUMBER, MAX_PROFILE_NUMBER = 1e-6, 1e9
BACKEND_MEGATRON = "megatron-core"
BACKEND_TORCH = "torch"
DTYPES = ("bf16", "fp16", "fp32")


class ProfileFormatError(ValueError):
    """A profile file that cannot be read; the message names the file and the key."""


@dataclass(frozen=True)
class MicroBatchTiming:
    """One micro-batch size: median fwd+bwd milliseconds of one layer and achieved TFLOP/s."""

    micro_batch_size: int
    fwd_bwd_ms: float
    tflops: float


@dataclass(frozen=True)
class LayerProfile:
    """What one profiling run measured for one layer shape on one device.

    ``gpu_type`` is the hardware-table key of the GPU it ran on (e.g. "H200-141GB"; "cpu"
    on a CPU run), which the cost model checks against the GPU type it predicts for;
    ``device`` describes the device in words ("cuda:0 (NVIDIA H200)", "cpu (8 threads)");
    ``dtype`` is the precision it ran in; ``backend`` is "megatron-core" or "torch";
    ``layer_spec`` says which implementation ran ("local", "transformer-engine", "sdpa").
    ``timings`` holds one entry per micro-batch size that ran (one that ran out of GPU
    memory is left out), sorted by micro-batch size. ``source`` is the file it was read
    from ("" when built in memory); it is not written and not compared.
    """

    gpu_type: str
    device: str
    backend: str
    layer_spec: str
    dtype: str
    hidden_size: int
    seq_length: int
    num_attention_heads: int
    num_query_groups: int
    kv_channels: int
    ffn_hidden_size: int
    swiglu: bool
    timings: tuple[MicroBatchTiming, ...]
    warmup: int = 2
    repeats: int = 5
    torch_version: str = ""
    source: str = field(default="", compare=False)

    @property
    def micro_batch_sizes(self) -> tuple[int, ...]:
        return tuple(t.micro_batch_size for t in self.timings)

    def fwd_bwd_ms(self, micro_batch_size: int) -> float:
        """Median fwd+bwd milliseconds of one layer at this micro-batch size (KeyError if absent)."""
        for timing in self.timings:
            if timing.micro_batch_size == micro_batch_size:
                return timing.fwd_bwd_ms
        raise KeyError(f"micro-batch size {micro_batch_size} was not profiled")

    def matches(self, shape: ModelShape) -> bool:
        """True when ``shape`` has this profile's per-layer shape (layer count and vocab aside)."""
        return _shape_fields(shape) == {k: getattr(self, k) for k in _SHAPE_TYPES}


_SHAPE_TYPES: dict[str, type] = {key: bool if key == "swiglu" else int for key in LAYER_SHAPE_KEYS}
_TOP_TYPES: dict[str, type] = {
    "gpu_type": str, "device": str, "backend": str, "layer_spec": str, "dtype": str,
    "warmup": int, "repeats": int, "torch_version": str}
_TIMING_TYPES: dict[str, type] = {"micro_batch_size": int, "fwd_bwd_ms": float, "tflops": float}


def _shape_fields(shape: ModelShape) -> dict[str, Any]:
    return {key: getattr(shape, key) for key in _SHAPE_TYPES}


def profile_to_dict(profile: LayerProfile) -> dict[str, Any]:
    """The file's structure as plain data (also what the bench script dumps as JSON)."""
    top = {key: getattr(profile, key) for key in _TOP_TYPES}
    return {"format_version": FORMAT_VERSION, **top,
            "shape": {key: getattr(profile, key) for key in _SHAPE_TYPES},
            "micro_batch": [{"micro_batch_size": t.micro_batch_size, "fwd_bwd_ms": t.fwd_bwd_ms,
                             "tflops": t.tflops} for t in profile.timings]}


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    return json.dumps(str(value))  # JSON string escapes are valid TOML basic-string escapes


def write_profile_toml(profile: LayerProfile, path: str | Path) -> None:
    """Write ``profile`` as TOML (format_version 1): top-level keys, a [shape] table and one
    [[micro_batch]] table per micro-batch size."""
    data = profile_to_dict(profile)
    lines = ["# pipeswift layer profile: median fwd+bwd time of one transformer layer"]
    lines += [f"{key} = {_toml_value(value)}" for key, value in data.items()
              if key not in ("shape", "micro_batch")]
    lines += ["", "[shape]"] + [f"{k} = {_toml_value(v)}" for k, v in data["shape"].items()]
    for timing in data["micro_batch"]:
        lines += ["", "[[micro_batch]]"] + [f"{k} = {_toml_value(v)}" for k, v in timing.items()]
    Path(path).write_text("\n".join(lines) + "\n", encoding="utf-8")


def read_profile_toml(path: str | Path) -> LayerProfile:
    """Read a profile written by ``write_profile_toml``.

    Raises:
        ProfileFormatError: unreadable TOML, wrong format_version, or a missing or mistyped key
            (the message names the file and the key, e.g. ``shape.hidden_size``).
    """
    import tomllib  # here, not at the top: GPU boxes may write profiles on an older Python

    try:
        data = tomllib.loads(read_plain(path, MAX_BYTES).decode("utf-8"))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise ProfileFormatError(f"{path}: cannot read profile: {exc}") from exc
    version = data.get("format_version")
    if version != FORMAT_VERSION:
        raise ProfileFormatError(f"{path}: key 'format_version' must be {FORMAT_VERSION}, got {version!r}")
    top = _typed(data, _TOP_TYPES, path, "")
    if top["dtype"] not in DTYPES:
        raise ProfileFormatError(f"{path}: key 'dtype' must be one of {', '.join(DTYPES)}, got {top['dtype']!r}")
    shape = _typed(data.get("shape"), _SHAPE_TYPES, path, "shape.")
    rows = data.get("micro_batch")
    if not isinstance(rows, list) or not rows:
        raise ProfileFormatError(f"{path}: key 'micro_batch' must be a non-empty array of tables")
    timings = tuple(MicroBatchTiming(**_typed(row, _TIMING_TYPES, path, f"micro_batch[{i}]."))
                    for i, row in enumerate(rows))
    return LayerProfile(**top, **shape, timings=tuple(sorted(timings, key=lambda t: t.micro_batch_size)),
                        source=str(path))


def _typed(table: Any, types: dict[str, type], path: str | Path, prefix: str) -> dict[str, Any]:
    """Check that ``table`` has every key of ``types`` with the right type (ints pass as floats)
    and that numbers are within MIN/MAX_PROFILE_NUMBER (warm-up may be 0)."""
    if not isinstance(table, dict):
        raise ProfileFormatError(f"{path}: key '{prefix.rstrip('.') or '<root>'}' must be a table")
    out = {}
    for key, kind in types.items():
        if key not in table:
            raise ProfileFormatError(f"{path}: key '{prefix}{key}' is missing")
        value = table[key]
        if not _has_type(value, kind):
            raise ProfileFormatError(f"{path}: key '{prefix}{key}' must be {kind.__name__}, "
                                     f"got {type(value).__name__} {value!r}")
        if kind in (int, float) and not (MIN_PROFILE_NUMBER <= value <= MAX_PROFILE_NUMBER
                                         or (key == "warmup" and value == 0)):  # nan and inf fail too
            raise ProfileFormatError(f"{path}: key '{prefix}{key}' must be from {MIN_PROFILE_NUMBER:g} to"
                                     f" {MAX_PROFILE_NUMBER:g}, got {value!r}")
        out[key] = float(value) if kind is float else value
    return out


def _has_type(value: Any, kind: type) -> bool:
    if kind is bool or isinstance(value, bool):
        return kind is bool and isinstance(value, bool)
    if kind is float:
        return isinstance(value, (int, float))
    return isinstance(value, kind)

