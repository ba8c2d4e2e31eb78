"""The calibration bench's workload knobs (``Conversion.bands``, ``EXTRA_ZOO``,
``synthetic_trace(mix=...)``: optional, the defaults unchanged) and a tiny smoke run of
``bench/calibration_bias.py`` (JSON keys; the fitted ratios move toward the truth)."""

from __future__ import annotations

import json
import math

import pytest

from bench_script import load_bench
from pipeswift_slurm.core.calibration import family_of
from pipeswift_slurm.sim import workload
from pipeswift_slurm.sim.workload import (
    EXTRA_ZOO,
    ZOO,
    Conversion,
    TraceRow,
    WorkloadError,
    build_workload,
    synthetic_trace,
    to_megatron_job,
)

FAMILIES = ((10 ** 9, ("gpt-1.3b", "llama-1b", "gpt-2.7b", "llama-3b")),)


def test_extra_models_stay_out_of_the_default_zoo() -> None:
    assert not set(EXTRA_ZOO) & set(ZOO)
    assert all(name.startswith("gpt-") for name in list(ZOO)[:-1]) and list(ZOO)[-1] == "llama-70b"


def test_default_bands_given_explicitly_convert_exactly_as_the_default(cost) -> None:
    rows = synthetic_trace(120, 64, 0.9, 3)
    default = build_workload(rows, Conversion(cost, 64, 8, flex=0.5, seed=3, noise_sigma=0.1))
    explicit = build_workload(rows, Conversion(cost, 64, 8, flex=0.5, seed=3, noise_sigma=0.1,
                                               bands=workload._BANDS))
    assert default == explicit


def test_family_bands_draw_both_families_on_the_same_gpu_counts(cost) -> None:
    rows = [TraceRow("r%d" % i, float(i), 3600.0, 8) for i in range(200)]
    jobs = build_workload(rows, Conversion(cost, 64, 8, seed=1, bands=FAMILIES))
    classes = {j.profile.job_class for j in jobs}
    assert classes == {"gpt-<2B", "gpt-<8B", "gpt-swiglu-gqa-<2B", "gpt-swiglu-gqa-<8B"}
    llama = sum(family_of(j.profile.job_class) == "gpt-swiglu-gqa" for j in jobs)
    assert 70 <= llama <= 130  # drawn about half and half
    for job in jobs:  # every job's user config reproduces its recorded duration, whatever its family
        assert cost.job_time_s(job.profile, job.profile.requested) == pytest.approx(3600.0, rel=0.02)


def test_unknown_model_in_bands_is_a_workload_error(cost) -> None:
    with pytest.raises(WorkloadError, match="unknown model.*nope"):
        to_megatron_job(0, TraceRow("r", 0.0, 3600.0, 8), Conversion(cost, 64, 8, bands=((8, ("nope",)),)))


def test_synthetic_trace_mix_is_optional() -> None:
    assert synthetic_trace(50, 64, 0.9, 2, mix=None) == synthetic_trace(50, 64, 0.9, 2)
    mix = (("finetune", 1.0, ((8, 1.0),), 3600.0, 0.8, 300.0, 12 * 3600.0),)
    rows = synthetic_trace(50, 64, 0.9, 2, mix=mix)
    assert {r.category for r in rows} == {"finetune"} and {r.num_gpus for r in rows} == {8}
    assert all(300.0 <= r.duration_s <= 12 * 3600.0 for r in rows)


def test_bench_smoke_prints_the_json_and_learns_toward_the_truth(capsys) -> None:
    bench = load_bench("calibration_bias.py")
    bench.main(["--seeds", "1", "--jobs", "80", "--nodes", "2"])
    out = json.loads(capsys.readouterr().out)
    assert {"bench", "scenario", "class_bias", "workload", "calibration", "seeds", "summary",
            "wall_s"} <= set(out)
    seed = out["seeds"][0]
    assert {"mean_jct_s", "oracle_gain_pct", "gain_recovered", "mean_jct_s_by_family", "residual_bias",
            "fit_end", "decisions_vs_oracle"} <= set(seed)
    assert set(seed["mean_jct_s"]) == {"uncalibrated", "calibrated", "oracle", "near_oracle_shrunk",
                                       "near_oracle_stretched"}
    assert set(seed["mean_jct_s_by_family"]) == {"gpt", "gpt-swiglu-gqa"}
    summary = out["summary"]
    assert {"gain_recovered_pooled", "near_oracle_gain_recovered_pooled", "oracle_gain_pct",
            "mean_jct_s_by_family_mean_over_seeds",
            "worst_residual_at_50_by_class", "decisions_vs_oracle_median"} <= set(summary)
    for row in seed["fit_end"].values():
        if row["jobs"] < 10:
            continue
        # moved more than half way (in log) from 1 toward the true ratio
        assert abs(math.log(row["fitted_ratio"] / row["true_ratio"])) < 0.5 * abs(math.log(row["true_ratio"]))
