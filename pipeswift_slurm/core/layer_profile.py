"""Whether a measured layer profile (``pipeswift profile``) may stand in for the GPU table:
the GPU type it ran on, its precision and its layer shape must be the ones predicted for.
Pure: the profile is read duck-typed (``core.profile_file.LayerProfile``'s fields).
"""

from __future__ import annotations

from typing import Any

from pipeswift_slurm.core.model import JobProfile

CPU_GPU_TYPE = "cpu"
LAYER_SHAPE_KEYS = ("hidden_size", "seq_length", "num_attention_heads", "num_query_groups", "kv_channels",
                    "ffn_hidden_size", "swiglu")
"""The ModelShape fields that fix one transformer layer's work (layer count and vocab aside):
a measured layer profile stands in for the table only for a job with all of them equal."""


class LayerProfileMismatch(ValueError):
    """A measured layer profile of another GPU type, precision or layer shape; the message
    names the file, what differs and what to do."""


def measured_on_cpu(layer_profile: Any) -> bool:
    """A profile measured on the CPU (``gpu_type`` "cpu" or a ``device`` that starts with
    "cpu"), whatever its label says: it never describes a GPU type."""
    return bool(layer_profile.gpu_type.lower() == CPU_GPU_TYPE or layer_profile.device.lower().startswith(CPU_GPU_TYPE))


def layer_profile_mismatch(layer_profile: Any, gpu_name: str, job: JobProfile | None = None) -> str | None:
    """Why ``layer_profile`` cannot stand in for the table on ``gpu_name`` (for ``job`` when
    given: its precision and layer shape), or None when it can; a profile ``measured_on_cpu``
    describes no GPU type.
    """
    lp = layer_profile
    if lp.gpu_type.lower() != gpu_name.lower() or measured_on_cpu(lp) != (gpu_name.lower() == CPU_GPU_TYPE):
        return f"it was measured on {lp.device} (filed as GPU type {lp.gpu_type!r}), not on GPU type {gpu_name}"
    if job is None:
        return None
    if lp.dtype != job.plan.precision:
        return f"it was measured in {lp.dtype}; the job trains in {job.plan.precision}"
    differ = [f"{key} {getattr(lp, key)} (job: {getattr(job.shape, key)})"
              for key in LAYER_SHAPE_KEYS if getattr(lp, key) != getattr(job.shape, key)]
    if differ:
        return "it measured another layer shape: " + ", ".join(differ)
    return None


def profile_for_gpu(layer_profile: Any, gpu_name: str) -> Any:
    """``layer_profile`` where it was measured on ``gpu_name`` (a site-wide profile stands in
    for the table on that GPU type only), else None; None stays None."""
    if layer_profile is None or layer_profile_mismatch(layer_profile, gpu_name) is not None:
        return None
    return layer_profile


def layer_profile_refusal(layer_profile: Any, reason: str, gpu_name: str) -> str:
    """One line for a refused layer profile: which file, what differs, what to do."""
    source = getattr(layer_profile, "source", "") or "layer profile"
    return (f"{source}: {reason}; measure the job's own layer on a {gpu_name} node (pipeswift profile"
            f" --out FILE -- <the job's Megatron arguments>) or leave the layer profile out")
