#!/usr/bin/env python3
"""Fidelity of ``pipeswift estimate`` against published Megatron throughputs.

Prints JSON: per row predicted vs reported model TFLOP/s per GPU and the signed error,
and the median/max absolute error overall, per GPU type and per source.
Usage: python bench/fidelity.py [--csv tests/data/fidelity/published_megatron.csv]
"""

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout's code, not an installed one

from pipeswift_slurm.measure.fidelity import compare, summary  # noqa: E402

HERE = Path(__file__).resolve().parent.parent


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--csv", default=str(HERE / "tests/data/fidelity/published_megatron.csv"))
    args = parser.parse_args()
    rows = compare(args.csv)
    out = {"summary": summary(rows),
           "rows": [{"source": r.source_id, "model": r.model, "gpu_type": r.gpu_type, "gpus": r.num_gpus,
                     "config": r.config, "reported_tflops": r.reported_tflops,
                     "predicted_tflops": round(r.predicted_tflops, 1), "error": round(r.error, 3)} for r in rows]}
    json.dump(out, sys.stdout, indent=2)
    print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
