"""The GPU table's efficiency constants are what ``bench/fit_efficiency.py`` fits: each
minimises the median |step time error| of every other published row of its GPU type (no
neighbouring value does better), and the error on the rows held out stays near the fitted."""

import statistics
from pathlib import Path
from typing import Any

import pytest

from bench_script import load_bench
from pipeswift_slurm.core.hardware import get_gpu_type

ROOT = Path(__file__).resolve().parents[2]
SHARED_CSV = ROOT.parent / "shared" / "reference" / "published" / "megatron_published.csv"


def _check(bench: Any, load: Any, gpu: str, held_out_max: float) -> None:
    shipped = get_gpu_type(gpu)

    def fitted_median(eff: float) -> float:
        rows = bench._rows(load, gpu, eff, shipped.work_half_gflop)[0::2]
        return statistics.median([abs(r.step_error) for r in rows])

    best = fitted_median(shipped.eff_max)
    assert best <= fitted_median(shipped.eff_max - 0.005) and best <= fitted_median(shipped.eff_max + 0.005)
    held = bench._rows(load, gpu, shipped.eff_max, shipped.work_half_gflop)[1::2]
    assert statistics.median([abs(r.step_error) for r in held]) <= held_out_max, gpu


def test_a100_constants_are_the_fit_of_the_repository_rows() -> None:
    bench = load_bench("fit_efficiency.py")
    _check(bench, lambda hw: bench.compare(bench.REPO, hw), "A100-80GB", 0.06)


def test_hopper_and_blackwell_constants_are_the_fit_of_the_shared_rows() -> None:
    if not SHARED_CSV.is_file():
        pytest.skip("%s absent" % SHARED_CSV)
    bench = load_bench("fit_efficiency.py")
    for gpu, held_out_max in (("H100-80GB", 0.03), ("GB200-186GB", 0.05)):
        _check(bench, lambda hw: bench.compare_shared(SHARED_CSV, hw)[0], gpu, held_out_max)
    assert get_gpu_type("B200-180GB").eff_max == get_gpu_type("GB200-186GB").eff_max
    assert get_gpu_type("H200-141GB").eff_max == pytest.approx(get_gpu_type("H100-80GB").eff_max + 0.02)
