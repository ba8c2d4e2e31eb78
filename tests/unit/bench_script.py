"""Load a script of bench/ as a module (the scripts are not a package), for the tests of
their pure parts."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

BENCH_DIR = Path(__file__).resolve().parents[2] / "bench"


def load_bench(file_name: str) -> ModuleType:
    """bench/<file_name> imported under the name ``bench_<stem>``."""
    path = BENCH_DIR / file_name
    spec = importlib.util.spec_from_file_location("bench_" + path.stem, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
