"""How long do the admin reports take on a big history? Prints JSON; never fails on time.

Builds a seeded synthetic history of N jobs (default 100,000) straight into a SQLite file
through SQLAlchemy Core bulk inserts into the schema's tables (jobs, profiles-free; ticks
every 10 minutes over the span, their snapshots, ~2 decisions per job, calibration),
then times every report kind (median of 3 runs, seconds) through the library, plus the
text and Prometheus rendering of ``report all`` and its PNG.

Run: python bench/report_scale.py [--jobs 100000] [--db /tmp/report_scale.sqlite] [--keep]
"""

from __future__ import annotations

import argparse
import json
import math
import random
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from sqlalchemy import insert

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout's code, not an installed one

from pipeswift_slurm.reports import render as rr  # noqa: E402
from pipeswift_slurm.reports import queries as r  # noqa: E402
from pipeswift_slurm.store.schema import Base, size_class  # noqa: E402
from pipeswift_slurm.store.history import Store  # noqa: E402

T0 = 1_700_000_000.0
CLASSES = ("gpt-<0.5B", "gpt-<2B", "gpt-<8B", "gpt-<20B", "gpt-<80B")
STATES = ["COMPLETED"] * 90 + ["COMPLETED?"] * 3 + ["FAILED"] * 3 + ["CANCELLED"] * 2 + ["RUNNING", "PENDING"]


def _job(job_id: int, rng: random.Random, span_s: float) -> dict[str, Any]:
    submit = T0 + rng.uniform(0, span_s)
    gpus = rng.choice([1, 2, 4, 8, 8, 16, 32, 64])
    queue = rng.expovariate(1 / 3600.0)
    run = rng.lognormvariate(math.log(1800), 1.2)
    state = rng.choice(STATES)
    row: dict[str, Any] = {
        "job_id": job_id,
        "user": "user%02d" % rng.randrange(40),
        "name": "job%d" % job_id,
        "partition": rng.choice(["gpu", "gpu", "big"]),
        "submit_time": submit,
        "state": state,
        "num_nodes": max(1, gpus // 8),
        "gpus": gpus,
        "requested_gpus": gpus,
        "opted_in": True,
        "job_class": rng.choice(CLASSES),
        "predicted_run_s": run / rng.uniform(0.7, 1.4),
        "start_time": None,
        "queue_s": None,
        "end_time": None,
        "run_s": None,
        "wait_origin_time": submit,  # as the controller stores it: eligible at submission, never requeued
    }  # executemany: same keys
    if state != "PENDING":
        row.update(start_time=submit + queue, queue_s=queue)
    if state not in ("PENDING", "RUNNING"):
        row.update(end_time=submit + queue + run, run_s=run)
    row["size_class"] = size_class(gpus, row.get("run_s", row["predicted_run_s"]))
    return row


def build(path: str, n_jobs: int, seed: int = 1) -> dict[str, int]:
    """Write the synthetic history; returns row counts per table."""
    rng = random.Random(seed)
    span_s = n_jobs * 60.0  # one job a minute
    store = Store.from_url(path)
    tables = Base.metadata.tables
    jobs = [_job(i, rng, span_s) for i in range(1, n_jobs + 1)]
    n_ticks = int(span_s // 600) + 1
    ticks = [
        {
            "tick_id": i + 1,
            "started_at": T0 + 600.0 * i,
            "finished_at": T0 + 600.0 * i + 0.2,
            "duration_s": rng.uniform(0.05, 0.5),
            "policy": "pipeswift",
            "dry_run": False,
            "status": "ok",
            "n_pending": 10,
            "n_running": 20,
        }
        for i in range(n_ticks)
    ]
    snaps = [
        {
            "tick_id": t["tick_id"],
            "at": t["started_at"],
            "n_nodes": 64,
            "total_gpus": 512,
            "free_gpus": 40,
            "busy_gpus": 472,
            "pending_gpus": 200,
            "n_pending": 10,
            "n_running": 20,
        }
        for t in ticks
    ]
    decisions = []
    for job in jobs:
        for k in range(2):
            at = job["submit_time"] + 60.0 * k
            decisions.append(
                {
                    "tick_id": min(n_ticks, int((at - T0) // 600) + 1),
                    "job_id": job["job_id"],
                    "at": at,
                    "kind": "site_factor",
                    "site_factor": rng.randrange(1, 10**6),
                    "requeue": False,
                    "reason": "queued (rank %d)" % k,
                    "intended": True,
                    "applied": rng.choice([True, True, True, False, None]),
                    "predicted_start_s": at + 600,
                }
            )
    calibration = [
        {"job_class": c, "n_jobs": 100, "log_ratio": 0.1, "ratio": math.exp(0.1), "updated_at": T0}
        for c in CLASSES[:3]
    ]
    with store.engine.begin() as conn:
        for name, rows in (
            ("jobs", jobs),
            ("ticks", ticks),
            ("tick_snapshots", snaps),
            ("decisions", decisions),
            ("calibration", calibration),
        ):
            conn.execute(insert(tables[name]), rows)
    store.engine.dispose()
    return {"jobs": len(jobs), "ticks": len(ticks), "decisions": len(decisions)}


def _median_s(fn: Callable[[], Any], repeat: int = 3) -> float:
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return round(statistics.median(times), 4)


def run(path: str, n_jobs: int) -> dict[str, Any]:
    t0 = time.perf_counter()
    counts = build(path, n_jobs)
    build_s = time.perf_counter() - t0
    store = Store.from_url(path)
    full = r.full_report(store)
    timings = {
        "queue-ratio (hour)": _median_s(lambda: r.queue_ratio(store, by="hour")),
        "queue-ratio (user)": _median_s(lambda: r.queue_ratio(store, by="user")),
        "jct (size)": _median_s(lambda: r.jct(store)),
        "waits (size)": _median_s(lambda: r.waits(store)),
        "bias": _median_s(lambda: r.bias(store)),
        "decisions": _median_s(lambda: r.decisions(store)),
        "all (queries)": _median_s(lambda: r.full_report(store)),
        "all (text tables)": _median_s(lambda: rr.text_tables(rr.full_tables(full))),
        "prometheus text": _median_s(lambda: rr.prometheus_text(full)),
        "all (png, 4 panels)": _median_s(lambda: rr.png_bytes(rr.figure("all", full, r.jct_values(store)))),
    }
    return {
        "jobs": n_jobs,
        "rows": counts,
        "build_s": round(build_s, 2),
        "median_of_3_s": timings,
        "slowest_s": max(timings.values()),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=100_000)
    parser.add_argument("--db", help="SQLite file to build (default: a temporary file)")
    parser.add_argument("--keep", action="store_true", help="keep the database file")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        path = args.db or str(Path(tmp) / "report_scale.sqlite")
        Path(path).unlink(missing_ok=True)
        result = run(path, args.jobs)
        result["db"] = path if (args.keep or args.db) else None
        print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
