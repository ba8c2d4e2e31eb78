"""The admin queries in sql/*.sql, run on a small hand-built history, agree with the same
figures computed independently in Python (and run under the sqlite3 command line); on
PostgreSQL (a test server: tests/pg/postgres.sh) the same files do the same, also under psql
(the store gives PostgreSQL SQLite's datetime() and strftime())."""

from __future__ import annotations

import random
import shutil
import sqlite3
import statistics
import subprocess
from collections import defaultdict
from datetime import datetime, timezone
from pathlib import Path

import pytest
from sqlalchemy import text
from sqlalchemy.engine import make_url

from pipeswift_slurm.reports import admin_sql
from pipeswift_slurm.store.schema import size_class
from pipeswift_slurm.store.history import Store, make_engine

SQL_DIR = Path(__file__).resolve().parents[2] / "sql"
QUERIES = tuple(admin_sql.QUERIES)
T0 = 1_700_000_000.0  # 2023-11-14 22:13:20 UTC
NOW = T0 + 4 * 3600.0  # the last tick
FINISHED = ("COMPLETED", "COMPLETED?")


def _make_jobs(rng: random.Random) -> list[dict]:
    jobs = []
    for job_id in range(1, 81):
        submit = T0 + rng.uniform(0, 3 * 3600)
        eligible = submit + rng.choice([0.0, 0.0, rng.uniform(1, 600)])
        gpus = rng.choice([1, 2, 4, 8, 16, 32])
        queue = rng.uniform(0, 5 * 3600) if job_id % 9 else 50 * 3600.0 + job_id  # a few starve (> 48 h)
        run = rng.uniform(60, 6 * 3600)
        state = rng.choice(["COMPLETED"] * 6 + ["COMPLETED?", "FAILED", "RUNNING", "PENDING"])
        job = {"job_id": job_id, "user": "u%d" % (job_id % 4), "state": state, "gpus": gpus,
               "submit_time": submit, "eligible_time": eligible if eligible > submit else None,
               "job_class": rng.choice(["gpt-1b", "gpt-7b", ""]),
               "predicted_run_s": run * rng.uniform(0.5, 1.6) if job_id % 5 else None,
               "wait_origin_time": eligible}  # as the controller stores it (no runs before a requeue here)
        if state != "PENDING":
            job.update(start_time=eligible + queue, queue_s=queue)
        if state not in ("PENDING", "RUNNING"):
            job.update(end_time=eligible + queue + run, run_s=run)
        job["size_class"] = size_class(gpus, job.get("run_s", job["predicted_run_s"]))
        jobs.append(job)
    return jobs


def _make_decisions(rng: random.Random, n_jobs: int) -> list[dict]:
    out = []
    for i in range(1, 71):
        intended = rng.random() < 0.8
        applied = rng.choice([True, False, None]) if intended else None
        out.append({"id": i, "tick_id": 1 + i % 3, "job_id": rng.randint(1, n_jobs),
                    "at": T0 + 60 * i, "kind": "site_factor" if intended else "none",
                    "site_factor": i if intended else None, "requeue": False,
                    "intended": intended, "applied": applied,
                    "error": "refused" if applied is False else None, "reason": "r%d" % i})
    return out


def _insert(conn: sqlite3.Connection, table: str, rows: list[dict]) -> None:
    for row in rows:
        cols = ", ".join(row)
        marks = ", ".join("?" for _ in row)
        conn.execute("INSERT INTO %s (%s) VALUES (%s)" % (table, cols, marks), list(row.values()))


def _insert_postgresql(url: str, tables: dict[str, list[dict]]) -> None:
    """The same rows through psycopg (one INSERT per row, like the SQLite side)."""
    engine = make_engine(url)
    with engine.begin() as conn:
        for table, rows in tables.items():
            for row in rows:
                conn.exec_driver_sql('INSERT INTO %s (%s) VALUES (%s)' % (
                    table, ", ".join('"%s"' % c for c in row), ", ".join("%%(%s)s" % c for c in row)), row)
    engine.dispose()


@pytest.fixture(scope="module")
def history(module_backend, new_database, tmp_path_factory):
    """(database path or URL, jobs, decisions): a database made by Store, filled by plain INSERTs."""
    with new_database(module_backend, tmp_path_factory.mktemp("sql"), "sql") as db:
        # creates the tables; closed now, so that the last connection's WAL checkpoint cannot
        # happen (garbage collected) while the sqlite3 command line reads the file
        Store.from_url(db).engine.dispose()
        rng = random.Random(20240607)
        jobs = _make_jobs(rng)
        decisions = _make_decisions(rng, len(jobs))
        ticks = [{"tick_id": i, "started_at": T0 + i * 3600.0, "policy": "pipeswift",
                  "dry_run": False, "status": "ok"} for i in range(1, 5)]
        tables = {"ticks": ticks, "jobs": jobs, "decisions": decisions,
                  "calibration": [{"job_class": "gpt-7b", "n_jobs": 9, "log_ratio": 0.1,
                                   "ratio": 1.10517, "updated_at": T0}]}
        if module_backend == "postgresql":
            _insert_postgresql(db, tables)
        else:
            conn = sqlite3.connect(db)
            for table, rows in tables.items():
                _insert(conn, table, rows)
            conn.commit()
            conn.close()
        yield db, jobs, decisions


@pytest.fixture(scope="module")
def run_query(admin_sql):
    """run_query(db, name): the rows of admin query ``name`` (sql/NAME.sql, on either
    database), as dicts of plain Python numbers and text."""
    return admin_sql


def _hours(x: float) -> float:
    return x / 3600.0


def _nearest_rank(values: list[float], pct: int) -> float:
    ordered = sorted(values)
    return ordered[-(-pct * len(ordered) // 100) - 1]


def test_queue_ratio_by_hour(history, run_query):
    db, jobs, _ = history
    groups = defaultdict(list)
    for j in jobs:
        if j.get("queue_s") is not None and j.get("run_s") is not None:
            hour = datetime.fromtimestamp(j["submit_time"], tz=timezone.utc).strftime("%Y-%m-%d %H:00")
            groups[hour].append(j)
    got = run_query(db, "queue_ratio_by_hour")
    assert [r["hour_utc"] for r in got] == sorted(groups)
    for row in got:
        js = groups[row["hour_utc"]]
        queue, run = sum(j["queue_s"] for j in js), sum(j["run_s"] for j in js)
        assert row["n_jobs"] == len(js)
        assert row["queue_h"] == pytest.approx(_hours(queue), abs=1e-3)
        assert row["run_h"] == pytest.approx(_hours(run), abs=1e-3)
        assert row["queue_ratio"] == pytest.approx(queue / (queue + run), abs=1e-4)
        per_job = statistics.mean(j["queue_s"] / (j["queue_s"] + j["run_s"]) for j in js)
        assert row["mean_job_ratio"] == pytest.approx(per_job, abs=1e-4)


def test_jct_by_size_class(history, run_query):
    db, jobs, _ = history
    jct = defaultdict(list)
    queue = defaultdict(list)
    for j in jobs:
        if j["state"] in FINISHED:
            jct[j["size_class"] or "unknown"].append(j["end_time"] - j["submit_time"])
            queue[j["size_class"] or "unknown"].append(j["queue_s"])
    got = run_query(db, "jct_by_size_class")
    order = [c for c in ("small", "medium", "large", "unknown") if c in jct]
    assert [r["size_class"] for r in got] == order
    for row in got:
        values = jct[row["size_class"]]
        assert row["n_jobs"] == len(values)
        assert row["mean_jct_h"] == pytest.approx(_hours(statistics.mean(values)), abs=1e-3)
        assert row["p50_jct_h"] == pytest.approx(_hours(_nearest_rank(values, 50)), abs=1e-3)
        assert row["p99_jct_h"] == pytest.approx(_hours(_nearest_rank(values, 99)), abs=1e-3)
        assert row["max_jct_h"] == pytest.approx(_hours(max(values)), abs=1e-3)
        assert row["mean_queue_h"] == pytest.approx(
            _hours(statistics.mean(queue[row["size_class"]])), abs=1e-3)


def test_nearest_rank_percentiles_on_a_known_list():
    values = [float(v) for v in range(1, 101)]
    assert (_nearest_rank(values, 50), _nearest_rank(values, 99)) == (50.0, 99.0)
    assert _nearest_rank([3.0], 99) == 3.0


def test_waits(history, run_query):
    db, jobs, _ = history
    waits = defaultdict(list)
    for j in jobs:
        if j.get("start_time") is not None:
            waits[j["size_class"] or "unknown"].append((j["queue_s"], j["job_id"], False))
        elif j["state"] == "PENDING":
            began = j["eligible_time"] or j["submit_time"]
            waits[j["size_class"] or "unknown"].append((NOW - began, j["job_id"], True))
    got = run_query(db, "waits")
    assert {r["size_class"] for r in got} == set(waits)
    assert [r["max_wait_h"] for r in got] == sorted((r["max_wait_h"] for r in got), reverse=True)
    for row in got:
        entries = waits[row["size_class"]]
        longest = max(entries)
        assert row["n_jobs"] == len(entries)
        assert row["n_pending"] == sum(1 for e in entries if e[2])
        assert row["mean_wait_h"] == pytest.approx(_hours(statistics.mean(e[0] for e in entries)),
                                                   abs=1e-3)
        assert row["max_wait_h"] == pytest.approx(_hours(longest[0]), abs=1e-3)
        assert row["max_wait_job_id"] == longest[1]
        assert row["n_over_48h"] == sum(1 for e in entries if e[0] > 172800)
    assert sum(r["n_over_48h"] for r in got) > 0  # the data has starved jobs


def test_estimator_bias(history, run_query):
    db, jobs, _ = history
    ratios = defaultdict(list)
    for j in jobs:
        if j["state"] in FINISHED and j["predicted_run_s"]:
            ratios[j["job_class"] or "(none)"].append(j["run_s"] / j["predicted_run_s"])
    got = run_query(db, "estimator_bias")
    assert [r["job_class"] for r in got] == sorted(ratios)
    for row in got:
        values = ratios[row["job_class"]]
        assert row["n_jobs"] == len(values)
        assert row["mean_ratio"] == pytest.approx(statistics.mean(values), abs=1e-4)
        assert row["median_ratio"] == pytest.approx(statistics.median_low(values), abs=1e-4)
        assert row["min_ratio"] == pytest.approx(min(values), abs=1e-4)
        assert row["max_ratio"] == pytest.approx(max(values), abs=1e-4)
        if row["job_class"] == "gpt-7b":
            assert (row["calibrated_ratio"], row["calibrated_on"]) == (pytest.approx(1.1052), 9)
        else:
            assert (row["calibrated_ratio"], row["calibrated_on"]) == (None, None)


def test_decisions(history, run_query):
    db, jobs, decisions = history
    users = {j["job_id"]: j["user"] for j in jobs}
    outcome = {True: "applied", False: "FAILED", None: "not applied"}
    expected = [(d["id"], d["job_id"], users[d["job_id"]], outcome[d["applied"]], d["error"])
                for d in sorted(decisions, key=lambda d: -d["id"]) if d["intended"]][:50]
    got = run_query(db, "decisions")
    assert [(r["id"], r["job_id"], r["user"], r["outcome"], r["error"]) for r in got] == expected
    assert got[0]["at_utc"] == datetime.fromtimestamp(
        T0 + 60 * got[0]["id"], tz=timezone.utc).strftime("%Y-%m-%d %H:%M:%S")


@pytest.mark.parametrize("name", QUERIES)
def test_runs_under_the_command_line_client(history, run_query, module_backend, name):
    """What the admin runs: sqlite3 < sql/NAME.sql, or psql -f sql/NAME.sql."""
    db, _, _ = history
    path = SQL_DIR / (name + ".sql")
    if module_backend == "sqlite":
        if shutil.which("sqlite3") is None:
            pytest.skip("no sqlite3 command line")
        argv = ["sqlite3", "-bail", "-csv", "-header", str(db)]
    else:
        psql = shutil.which("psql") or max(Path("/usr/lib/postgresql").glob("*/bin/psql"), default=None)
        if psql is None:
            pytest.skip("no psql command line")
        url = make_url(db)
        argv = [str(psql), "-X", "-q", "-v", "ON_ERROR_STOP=1", "--csv", "-h", url.host or "127.0.0.1",
                "-p", str(url.port or 5432), "-U", url.username or "postgres", "-d", url.database,
                "-c", "SET search_path TO %s" % url.query["options"].split("=", 1)[1]]
        argv += ["-f", str(path)]
    with open(path) as sql:
        done = subprocess.run(argv, stdin=sql, capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr
    assert len(done.stdout.splitlines()) == 1 + len(run_query(db, name))


def test_one_file_per_admin_query_for_every_database():
    """No dialect copies: every query is one portable file (issue 27: a rule written once)."""
    assert sorted(p.stem for p in SQL_DIR.glob("*.sql")) == sorted(QUERIES + ("schema",))
    assert [p for p in SQL_DIR.iterdir() if p.is_dir()] == []
    assert set(QUERIES) == {"queue_ratio_by_hour", "jct_by_size_class", "waits", "estimator_bias", "decisions"}


@pytest.mark.parametrize("name", QUERIES)
def test_the_admin_files_are_the_reports_own_queries(name):
    """Each file is ``pipeswift report sql NAME``: the reports' query (store/reads.py) with
    its parameters written in, so a figure is defined once."""
    from click.testing import CliRunner

    from pipeswift_slurm.cli.main import pipeswift

    printed = CliRunner().invoke(pipeswift, ["report", "sql", name])
    assert printed.exit_code == 0, printed.output
    assert printed.output == admin_sql.render(name)
    assert (SQL_DIR / (name + ".sql")).read_text() == printed.output, (
        "sql/%s.sql is out of date: pipeswift report sql %s > sql/%s.sql" % (name, name, name))
    body = printed.output.split("WITH report AS (", 1)[1]
    assert ":" not in body.replace("%H:00", "")  # every parameter written in
    refused = CliRunner().invoke(pipeswift, ["report", "sql", "nope"])
    assert refused.exit_code == 2 and "no admin query 'nope'; choose one of: queue_ratio_by_hour" in refused.output


def test_sqlite_date_functions_agree_on_both_databases(history):
    """The admin files call SQLite's datetime() and strftime(); on PostgreSQL the store
    creates both, and they give the same text (fractions truncated, NULL for NULL or for an
    unknown modifier)."""
    db, _, _ = history
    engine = make_engine(str(db))
    try:
        with engine.connect() as conn:
            def one(sql: str, t):
                return conn.execute(text(sql), {"t": t}).scalar()
            for t in (T0, T0 + 59.7, 0.0):
                want = datetime.fromtimestamp(int(t), tz=timezone.utc)
                assert one("SELECT datetime(CAST(:t AS DOUBLE PRECISION), 'unixepoch')", t) == \
                    want.strftime("%Y-%m-%d %H:%M:%S")
                assert one("SELECT strftime('%Y-%m-%d %H:00', CAST(:t AS DOUBLE PRECISION), 'unixepoch')",
                           t) == want.strftime("%Y-%m-%d %H:00")
            assert one("SELECT datetime(CAST(:t AS DOUBLE PRECISION), 'unixepoch')", None) is None
            assert one("SELECT datetime(CAST(:t AS DOUBLE PRECISION), 'localtime?')", T0) is None
    finally:
        engine.dispose()
