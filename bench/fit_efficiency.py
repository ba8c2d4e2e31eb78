#!/usr/bin/env python3
"""Fit the GPU table's efficiency constants (``eff_max``, ``work_half_gflop``) to published
Megatron step times, each GPU type on every other of its rows, and print the error on the rows
fitted (in sample) beside the error on the rows held out, as JSON.

A100-80GB: the 18 A100 rows of ``tests/data/fidelity/published_megatron.csv``, a grid of both
constants. H100-80GB and GB200-186GB: the shared ``megatron_published.csv`` (NVIDIA DGX Cloud
recipes), ``eff_max`` only, ``work_half_gflop`` kept (H100's 120 GFLOP; GB200's that x peak
ratio): every published layer is far past the knee, so the rows cannot tell it. The fit
minimises the median |step time error| of the fitted rows; ``core/hardware.py`` ships the result.
Usage: python bench/fit_efficiency.py [--shared PATH]
"""

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any, Callable

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout's code, not an installed one

from pipeswift_slurm.measure.fidelity import FidelityRow, compare, compare_shared  # noqa: E402

HERE = Path(__file__).resolve().parent.parent
REPO = HERE / "tests/data/fidelity/published_megatron.csv"
SHARED = HERE.parent / "shared" / "reference" / "published" / "megatron_published.csv"
EFF_GRID = [e / 1000 for e in range(450, 905, 5)]


def _rows(load: Callable[[str], list[FidelityRow]], gpu: str, eff: float, half: float) -> list[FidelityRow]:
    with tempfile.NamedTemporaryFile("w", suffix=".toml") as hw:
        hw.write('[gpu."%s"]\neff_max = %r\nwork_half_gflop = %r\n' % (gpu, eff, half))
        hw.flush()
        return [r for r in load(hw.name) if r.gpu_type == gpu]


def _stats(rows: list[FidelityRow]) -> dict[str, Any]:
    errs = [abs(r.step_error) for r in rows]
    return {"rows": len(errs), "median_abs_step_error": round(statistics.median(errs), 4),
            "max_abs_step_error": round(max(errs), 4)}


def fit(load: Callable[[str], list[FidelityRow]], gpu: str, halves: list[float]) -> dict[str, Any]:
    """Best (median |error| of every other row, from the first) over the grid, and the split."""
    def score(eff: float, half: float) -> float:
        return statistics.median([abs(r.step_error) for r in _rows(load, gpu, eff, half)[0::2]])

    _, eff, half = min((score(e, h), e, h) for e in EFF_GRID for h in halves)
    rows = _rows(load, gpu, eff, half)
    return {"eff_max": eff, "work_half_gflop": half, "fitted_rows": _stats(rows[0::2]),
            "held_out_rows": _stats(rows[1::2]), "all_rows": _stats(rows)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shared", default=str(SHARED))
    args = parser.parse_args()
    def repo(hw: str) -> list[FidelityRow]:
        return compare(REPO, hw)
    out = {"A100-80GB": fit(repo, "A100-80GB", [5.0, 10.0, 20.0, 30.0, 45.0, 60.0, 80.0, 100.0, 130.0])}
    if Path(args.shared).is_file():
        def shared(hw: str) -> list[FidelityRow]:
            return compare_shared(args.shared, hw)[0]
        out["H100-80GB"] = fit(shared, "H100-80GB", [120.0])
        out["GB200-186GB"] = fit(shared, "GB200-186GB", [303.0])
    json.dump(out, sys.stdout, indent=2)
    print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
