#!/usr/bin/env python3
"""Fidelity of ``pipeswift estimate`` against every published Megatron run at hand.

Runs the repository's rows (``tests/data/fidelity/published_megatron.csv``: the step time a
row's notes state, else model TFLOP/s turned into step time at the same model FLOPs) and, when present, the shared file of NVIDIA's
DGX Cloud recipes (``../shared/reference/published/megatron_published.csv``: step time). Prints
JSON: per file and GPU type the rows estimated, the rows refused (and why), and the median and
max |step time error| (predicted / published - 1); with ``--rows`` every row as well. Under
``bands``: per layout group (GPU family, pp > 1, cp > 1) the rows behind the error bands
(``measure.fidelity.band_rows``), their error range and band, beside the band shipped in
``core/error_band.py``; ``--band-table`` prints that table as the Python lines to paste there
instead (after a cost-model change moves the errors). ``bench/fit_efficiency.py`` fits the GPU
table's efficiency constants to the same rows (every other row fitted, the rest held out).
Usage: python bench/fidelity.py [--csv PATH] [--shared PATH] [--rows] [--band-table]
"""

import argparse
import json
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout's code, not an installed one

from pipeswift_slurm.core.error_band import BANDS, DEFAULT_BAND  # noqa: E402
from pipeswift_slurm.measure.fidelity import (FidelityRow, band_rows, band_table, compare, compare_shared,  # noqa: E402
                                              summary)

HERE = Path(__file__).resolve().parent.parent
SHARED = HERE.parent / "shared" / "reference" / "published" / "megatron_published.csv"


def _table(rows: list[FidelityRow]) -> dict[str, Any]:
    def part(stats: dict[str, Any]) -> dict[str, Any]:
        return {"rows": stats["rows"], "median_abs_step_error": round(stats["median_abs_step_error"], 4),
                "max_abs_step_error": round(stats["max_abs_step_error"], 4)}

    stats = summary(rows)
    return {"all": part(stats["all"]), "by_gpu_type": {g: part(s) for g, s in stats["by_gpu_type"].items()}}


def _rows(rows: list[FidelityRow]) -> list[dict[str, Any]]:
    return [{"source": r.source_id, "model": r.model, "gpu_type": r.gpu_type, "gpus": r.num_gpus, "config": r.config,
             "reported_step_s": round(r.reported_step_s, 3) or None, "predicted_step_s": round(r.predicted_step_s, 3)
             or None, "step_error": round(r.step_error, 3)} for r in rows]


def _bands(rows: list[FidelityRow]) -> list[dict[str, Any]]:
    return [{"group": g["group"], "rows": g["rows"], "error_range": [round(g["min_error"], 4), round(g["max_error"], 4)],
             "band": g["band"], "shipped_band": BANDS.get(key, DEFAULT_BAND)} for key, g in band_table(rows).items()]


def _band_lines(rows: list[FidelityRow]) -> list[str]:
    out = []
    for key, g in band_table(rows).items():
        if g["band"] is not None:
            out.append("    # %s (%d rows): %+.0f to %+.0f %%" % (g["group"], g["rows"], 100 * g["min_error"],
                                                                  100 * g["max_error"]))
            out.append("    %r: %.2f," % (key, g["band"]))
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--csv", default=str(HERE / "tests/data/fidelity/published_megatron.csv"))
    parser.add_argument("--shared", default=str(SHARED), help="the shared published file (skipped when absent)")
    parser.add_argument("--rows", action="store_true", help="print every row as well")
    parser.add_argument("--band-table", action="store_true", help="print the error-band table as Python lines")
    args = parser.parse_args()
    if not Path(args.csv).is_file():
        print("bench/fidelity.py: %s: no such file (give --csv PATH)" % args.csv, file=sys.stderr)
        return 2
    repo = compare(args.csv)
    shared_rows = compare_shared(args.shared)[0] if Path(args.shared).is_file() else []
    if args.band_table:
        print("\n".join(_band_lines(band_rows(repo, shared_rows))))
        return 0
    out: dict[str, Any] = {"repo": {"file": args.csv, **_table(repo)}}
    if args.rows:
        out["repo"]["row_errors"] = _rows(repo)
    if Path(args.shared).is_file():
        shared, refused = compare_shared(args.shared)
        out["shared"] = {"file": args.shared, **_table(shared),
                         "refused": [{"model": r.model, "gpu": r.gpu_type, "gpus": r.num_gpus, "why": r.reason}
                                     for r in refused]}
        if args.rows:
            out["shared"]["row_errors"] = _rows(shared)
    else:
        out["shared"] = {"file": args.shared, "skipped": "not present"}
    out["bands"] = _bands(band_rows(repo, shared_rows))
    json.dump(out, sys.stdout, indent=2)
    print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
