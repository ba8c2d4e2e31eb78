"""The cost model stays close to published Megatron throughputs (README "Fidelity")."""

from pathlib import Path

import pytest

from pipeswift_slurm.measure.fidelity import compare, compare_shared, summary

CSV = Path(__file__).resolve().parents[1] / "data" / "fidelity" / "published_megatron.csv"


def test_median_error_against_published_throughput_is_within_ten_percent():
    rows = compare(CSV)
    stats = summary(rows)
    assert stats["all"]["rows"] >= 25
    assert stats["all"]["median_abs_error"] <= 0.10
    for gpu, part in stats["by_gpu_type"].items():
        assert part["median_abs_error"] <= 0.12, gpu


def test_no_published_row_is_off_by_more_than_a_third():
    worst = max(compare(CSV), key=lambda r: abs(r.error))
    assert abs(worst.error) < 0.35, (worst.model, worst.gpu_type, worst.error)


def test_hardware_flops_rows_are_converted_to_model_flops():
    rows = [r for r in compare(CSV) if r.source_id == "NAR21"]
    # NAR21 reports hardware FLOPs with full recompute (4 passes): 137 -> 137 * 3/4.
    first = rows[0]
    assert abs(first.reported_tflops - 137 * 0.75) < 1e-9


# Two rows in the schema of the shared ``megatron_published.csv`` (NVIDIA dgxc-benchmarking
# v25.05.05, llama3.1/README.md and nemotron/README.md, "GB200 Performance"): both were
# refused before (126 layers over 8 stages; tp 8 on 4-GPU GB200 trays).
SHARED_HEADER = ("source_url,release,system,gpu,precision,model,num_gpus,seq_len,global_batch,micro_batch,tp,pp,cp,"
                 "vp,ep,fsdp,layers,hidden,ffn_hidden,heads,kv_heads,vocab,activation,tokens_per_sec_per_gpu,"
                 "model_tflops_per_gpu,step_time_s")
SHARED_ROWS = (
    "u,dgxc-benchmarking v25.05.05 (NeMo 25.04.01),GB200 NVL72 (4 GPUs/node),GB200,BF16,Llama3.1-405B,128,8192,64,"
    "1,4,8,2,8,,0,126,16384,53248,128,8,128256,swiglu,438.2,,9.347",
    "u,dgxc-benchmarking v25.05.05 (NeMo 25.04.00),GB200 NVL72 (4 GPUs/node),GB200,BF16,Nemotron4-340B,128,4096,32,"
    "1,8,4,1,12,,,96,18432,73728,96,8,256000,squared-relu,467.8,,2.189",
)


def test_shared_rows_with_uneven_stages_and_gb200_are_estimated(tmp_path: Path) -> None:
    path = tmp_path / "megatron_published.csv"
    path.write_text("\n".join((SHARED_HEADER,) + SHARED_ROWS) + "\n")
    rows, refused = compare_shared(path)
    assert refused == []
    assert [r.gpu_type for r in rows] == ["GB200-186GB", "GB200-186GB"]
    llama, nemotron = rows
    assert "tp4 pp8" in llama.config and "vp8" in llama.config  # embedding and loss counted as stages
    assert "tp8 pp4" in nemotron.config and "=2x64" in nemotron.config  # one NVL72 domain per 64 GPUs
    assert all(r.reported_step_s > 0 and 0.5 < r.predicted_step_s / r.reported_step_s < 1.5 for r in rows)


def test_median_step_time_error_on_the_repository_rows_does_not_regress():
    # measured at the commit that added it: 5.4 % overall (A100-80GB 5.4 %, H100-80GB 6.7 %);
    # after the overlap flags, elementwise work and the efficiency refit: 4.6 % (A100-80GB
    # 5.5 %, max 20 %; H100-80GB 3.5 %, max 9 %), 30 rows; bench/fidelity.py prints the same
    stats = summary(compare(CSV))
    assert stats["all"]["rows"] == 30
    assert stats["all"]["median_abs_step_error"] <= 0.050
    assert stats["by_gpu_type"]["A100-80GB"]["median_abs_step_error"] <= 0.060
    assert stats["by_gpu_type"]["A100-80GB"]["max_abs_step_error"] <= 0.215
    assert stats["by_gpu_type"]["H100-80GB"]["median_abs_step_error"] <= 0.040
    assert stats["by_gpu_type"]["H100-80GB"]["max_abs_step_error"] <= 0.10


SHARED_CSV = Path(__file__).resolve().parents[3] / "shared" / "reference" / "published" / \
    "megatron_published.csv"


def test_shared_rows_meet_the_issue_goals_per_gpu_type():
    # issue 25: median |step time error| <= 5 %, max <= 15 % on the 63 shared rows; measured
    # 2.1 % / 7.8 % (H100-80GB, 54 rows), 2.6 % / 7.0 % (GB200-186GB, 9 rows)
    if not SHARED_CSV.is_file():
        pytest.skip("%s absent" % SHARED_CSV)
    rows, refused = compare_shared(SHARED_CSV)
    stats = summary(rows)
    assert refused == [] and stats["all"]["rows"] == 63
    for gpu, part in stats["by_gpu_type"].items():
        assert part["median_abs_step_error"] <= 0.05 and part["max_abs_step_error"] <= 0.15, (gpu, part)


def test_dgxc_rows_are_compared_by_their_published_step_time_with_their_recipe_flags():
    rows = [r for r in compare(CSV) if r.source_id == "DGXC"]
    assert len(rows) == 12 and all(r.reported_step_s > 0 and r.predicted_step_s > 0 for r in rows)
    gpt3 = rows[0]  # notes: reported_iter_time_s=8.309
    assert gpt3.reported_step_s == 8.309 and gpt3.step_error == gpt3.predicted_step_s / 8.309 - 1


def test_bench_prints_the_error_table_as_json(tmp_path: Path):
    import json
    import subprocess
    import sys

    bench = Path(__file__).resolve().parents[2] / "bench" / "fidelity.py"
    done = subprocess.run([sys.executable, str(bench), "--shared", str(tmp_path / "absent.csv")],
                          capture_output=True, text=True, timeout=120, check=True)
    out = json.loads(done.stdout)
    assert out["repo"]["all"]["rows"] == 30 and out["shared"]["skipped"] == "not present"
    assert set(out["repo"]["by_gpu_type"]) == {"A100-80GB", "H100-80GB"}
    bad = subprocess.run([sys.executable, str(bench), "--csv", str(tmp_path / "none.csv")],
                         capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and "no such file" in bad.stderr
