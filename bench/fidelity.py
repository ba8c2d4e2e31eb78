#!/usr/bin/env python3
"""Fidelity of ``pipeswift estimate`` against every published Megatron run at hand.

Runs the repository's rows (``tests/data/fidelity/published_megatron.csv``: model TFLOP/s,
turned into step time at the same model FLOPs) and, when present, the shared file of NVIDIA's
DGX Cloud recipes (``../shared/reference/published/megatron_published.csv``: step time). Prints
JSON: per file and GPU type the rows estimated, the rows refused (and why), and the median and
max |step time error| (predicted / published - 1); with ``--rows`` every row as well.
Usage: python bench/fidelity.py [--csv PATH] [--shared PATH] [--rows]
"""

import argparse
import json
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout's code, not an installed one

from pipeswift_slurm.measure.fidelity import FidelityRow, compare, compare_shared, summary  # noqa: E402

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


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--csv", default=str(HERE / "tests/data/fidelity/published_megatron.csv"))
    parser.add_argument("--shared", default=str(SHARED), help="the shared published file (skipped when absent)")
    parser.add_argument("--rows", action="store_true", help="print every row as well")
    args = parser.parse_args()
    if not Path(args.csv).is_file():
        print("bench/fidelity.py: %s: no such file (give --csv PATH)" % args.csv, file=sys.stderr)
        return 2
    repo = compare(args.csv)
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
    json.dump(out, sys.stdout, indent=2)
    print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
