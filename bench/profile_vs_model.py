#!/usr/bin/env python3
"""A measured layer profile (``pipeswift profile --out FILE``) against the cost model's table.

For each profile TOML given, and each micro-batch size it measured: the measured forward +
backward time of one transformer layer on one GPU, beside what the cost model predicts for the
same layer, precision and micro-batch size on the profile's GPU type from its table alone (no
layer profile: ``CostModel.layer_times_s`` at tp = cp = 1, no recompute, no tensor-parallel
communication). ``model_over_measured`` > 1: the table is too slow for this layer. Prints JSON.
A CPU profile is refused (it says nothing about a GPU type).

Usage: python bench/profile_vs_model.py PROFILE.toml [PROFILE.toml ...]
(``bench/gpu_profile_check.sh`` writes such profiles on a GPU and runs this on them.)
"""

import json
import statistics
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout's code, not an installed one

from pipeswift_slurm.core.costmodel import CostModel  # noqa: E402
from pipeswift_slurm.core.flops import layer_fwd_flops  # noqa: E402
from pipeswift_slurm.core.hardware import HardwareError, get_gpu_type  # noqa: E402
from pipeswift_slurm.core.layer_profile import LAYER_SHAPE_KEYS, measured_on_cpu  # noqa: E402
from pipeswift_slurm.core.model import ExecConfig, JobProfile, ModelShape, TrainingPlan  # noqa: E402
from pipeswift_slurm.core.profile_file import LayerProfile, ProfileFormatError, read_profile_toml  # noqa: E402


def compare_profile(profile: LayerProfile) -> dict[str, Any]:
    """Per micro-batch size: measured and table-predicted fwd+bwd ms of one layer, their ratio,
    and the table's efficiency (fraction of peak) beside the measured one."""
    gpu = get_gpu_type(profile.gpu_type)
    shape = ModelShape(num_layers=1, **{key: getattr(profile, key) for key in LAYER_SHAPE_KEYS})
    job = JobProfile(shape=shape, plan=TrainingPlan(global_batch_size=1, train_iters=1, precision=profile.dtype),
                     requested=ExecConfig(tp=1, pp=1, dp=1, micro_batch_size=1, num_micro_batches=1))
    model = CostModel(gpu)  # the table alone: no layer profile
    peak = gpu.peak_tflops_for(profile.dtype)
    rows = []
    for timing in profile.timings:
        cfg = ExecConfig(tp=1, pp=1, dp=1, micro_batch_size=timing.micro_batch_size, num_micro_batches=1)
        fwd_s, bwd_s = model.layer_times_s(job, cfg)
        model_ms = (fwd_s + bwd_s) * 1e3
        work_gflop = layer_fwd_flops(shape, timing.micro_batch_size) / 1e9
        rows.append({"micro_batch_size": timing.micro_batch_size, "measured_ms": round(timing.fwd_bwd_ms, 3),
                     "model_ms": round(model_ms, 3), "model_over_measured": round(model_ms / timing.fwd_bwd_ms, 3),
                     "measured_tflops": round(timing.tflops, 1), "measured_fraction_of_peak": round(timing.tflops / peak, 3),
                     "table_fraction_of_peak": round(gpu.efficiency(work_gflop), 3)})
    ratios = [r["model_over_measured"] for r in rows]
    return {"source": profile.source, "gpu_type": gpu.name, "device": profile.device, "backend": profile.backend,
            "layer_spec": profile.layer_spec, "dtype": profile.dtype, "torch": profile.torch_version,
            "shape": {key: getattr(profile, key) for key in LAYER_SHAPE_KEYS}, "micro_batches": rows,
            "median_model_over_measured": round(statistics.median(ratios), 3),
            "worst_model_over_measured": max(ratios, key=lambda r: abs(r - 1.0))}


def main(argv: list[str]) -> int:
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__.strip().splitlines()[-3], file=sys.stderr)
        return 2
    results = []
    for path in argv:
        try:
            profile = read_profile_toml(path)
        except (OSError, ProfileFormatError) as exc:
            print(f"profile_vs_model: {path}: {exc}; give a file written by pipeswift profile --out", file=sys.stderr)
            return 2
        if measured_on_cpu(profile):
            print(f"profile_vs_model: {path}: measured on the CPU; compare a profile measured on a GPU", file=sys.stderr)
            return 2
        try:
            results.append(compare_profile(profile))
        except HardwareError as exc:
            print(f"profile_vs_model: {path}: {exc}", file=sys.stderr)
            return 2
    print(json.dumps({"profiles": results}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
