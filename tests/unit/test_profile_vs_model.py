"""Issue 25 item 6: ``pipeswift profile`` ran on a real H200 (bench/gpu_profile_check.sh, torch
SDPA layer, bf16); its five profiles are kept in tests/data/profiles/h200. The H200 row of the
GPU table must keep predicting those measured layer times: within 10 % wherever a layer has
real work (micro-batch >= 2, or a layer of >= 4096 hidden), which it does today (-7 % to +7 %;
GPT 1.3B at micro-batch 1 is 25 % too fast, the knee of the efficiency curve, and is named here
rather than hidden). bench/profile_vs_model.py is what computes the comparison."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench_script import load_bench
from pipeswift_slurm.core.costmodel import CostModel
from pipeswift_slurm.core.hardware import get_gpu_type
from pipeswift_slurm.core.profile_file import read_profile_toml

ROOT = Path(__file__).resolve().parents[2]
PROFILES = sorted((ROOT / "tests" / "data" / "profiles" / "h200").glob("*.toml"))


pvm = load_bench("profile_vs_model.py")


def test_the_five_h200_profiles_are_there_and_were_measured_on_an_h200() -> None:
    assert [p.stem for p in PROFILES] == ["gpt-1.3b", "gpt3-175b", "llama31-70b", "llama31-8b", "nemotron4-15b"]
    for path in PROFILES:
        profile = read_profile_toml(path)
        assert profile.gpu_type == "H200-141GB" and "H200" in profile.device and profile.dtype == "bf16"


@pytest.mark.parametrize("path", PROFILES, ids=lambda p: p.stem)
def test_the_h200_table_predicts_the_measured_layer_within_ten_percent(path: Path) -> None:
    result = pvm.compare_profile(read_profile_toml(path))
    for row in result["micro_batches"]:
        if row["micro_batch_size"] == 1 and result["shape"]["hidden_size"] < 4096:
            assert row["model_over_measured"] < 0.9  # the knee: named, and must not silently move
            continue
        assert 0.9 <= row["model_over_measured"] <= 1.1, (path.stem, row)


def test_the_comparison_is_the_cost_models_layer_time_over_the_measured_one() -> None:
    profile = read_profile_toml(PROFILES[1])
    result = pvm.compare_profile(profile)
    row = result["micro_batches"][0]
    timing = profile.timings[0]
    model_ms = row["model_ms"]
    assert row["model_over_measured"] == pytest.approx(model_ms / timing.fwd_bwd_ms, abs=1e-3)
    assert row["measured_fraction_of_peak"] == pytest.approx(timing.tflops / get_gpu_type("H200-141GB").peak_tflops,
                                                             abs=1e-3)
    # a layer profile given to the cost model replaces the table by the measured time
    measured = CostModel(get_gpu_type("H200-141GB"), layer_profile=profile)
    job_cfg = pvm.ExecConfig(tp=1, pp=1, dp=1, micro_batch_size=timing.micro_batch_size, num_micro_batches=1)
    shape = pvm.ModelShape(num_layers=1, **result["shape"])
    job = pvm.JobProfile(shape=shape, plan=pvm.TrainingPlan(global_batch_size=1, train_iters=1),
                         requested=job_cfg)
    fwd_s, bwd_s = measured.layer_times_s(job, job_cfg)
    assert (fwd_s + bwd_s) * 1e3 == pytest.approx(timing.fwd_bwd_ms, rel=1e-6)


def test_bench_prints_json_and_refuses_a_cpu_profile(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert pvm.main([str(PROFILES[0])]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["profiles"][0]["gpu_type"] == "H200-141GB"
    cpu = tmp_path / "cpu.toml"
    cpu.write_text(PROFILES[0].read_text().replace('gpu_type = "H200-141GB"', 'gpu_type = "cpu"'))
    assert pvm.main([str(cpu)]) == 2
    assert "measured on the CPU" in capsys.readouterr().err
    assert pvm.main([str(tmp_path / "missing.toml")]) == 2
    assert "pipeswift profile --out" in capsys.readouterr().err
