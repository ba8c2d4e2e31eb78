"""Traces for the simulator: the trace CSV files (schema of ``shared/workloads/README.md``:
job_id, submit_time_s, duration_s, num_gpus, user, ..., cluster), their windows and load,
and a seeded synthetic LLM-cluster generator. Rows only: ``sim/workload.py`` turns them
into Megatron jobs. Pure except for reading the CSV file in ``read_trace``."""

from __future__ import annotations

import csv
import gzip
import io
import itertools
import math
import random
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Iterator, Optional, Sequence

from pipeswift_slurm.core.files import open_nowait
from pipeswift_slurm.core.request import MAX_GPUS

TRACE_COLUMNS = ("job_id", "submit_time_s", "duration_s", "num_gpus")


class WorkloadError(ValueError):
    """A malformed workload file or impossible settings; the message names where."""


@dataclass(frozen=True)
class TraceRow:
    """One job of a trace: when it came, how long it ran on how many GPUs."""

    name: str
    submit_s: float
    duration_s: float
    num_gpus: int
    user: str = ""
    category: str = ""


# ---------------------------------------------------------------- reading traces

def _open_text(path: Path) -> io.TextIOBase:
    raw = open_nowait(path)  # a FIFO nobody writes is an empty file, not a hang
    if path.suffix == ".gz":
        return io.TextIOWrapper(gzip.open(raw, "rb"), encoding="utf-8-sig")  # -sig: a BOM (Excel) is no field
    return io.TextIOWrapper(raw, encoding="utf-8-sig", newline="")


# The largest value of each number column: beyond any real cluster's trace (a submit time in
# the year 5138, a job of ten years, the most GPUs a request may name), where arithmetic on
# the value would make every figure of the run meaningless.
COLUMN_MAX = {"submit_time_s": 1e11, "duration_s": 10 * 366 * 86400.0, "num_gpus": float(MAX_GPUS)}


def _number(path: Path, line: int, column: str, text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise WorkloadError("%s:%d: column %r: %r is not a number" % (path, line, column, text)) from None
    if not math.isfinite(value) or value < 0:
        raise WorkloadError("%s:%d: column %r: %r must be a finite non-negative number" % (path, line, column, text))
    if value > COLUMN_MAX[column]:
        raise WorkloadError("%s:%d: column %r: %r is over the largest a trace may hold (%g)"
                            % (path, line, column, text, COLUMN_MAX[column]))
    return value


# A trace line holds a few short fields; a longer line, or more rows than any cluster's
# years of jobs, is not a workload (a gzip file of one 2-GB line once took 4 GB to refuse).
MAX_LINE_CHARS = 1 << 16
MAX_ROWS = 10_000_000


def _bounded_lines(path: Path, handle: io.TextIOBase) -> Iterator[str]:
    for number in itertools.count(1):
        line = handle.readline(MAX_LINE_CHARS + 1)
        if not line:
            return
        if len(line) > MAX_LINE_CHARS:
            raise WorkloadError("%s:%d: a line over %d characters: not a workload CSV" % (path, number, MAX_LINE_CHARS))
        if number > MAX_ROWS + 1:
            raise WorkloadError("%s: over %d rows: more jobs than a simulation replays; select a window"
                                " of the trace first" % (path, MAX_ROWS))
        yield line


def read_trace(path: str | Path) -> list[TraceRow]:
    """Read a workload CSV (optionally gzip) in the shared schema.

    Raises:
        WorkloadError: unreadable file, missing column, or a malformed value (names the
            file, line and column).
    """
    path = Path(path)
    try:
        with _open_text(path) as handle:
            reader = csv.DictReader(_bounded_lines(path, handle))
            missing = [c for c in TRACE_COLUMNS if c not in (reader.fieldnames or [])]
            if missing:
                raise WorkloadError("%s:1: missing column(s) %s; expected at least %s"
                                    % (path, ", ".join(missing), ", ".join(TRACE_COLUMNS)))
            return [_row(path, reader.line_num, rec) for rec in reader]
    except (OSError, EOFError, UnicodeDecodeError, csv.Error) as exc:
        raise WorkloadError("%s: cannot read workload: %s" % (path, exc)) from None


def _row(path: Path, line: int, rec: dict[str, str]) -> TraceRow:
    if None in rec or None in rec.values():  # csv.DictReader: more fields than the header, or fewer
        raise WorkloadError("%s:%d: %s fields than the header's %d; a value with a comma must be quoted"
                            % (path, line, "more" if None in rec else "fewer", len(rec) - (None in rec)))
    gpus = _number(path, line, "num_gpus", rec.get("num_gpus") or "")
    if gpus < 1 or gpus != int(gpus):
        raise WorkloadError("%s:%d: column 'num_gpus': %r must be a positive integer" % (path, line, rec["num_gpus"]))
    return TraceRow(name=rec.get("job_id") or "row-%d" % line,
                    submit_s=_number(path, line, "submit_time_s", rec.get("submit_time_s") or ""),
                    duration_s=_number(path, line, "duration_s", rec.get("duration_s") or ""),
                    num_gpus=int(gpus), user=rec.get("user") or "", category=rec.get("cluster") or "")


def select_window(rows: Sequence[TraceRow], start_day: float = 0.0,
                  window_days: Optional[float] = None) -> list[TraceRow]:
    """Rows submitted in [start_day, start_day + window_days) days, times re-based to 0."""
    lo = start_day * 86400.0
    hi = math.inf if window_days is None else lo + window_days * 86400.0
    chosen = sorted((r for r in rows if lo <= r.submit_s < hi), key=lambda r: (r.submit_s, r.name))
    if not chosen:
        return []
    t0 = chosen[0].submit_s
    return [replace(r, submit_s=r.submit_s - t0) for r in chosen]


DATED_AFTER_S = 946684800.0  # 2000-01-01 UTC: a trace whose times are later is in epoch seconds


def window_start_s(rows: Sequence[TraceRow], start_day: float = 0.0) -> Optional[float]:
    """The submit time of the first row ``select_window`` keeps, when the trace's times are
    dates (epoch seconds after 2000); None for a trace in relative seconds."""
    lo = start_day * 86400.0
    first = min((r.submit_s for r in rows if r.submit_s >= lo), default=None)
    return first if first is not None and first >= DATED_AFTER_S else None


def offered_load(rows: Sequence[TraceRow], cluster_gpus: int) -> float:
    """GPU-seconds asked for / (arrival span x cluster GPUs), using recorded durations."""
    if not rows:
        return 0.0
    span = max(r.submit_s for r in rows) - min(r.submit_s for r in rows)
    work = sum(r.num_gpus * r.duration_s for r in rows)
    return work / (max(span, 1.0) * cluster_gpus)


def rescale_load(rows: Sequence[TraceRow], cluster_gpus: int, load: float) -> list[TraceRow]:
    """Stretch or compress inter-arrival times so the offered load becomes ``load``."""
    current = offered_load(rows, cluster_gpus)
    if not rows or current <= 0 or load <= 0:
        return list(rows)
    factor = current / load
    t0 = rows[0].submit_s
    return [replace(r, submit_s=t0 + (r.submit_s - t0) * factor) for r in rows]


# ---------------------------------------------------------------- synthetic generator

# category: (share, GPU counts and weights, median duration s, log-sigma, min s, max s)
MixCategory = tuple[str, float, tuple[tuple[int, float], ...], float, float, float, float]
SYNTHETIC_MIX = (
    ("debug-eval", 0.55, ((1, 0.4), (2, 0.25), (4, 0.2), (8, 0.15)), 900.0, 1.0, 120.0, 4 * 3600.0),
    ("finetune", 0.35, ((8, 0.5), (16, 0.35), (32, 0.15)), 2 * 3600.0, 0.8, 1200.0, 24 * 3600.0),
    ("pretrain", 0.10, ((32, 0.5), (64, 0.5)), 12 * 3600.0, 0.6, 2 * 3600.0, 72 * 3600.0),
)


def synthetic_trace(num_jobs: int, cluster_gpus: int, load: float, seed: int, num_users: int = 20,
                    mix: Optional[Sequence[MixCategory]] = None) -> list[TraceRow]:
    """A seeded LLM-development-cluster trace (after the Acme trace's published shape:
    most jobs are short small debugging/evaluation runs, a few multi-node pretraining
    runs hold most GPU-time). ``SYNTHETIC_MIX`` documents the distributions: category
    share, GPU-count weights (capped at the cluster), log-normal duration (median,
    sigma, clipped). Arrivals are Poisson, rescaled to the offered ``load``. ``mix``
    (optional, same layout) replaces ``SYNTHETIC_MIX``; None keeps it.
    """
    mix = SYNTHETIC_MIX if mix is None else tuple(mix)
    rng = random.Random(seed)
    rows = []
    t = 0.0
    for i in range(num_jobs):
        cat = rng.choices(mix, weights=[c[1] for c in mix])[0]
        name, _, counts, median, sigma, lo, hi = cat
        gpus = min(rng.choices([c for c, _ in counts], weights=[w for _, w in counts])[0], cluster_gpus)
        duration = min(hi, max(lo, median * math.exp(rng.gauss(0.0, sigma))))
        t += rng.expovariate(1.0)
        rows.append(TraceRow("syn-%d" % i, t, round(duration), gpus, "user%02d" % rng.randrange(num_users), name))
    return rescale_load(rows, cluster_gpus, load)
