"""Compare the cost model with published Megatron measurements.

Two CSV schemas: the repository's ``tests/data/fidelity/published_megatron.csv`` (schema in
its SOURCES.md; model TFLOP/s per GPU, and the iteration time where a row's notes state it;
rows without a stated shape are skipped, rows that report hardware FLOPs with full
recompute, 4 passes instead of 3, are converted to model FLOPs x 3/4) and the shared ``megatron_published.csv`` of NVIDIA's DGX Cloud recipes (schema
and caveats in its SOURCES.md; step time per iteration). Each row becomes the Megatron
command line of its stated config; the cost model's iteration time is compared with the
row's. Used by ``bench/fidelity.py`` and its regression test. Reads one file; otherwise pure.
"""

from __future__ import annotations

import csv
import re
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from pipeswift_slurm.core.costmodel import CostModel
from pipeswift_slurm.core.error_band import MIN_ROWS, band_value, gpu_family, group_name, layout_group
from pipeswift_slurm.core.flops import flops_per_iteration
from pipeswift_slurm.core.hardware import HardwareError, get_gpu_type
from pipeswift_slurm.core.megatron import MegatronArgError, profile_from_argv
from pipeswift_slurm.core.model import ExecConfig


@dataclass(frozen=True)
class FidelityRow:
    source_id: str
    model: str
    gpu_type: str
    num_gpus: int
    config: str
    reported_tflops: float
    predicted_tflops: float
    mem_gib: float
    reported_step_s: float = 0.0
    predicted_step_s: float = 0.0
    layout: Optional[ExecConfig] = None

    @property
    def error(self) -> float:
        """Signed relative error of model TFLOP/s (predicted / reported - 1)."""
        return self.predicted_tflops / self.reported_tflops - 1.0

    @property
    def step_error(self) -> float:
        """Signed relative error of the iteration time (predicted / reported - 1); from TFLOP/s
        (reported / predicted - 1, the same model FLOPs per iteration) where no time is published."""
        if self.reported_step_s and self.predicted_step_s:
            return self.predicted_step_s / self.reported_step_s - 1.0
        return self.reported_tflops / self.predicted_tflops - 1.0


REQUIRED = ("num_layers", "hidden_size", "num_attention_heads", "seq_length", "global_batch_size",
            "num_gpus", "gpu_type", "reported_tflops_per_gpu")


def _int(rec: dict[str, str], key: str, default: int) -> int:
    text = (rec.get(key) or "").strip()
    return int(text) if text else default


def _argv(rec: dict[str, str]) -> list[str]:
    args = ["--num-layers", rec["num_layers"], "--hidden-size", rec["hidden_size"],
            "--num-attention-heads", rec["num_attention_heads"], "--seq-length", rec["seq_length"],
            "--max-position-embeddings", rec["seq_length"], "--vocab-size", rec["vocab_size"] or "51200",
            "--tensor-model-parallel-size", str(_int(rec, "tp", 1)),
            "--pipeline-model-parallel-size", str(_int(rec, "pp", 1)),
            "--context-parallel-size", str(_int(rec, "cp", 1)),
            "--micro-batch-size", str(_int(rec, "micro_batch_size", 1)),
            "--global-batch-size", rec["global_batch_size"], "--train-iters", "1",
            "--fp16" if rec.get("precision") == "fp16" else "--bf16"]
    if rec.get("ffn_hidden_size"):
        args += ["--ffn-hidden-size", rec["ffn_hidden_size"]]
    if rec.get("swiglu") == "true":
        args.append("--swiglu")
    groups = rec.get("num_query_groups") or rec["num_attention_heads"]
    if groups != rec["num_attention_heads"]:
        args += ["--group-query-attention", "--num-query-groups", groups]
    vp = _int(rec, "vp", 1)
    if vp > 1:
        args += ["--num-virtual-stages-per-pipeline-rank", str(vp)]
    if rec.get("recompute") in ("full", "selective"):
        args += ["--recompute-granularity", rec["recompute"]]
    if rec.get("sequence_parallel") == "yes":
        args.append("--sequence-parallel")
    if rec.get("distributed_optimizer") == "yes":
        args.append("--use-distributed-optimizer")
    return args


def _reported_model_tflops(rec: dict[str, str]) -> float:
    value = float(rec["reported_tflops_per_gpu"])
    if rec.get("flops_kind") == "hardware" and rec.get("recompute") == "full":
        value *= 3.0 / 4.0
    return value


def dgxc_recipe_flags(tp: int, nemo1_nemotron_340b: bool) -> list[str]:
    """The flags every NVIDIA DGX Cloud recipe run states (the shared file's SOURCES.md): the
    distributed optimizer with overlapped gradient reduction and parameter gathering,
    sequence parallelism and TP communication overlap where tp > 1; Nemotron-4 340B's NeMo 1.0
    run (v24.11.1) has no TP overlap and selective recompute (caveats 3 and 4; its NeMo 2.0
    runs, v25.04 and v25.05.05, add MegatronCommOverlapCallback(tp_comm_overlap=True) through
    the recipe's performance_mode)."""
    flags = ["--use-distributed-optimizer", "--overlap-grad-reduce", "--overlap-param-gather"]
    if tp > 1:
        flags.append("--sequence-parallel")
        if not nemo1_nemotron_340b:
            flags.append("--tp-comm-overlap")
    if nemo1_nemotron_340b:
        flags += ["--recompute-granularity", "selective"]
    return flags


def _recipe_flags(rec: dict[str, str]) -> list[str]:
    """Flags a row's CSV leaves "unknown" that its recipe states elsewhere: the repository's
    DGXC rows are runs of the NVIDIA dgxc-benchmarking recipes that the shared
    ``megatron_published.csv`` covers too (same step times), Nemotron-4 340B's being its
    NeMo 1.0 run (``dgxc_recipe_flags``)."""
    if rec["source_id"] != "DGXC":
        return []
    return dgxc_recipe_flags(_int(rec, "tp", 1), rec["model"].startswith("Nemotron-4 340B"))


def _reported_iter_time_s(rec: dict[str, str]) -> float:
    """The iteration time a row's source states (``reported_iter_time_s=X`` in its notes, the
    most direct value per the file's SOURCES.md), or 0.0 where it states none: then the step
    error comes from TFLOP/s, which for some sources count FLOPs differently (the DGX Cloud
    READMEs: attention without the causal half, Nemotron-4 without GQA)."""
    match = re.search(r"reported_iter_time_s=([0-9.]+)", rec.get("notes") or "")
    return float(match.group(1)) if match else 0.0


def compare(path: str | Path, hardware: Optional[str] = None) -> list[FidelityRow]:
    """Predicted vs reported model TFLOP/s for every row of the published-data CSV."""
    out = []
    with open(path, newline="", encoding="utf-8") as handle:
        for rec in csv.DictReader(handle):
            if any(not (rec.get(k) or "").strip() for k in REQUIRED):
                continue  # the source does not state the shape: nothing to compare
            gpus = int(rec["num_gpus"])
            profile = profile_from_argv(_argv(rec) + _recipe_flags(rec), world_size=gpus, gpus_per_node=8)
            cost = CostModel(get_gpu_type(rec["gpu_type"], hardware))
            est = cost.estimate(profile, profile.requested)
            step_s = _reported_iter_time_s(rec)
            out.append(FidelityRow(rec["source_id"], rec["model"], rec["gpu_type"], gpus, est.config.short(),
                                   _reported_model_tflops(rec), est.tflops_per_gpu, est.mem_gib,
                                   step_s, est.iter_time_s if step_s else 0.0, est.config))
    return out


# GPU names of the shared file -> built-in types (SOURCES.md: H100-80GB, GB200 NVL72).
SHARED_GPU_TYPES = {"H100": "H100-80GB", "GB200": "GB200-186GB",
                    # the same recipes publish these too (rows of this schema from elsewhere)
                    "B200": "B200-180GB", "H200": "H200-141GB", "A100": "A100-80GB"}


def shared_argv(rec: dict[str, str]) -> list[str]:
    """The Megatron command line of one row of the shared ``megatron_published.csv``, with
    what its SOURCES.md states for every row: BF16, the recipes' flags (``dgxc_recipe_flags``),
    and the embedding and the loss counted as pipeline stages where pp x vp does not divide
    the layers (caveat 5)."""
    layers, heads, tp, pp = int(rec["layers"]), rec["heads"], int(rec["tp"]), int(rec["pp"])
    vp = int(rec["vp"] or 1)
    args = ["--num-layers", str(layers), "--hidden-size", rec["hidden"], "--ffn-hidden-size", rec["ffn_hidden"],
            "--num-attention-heads", heads, "--seq-length", rec["seq_len"], "--max-position-embeddings",
            rec["seq_len"], "--vocab-size", rec["vocab"], "--tensor-model-parallel-size", str(tp),
            "--pipeline-model-parallel-size", str(pp), "--context-parallel-size", rec["cp"] or "1",
            "--micro-batch-size", rec["micro_batch"], "--global-batch-size", rec["global_batch"],
            "--train-iters", "1", "--bf16"]
    args += dgxc_recipe_flags(tp, rec["model"].startswith("Nemotron4-340B") and "v24.11.1" in rec["release"])
    if rec["activation"] == "swiglu":
        args.append("--swiglu")
    if rec["kv_heads"] and rec["kv_heads"] != heads:
        args += ["--group-query-attention", "--num-query-groups", rec["kv_heads"]]
    if vp > 1:
        args += ["--num-virtual-stages-per-pipeline-rank", str(vp)]
    if pp > 1 and layers % (pp * vp):
        args += ["--account-for-embedding-in-pipeline-split", "--account-for-loss-in-pipeline-split"]
    return args


@dataclass(frozen=True)
class Refused:
    """A published row the model could not estimate, and why."""

    model: str
    gpu_type: str
    num_gpus: int
    reason: str


def compare_shared(path: str | Path, hardware: Optional[str] = None) -> tuple[list[FidelityRow], list[Refused]]:
    """Predicted vs published step time for every row of the shared ``megatron_published.csv``.

    A GB200 row is laid out on its NVLink domain (``GpuType.nvlink_domain_gpus``, 72 GPUs of
    an NVL72 rack) as one node: tensor parallelism of 8 spans two 4-GPU trays over NVLink.
    Returns (estimated rows, refused rows with the reason)."""
    out, refused = [], []
    with open(path, newline="", encoding="utf-8") as handle:
        for rec in csv.DictReader(handle):
            gpus = int(rec["num_gpus"])
            try:
                gpu = get_gpu_type(SHARED_GPU_TYPES.get(rec["gpu"], rec["gpu"]), hardware)
                node = max(gpu.nvlink_domain_gpus, gpu.gpus_per_node)
                profile = profile_from_argv(shared_argv(rec), world_size=gpus, gpus_per_node=node)
            except (MegatronArgError, HardwareError) as exc:
                refused.append(Refused(rec["model"], rec["gpu"], gpus, str(exc)))
                continue
            est = CostModel(gpu).estimate(profile, profile.requested)
            step_s = float(rec["step_time_s"])
            flops = flops_per_iteration(profile.shape, profile.plan.global_batch_size)
            out.append(FidelityRow(rec["release"], rec["model"], gpu.name, gpus, est.config.short(),
                                   flops / (step_s * gpus) / 1e12, est.tflops_per_gpu, est.mem_gib,
                                   step_s, est.iter_time_s, est.config))
    return out, refused


def summary(rows: list[FidelityRow]) -> dict[str, Any]:
    """Median and max absolute relative error, overall and per GPU type and source."""
    def stats(items: list[FidelityRow]) -> dict[str, Any]:
        errs = [abs(r.error) for r in items]
        steps = [abs(r.step_error) for r in items]
        return {"rows": len(items), "median_abs_error": statistics.median(errs) if errs else None,
                "max_abs_error": max(errs, default=None),
                "mean_signed_error": statistics.fmean(r.error for r in items) if items else None,
                "median_abs_step_error": statistics.median(steps) if steps else None,
                "max_abs_step_error": max(steps, default=None)}

    return {"all": stats(rows),
            "by_gpu_type": {g: stats([r for r in rows if r.gpu_type == g]) for g in sorted({r.gpu_type for r in rows})},
            "by_source": {s: stats([r for r in rows if r.source_id == s]) for s in sorted({r.source_id for r in rows})}}


# GPU families whose error bands come from the shared file (it has rows of these only).
SHARED_FAMILIES = frozenset({"hopper", "blackwell"})


def band_rows(repo: list[FidelityRow], shared: list[FidelityRow]) -> list[FidelityRow]:
    """The rows the error bands come from: the shared file's for the families it covers
    (``SHARED_FAMILIES``: its recipes state every flag, and supersede the repository's older
    H100 recipes of the same models), the repository's for the other families."""
    return [r for r in shared if gpu_family(r.gpu_type) in SHARED_FAMILIES] + \
        [r for r in repo if gpu_family(r.gpu_type) not in SHARED_FAMILIES]


def band_table(rows: list[FidelityRow]) -> dict[tuple[str, bool, bool], dict[str, Any]]:
    """Per layout group (``core.error_band.layout_group``) of ``rows``: its rows, signed
    error range, largest |step time error| and band (``band_value``; None for a group of
    fewer than ``MIN_ROWS`` rows, which gets the default band)."""
    groups: dict[tuple[str, bool, bool], list[float]] = {}
    for r in rows:
        if r.layout is not None:
            groups.setdefault(layout_group(r.gpu_type, r.layout), []).append(r.step_error)
    return {key: {"group": group_name(key), "rows": len(errs), "min_error": min(errs), "max_error": max(errs),
                  "max_abs_error": max(abs(e) for e in errs),
                  "band": band_value(max(abs(e) for e in errs)) if len(errs) >= MIN_ROWS else None}
            for key, errs in sorted(groups.items())}
