"""The cost model stays close to published Megatron throughputs (README "Fidelity")."""

from pathlib import Path

from pipeswift_slurm.measure.fidelity import compare, summary

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
