"""Compare the cost model with published Megatron throughput measurements.

Reads the CSV in ``tests/data/fidelity/published_megatron.csv`` (schema documented in its
SOURCES.md), turns each row into a Megatron command line for the stated config, and
returns predicted vs reported model TFLOP/s per GPU (rows without a stated shape are
skipped). Rows that report hardware FLOPs
with full recompute (4 passes instead of 3) are converted to model FLOPs (x 3/4).
Used by ``bench/fidelity.py`` and its regression test. Reads one file; otherwise pure.
"""

from __future__ import annotations

import csv
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from pipeswift_slurm.core.costmodel import CostModel
from pipeswift_slurm.core.hardware import get_gpu_type
from pipeswift_slurm.core.megatron import profile_from_argv


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

    @property
    def error(self) -> float:
        """Signed relative error (predicted / reported - 1)."""
        return self.predicted_tflops / self.reported_tflops - 1.0


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


def compare(path: str | Path, hardware: Optional[str] = None) -> list[FidelityRow]:
    """Predicted vs reported model TFLOP/s for every row of the published-data CSV."""
    out = []
    with open(path, newline="", encoding="utf-8") as handle:
        for rec in csv.DictReader(handle):
            if any(not (rec.get(k) or "").strip() for k in REQUIRED):
                continue  # the source does not state the shape: nothing to compare
            gpus = int(rec["num_gpus"])
            profile = profile_from_argv(_argv(rec), world_size=gpus, gpus_per_node=8)
            cost = CostModel(get_gpu_type(rec["gpu_type"], hardware))
            est = cost.estimate(profile, profile.requested)
            out.append(FidelityRow(rec["source_id"], rec["model"], rec["gpu_type"], gpus, est.config.short(),
                                   _reported_model_tflops(rec), est.tflops_per_gpu, est.mem_gib))
    return out


def summary(rows: list[FidelityRow]) -> dict[str, Any]:
    """Median and max absolute relative error, overall and per GPU type and source."""
    def stats(items: list[FidelityRow]) -> dict[str, Any]:
        errs = [abs(r.error) for r in items]
        return {"rows": len(items), "median_abs_error": statistics.median(errs) if errs else None,
                "max_abs_error": max(errs, default=None),
                "mean_signed_error": statistics.fmean(r.error for r in items) if items else None}

    return {"all": stats(rows),
            "by_gpu_type": {g: stats([r for r in rows if r.gpu_type == g]) for g in sorted({r.gpu_type for r in rows})},
            "by_source": {s: stats([r for r in rows if r.source_id == s]) for s in sorted({r.source_id for r in rows})}}
