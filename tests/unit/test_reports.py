"""Reports (pipeswift_slurm.reports.queries / report_render / cli_report) on two histories: one
written by the simulator (``pipeswift simulate --db``) and one written tick by tick through
``Store.tick`` the way the real controller records Slurm's view. Every reported number is
compared with a value computed independently in Python from the raw rows (read with the
database driver) or from the simulator's own job records, and with the admin SQL files
in ``sql/``; on SQLite, and on PostgreSQL when a test server is up
(``tests/pg/postgres.sh``). Outputs (PNG, HTML, Prometheus, CSV/JSON, CLI) are checked for content."""

from __future__ import annotations

import base64
import csv
import html
import io
import json
import math
import random
import re
import sqlite3
import statistics
from collections import defaultdict
from datetime import UTC, datetime
from pathlib import Path

import pytest
from click.testing import CliRunner

from pipeswift_slurm.reports import render as RR
from pipeswift_slurm.reports import queries as R
from pipeswift_slurm.cli.main import pipeswift
from pipeswift_slurm.core.files import write_atomic
from pipeswift_slurm.core.megatron import profile_from_argv
from pipeswift_slurm.core.model import ClusterView, Decision, ExecConfig, Job, Node
from pipeswift_slurm.store.history import CalibrationEntry, Store, make_engine
from pipeswift_slurm.core.token import ProfileRequest, encode_profile

SQL_DIR = Path(__file__).resolve().parents[2] / "sql"
T0 = 1_700_000_000.0
TICK_S = 600.0
N_TICKS = 80  # 13 h 20 min of ticks
ARGV = (
    "--num-layers",
    "24",
    "--hidden-size",
    "2048",
    "--num-attention-heads",
    "16",
    "--seq-length",
    "2048",
    "--max-position-embeddings",
    "2048",
    "--global-batch-size",
    "512",
    "--bf16",
    "--train-iters",
    "1000",
)
CLASSES = ("gpt-1b", "gpt-7b", "llama-8b")
FINISHED = ("COMPLETED", "COMPLETED?")
NODES = tuple(Node("n%02d" % i, 8) for i in range(4))


# ---------------------------------------------------------------- the controller-shaped history


def _job_specs(rng: random.Random) -> list[dict]:
    """Ground truth of 48 jobs: submit/start/end (None = never), final state, vanishing."""
    specs = []
    for job_id in range(101, 149):
        submit = T0 + rng.uniform(0, 9 * 3600)
        eligible = submit + 120.0 if job_id % 5 == 0 else None
        begin = eligible if eligible is not None else submit
        queue = rng.choice([0.0, rng.uniform(30, 1800), rng.uniform(1800, 4 * 3600)])
        run = rng.uniform(300, 3 * 3600)
        start = begin + queue if job_id % 11 else None  # every 11th never starts
        end = start + run if start is not None else None
        specs.append(
            {
                "job_id": job_id,
                "submit": submit,
                "eligible": eligible,
                "start": start,
                "end": end,
                "gpus": rng.choice([1, 2, 4, 8, 16]),
                "user": "u%d" % (job_id % 3),
                "partition": "gpu" if job_id % 4 else "big",
                "final": "FAILED" if job_id % 13 == 0 else "COMPLETED",
                "vanish": job_id % 7 == 0,
                "job_class": CLASSES[job_id % 3],
                "bias": (0.8, 1.0, 1.4)[job_id % 3],
            }
        )
    return specs


def _observed(spec: dict, now: float, prev: float) -> Job | None:
    """The job as Slurm shows it at ``now`` (None once it has left the queue)."""
    start, end = spec["start"], spec["end"]
    if spec["submit"] > now or (end is not None and end <= prev):
        return None
    common = dict(
        gpus=spec["gpus"],
        user=spec["user"],
        name="j%d" % spec["job_id"],
        partition=spec["partition"],
        eligible_time=spec["eligible"],
        opted_in=True,
        num_nodes=max(1, spec["gpus"] // 8),
    )
    if start is None or start > now:
        return Job(spec["job_id"], "PENDING", spec["submit"], state_reason="Priority", **common)
    if end > now:
        return Job(spec["job_id"], "RUNNING", spec["submit"], start_time=start, **common)
    if spec["vanish"]:
        return None  # left between two ticks; the controller closes it as COMPLETED?
    return Job(spec["job_id"], spec["final"], spec["submit"], start_time=start, end_time=end, **common)


def _record_tick(store: Store, now: float, prev: float, specs: list[dict], rng: random.Random) -> None:
    jobs = [j for j in (_observed(s, now, prev) for s in specs) if j is not None]
    by_id = {s["job_id"]: s for s in specs}
    with store.tick(now, "pipeswift") as tx:
        summary = tx.save_snapshot(ClusterView(now, NODES, tuple(jobs)))
        if summary.vanished:
            tx.mark_vanished(summary.vanished, now)
        new = [j for j in jobs if j.job_id not in tx.profile_texts([j.job_id])]
        for job in new:
            spec = by_id[job.job_id]
            req = ProfileRequest(ARGV, (1, 16), job_class=spec["job_class"], world_size=spec["gpus"])
            tx.upsert_profile(
                job.job_id,
                encode_profile(req),
                profile_from_argv(
                    ARGV, world_size=spec["gpus"], gpu_range=(1, 16), job_class=spec["job_class"]
                ),
            )
        tx.set_predicted_runs(
            {
                j.job_id: (by_id[j.job_id]["end"] - by_id[j.job_id]["start"]) / by_id[j.job_id]["bias"]
                for j in jobs
                if j.state == "RUNNING"
            }
        )
        decisions, applied = [], {}
        for job in (j for j in jobs if j.state == "PENDING"):
            cfg = (
                ExecConfig(
                    tp=1,
                    pp=2,
                    dp=job.gpus // 2 or 1,
                    micro_batch_size=1,
                    num_micro_batches=8,
                    num_nodes=1,
                    gpus_per_node=max(2, job.gpus),
                )
                if rng.random() < 0.3
                else None
            )
            decisions.append(
                Decision(
                    job.job_id,
                    config=cfg,
                    site_factor=rng.randint(1, 5) * 1000,
                    reason="queued (tick %d)" % int((now - T0) / TICK_S),
                    predicted_start_s=now + 300.0,
                    predicted_end_s=now + 4000.0,
                )
            )
            applied[job.job_id] = rng.choice([True, True, False, None])
        decisions.append(Decision(jobs[0].job_id, reason="nothing to change")) if jobs else None
        tx.record_decisions(
            decisions, applied, {j: "scontrol refused" for j, a in applied.items() if a is False}
        )
        tx.finish(duration_s=0.05 + 0.001 * len(jobs))


@pytest.fixture(scope="module")
def ctl_db(module_backend, new_database, tmp_path_factory):
    """(path or URL, specs): a history written through Store.tick like the real controller's."""
    with new_database(module_backend, tmp_path_factory.mktemp("ctl"), "ctl") as url:
        store = Store.from_url(url)
        rng = random.Random(7)
        specs = _job_specs(rng)
        prev = T0 - TICK_S
        for i in range(N_TICKS):
            now = T0 + i * TICK_S
            _record_tick(store, now, prev, specs, rng)
            prev = now
        store.save_calibration([CalibrationEntry("gpt-7b", 12, math.log(1.3), T0)])
        store.engine.dispose()
        yield url, specs


@pytest.fixture(scope="module")
def sim_db(module_backend, new_database, tmp_path_factory):
    """(path or URL, comparison): ``pipeswift simulate --db`` on 60 synthetic jobs."""
    from pipeswift_slurm.sim.runner import RunSpec, run_comparison

    with new_database(module_backend, tmp_path_factory.mktemp("sim"), "sim") as url:
        stores = []

        def store_for(_policy):
            stores.append(Store.from_url(url))
            return stores[-1]

        comp = run_comparison(RunSpec(gpus=32, synthetic_jobs=60, policies=("pipeswift",), seed=3),
                              store_for=store_for)
        for store in stores:
            store.engine.dispose()
        yield url, comp


@pytest.fixture(params=["ctl", "sim"])
def db(request, ctl_db, sim_db):
    """Each history in turn (on the module's backend)."""
    return (ctl_db if request.param == "ctl" else sim_db)[0]


@pytest.fixture
def empty_db(backend, new_database, tmp_path):
    with new_database(backend, tmp_path, "empty") as url:
        Store.from_url(url).engine.dispose()
        yield url


# ---------------------------------------------------------------- independent computations


def raw(db: str, table: str) -> list[dict]:
    """Every row of ``table`` as stored (no type conversion), straight from the driver."""
    engine = make_engine(db)
    try:
        with engine.connect() as conn:
            return [dict(r._mapping) for r in conn.exec_driver_sql("SELECT * FROM %s" % table)]
    finally:
        engine.dispose()


def nearest(values: list[float], pct: int) -> float:
    ordered = sorted(values)
    return ordered[max(1, -(-pct * len(ordered) // 100)) - 1]


def in_window(job: dict, since=None, until=None) -> bool:
    t = job["submit_time"]
    return t is not None and (since is None or t >= since) and (until is None or t < until)


def group_of(job: dict, by: str) -> str:
    t = job["submit_time"]
    if by == "hour":
        return datetime.fromtimestamp(int(t // 3600) * 3600, tz=UTC).strftime("%Y-%m-%d %H:00")
    if by == "day":
        return datetime.fromtimestamp(int(t // 86400) * 86400, tz=UTC).strftime("%Y-%m-%d")
    if by == "user":
        return job["user"] or "(none)"
    if by == "partition":
        return job["partition"] or "(none)"
    return job["size_class"] or "unknown"


def approx(value):
    return pytest.approx(value, rel=1e-9, abs=1e-9)


# ---------------------------------------------------------------- the ground truth went in as written


def test_controller_history_matches_ground_truth(ctl_db):
    path, specs = ctl_db
    jobs = {j["job_id"]: j for j in raw(path, "jobs")}
    assert len(jobs) == len(specs)
    for s in specs:
        row = jobs[s["job_id"]]
        if s["start"] is None:
            assert row["state"] == "PENDING" and row["queue_s"] is None
            continue
        assert row["start_time"] == approx(s["start"])
        begin = s["eligible"] if s["eligible"] is not None else s["submit"]
        assert row["queue_s"] == approx(s["start"] - begin)
        if s["vanish"] and s["end"] < T0 + (N_TICKS - 1) * TICK_S:
            assert row["state"] == "COMPLETED?" and row["end_time"] >= s["end"]
        elif s["end"] <= T0 + (N_TICKS - 1) * TICK_S:
            assert row["state"] == s["final"] and row["end_time"] == approx(s["end"])
    states = {j["state"] for j in jobs.values()}
    assert {"PENDING", "COMPLETED", "COMPLETED?", "FAILED"} <= states


# ---------------------------------------------------------------- queue ratio


@pytest.mark.parametrize("by", ["hour", "day", "user", "size", "partition"])
def test_queue_ratio_matches_python(db, by):
    jobs = [
        j for j in raw(db, "jobs") if j["queue_s"] is not None and j["run_s"] is not None and in_window(j)
    ]
    groups = defaultdict(list)
    for j in jobs:
        groups[group_of(j, by)].append(j)
    rep = R.queue_ratio(Store.from_url(db), by=by)
    assert [r.group for r in rep.rows] == sorted(
        groups, key=lambda g: (R.SIZE_ORDER.index(g), g) if by == "size" else g
    )
    for row in rep.rows:
        members = groups[row.group]
        q, r = sum(j["queue_s"] for j in members), sum(j["run_s"] for j in members)
        assert row.n_jobs == len(members)
        assert row.queue_s == approx(q) and row.run_s == approx(r)
        assert row.queue_ratio == approx(q / (q + r)) if q + r else row.queue_ratio is None
        ratios = [j["queue_s"] / (j["queue_s"] + j["run_s"]) for j in members if j["queue_s"] + j["run_s"]]
        assert row.mean_job_ratio == approx(statistics.fmean(ratios))
    q_all, r_all = sum(j["queue_s"] for j in jobs), sum(j["run_s"] for j in jobs)
    assert rep.overall.n_jobs == len(jobs)
    assert rep.overall.queue_ratio == approx(q_all / (q_all + r_all))


def test_queue_ratio_verdict_uses_small_jobs_and_threshold(db):
    small = [
        j
        for j in raw(db, "jobs")
        if j["queue_s"] is not None and j["run_s"] is not None and j["size_class"] == "small"
    ]
    ratio = sum(j["queue_s"] for j in small) / sum(j["queue_s"] + j["run_s"] for j in small)
    store = Store.from_url(db)
    rep = R.queue_ratio(store, by="size")
    assert rep.small.n_jobs == len(small) and rep.small.queue_ratio == approx(ratio)
    below, above = R.queue_ratio(store, threshold=ratio - 0.01), R.queue_ratio(store, threshold=ratio + 0.01)
    assert below.bound == "queue" and below.verdict.startswith(
        "queue-bound: small jobs spend %.0f%%" % (100 * ratio)
    )
    assert above.bound == "execution" and above.verdict.startswith("execution-bound")


def test_queue_ratio_matches_simulator_metrics(sim_db):
    path, comp = sim_db
    metrics = comp.metrics[0]
    rep = R.queue_ratio(Store.from_url(path))
    assert rep.overall.n_jobs == metrics["jobs"] == len(comp.results[0].records)
    assert rep.overall.queue_ratio == pytest.approx(metrics["queue_ratio"], rel=1e-9)


# ---------------------------------------------------------------- JCT


@pytest.mark.parametrize("by", ["size", "user", "hour"])
def test_jct_matches_python(db, by):
    done = [
        j
        for j in raw(db, "jobs")
        if j["state"] in FINISHED and j["start_time"] is not None and j["end_time"] is not None
    ]
    groups = defaultdict(list)
    for j in done:
        groups[group_of(j, by)].append(j)
    rep = R.jct(Store.from_url(db), by=by)
    assert {r.group for r in rep.rows} == set(groups)
    for row in rep.rows + [rep.overall]:
        members = done if row.group == "all" else groups[row.group]
        jct = [j["end_time"] - j["submit_time"] for j in members]
        assert row.n_jobs == len(members)
        assert row.mean_s == approx(statistics.fmean(jct))
        assert (row.p50_s, row.p95_s, row.p99_s) == (nearest(jct, 50), nearest(jct, 95), nearest(jct, 99))
        assert row.max_s == max(jct)
        assert row.mean_queue_s == approx(statistics.fmean(j["queue_s"] for j in members))


def test_jct_matches_simulator_records(sim_db):
    path, comp = sim_db
    jct = [r.jct_s for r in comp.results[0].records]
    rep = R.jct(Store.from_url(path))
    assert rep.overall.n_jobs == len(jct)
    assert rep.overall.mean_s == pytest.approx(statistics.fmean(jct), rel=1e-9)
    for got, pct in ((rep.overall.p50_s, 50), (rep.overall.p95_s, 95), (rep.overall.p99_s, 99)):
        assert got == pytest.approx(nearest(jct, pct), rel=1e-9)
    values = R.jct_values(Store.from_url(path))
    assert sorted(v for vs in values.values() for v in vs) == pytest.approx(sorted(jct), rel=1e-9)


# ---------------------------------------------------------------- waits


@pytest.mark.parametrize("bound_s", [600.0, 3600.0, 86400.0])
def test_waits_match_python(db, bound_s):
    now = max(t["started_at"] for t in raw(db, "ticks"))
    waits = defaultdict(list)
    for j in raw(db, "jobs"):
        if j["start_time"] is not None:
            waits[group_of(j, "size")].append((j["queue_s"], j["job_id"], False))
        elif j["state"] == "PENDING":
            begin = j["eligible_time"] if j["eligible_time"] is not None else j["submit_time"]
            waits[group_of(j, "size")].append((now - begin, j["job_id"], True))
    rep = R.waits(Store.from_url(db), wait_bound_s=bound_s)
    assert rep.now_s == now and {r.group for r in rep.rows} == set(waits)
    for row in rep.rows + [rep.overall]:
        members = [w for ws in waits.values() for w in ws] if row.group == "all" else waits[row.group]
        values = [w for w, _, _ in members]
        assert row.n_jobs == len(members) and row.n_pending == sum(p for _, _, p in members)
        assert row.mean_s == approx(statistics.fmean(values))
        assert row.median_s == nearest(values, 50) and row.max_s == approx(max(values))
        assert row.max_job_id == min(j for w, j, _ in members if w == max(values))
        assert row.n_over_bound == sum(1 for v in values if v > bound_s)


def test_waits_match_simulator_metrics(sim_db):
    path, comp = sim_db
    metrics = comp.metrics[0]
    rep = R.waits(Store.from_url(path), wait_bound_s=1800.0)
    assert rep.overall.max_s == pytest.approx(metrics["max_wait_s"], rel=1e-9)
    assert rep.overall.n_over_bound == sum(1 for r in comp.results[0].records if r.queue_s > 1800.0)


# ---------------------------------------------------------------- bias


def test_bias_matches_python(db):
    ratios = defaultdict(list)
    for j in raw(db, "jobs"):
        if j["state"] in FINISHED and (j["run_s"] or 0) > 0 and (j["predicted_run_s"] or 0) > 0:
            ratios[j["job_class"] or "(none)"].append(j["run_s"] / j["predicted_run_s"])
    calibration = {c["job_class"]: c for c in raw(db, "calibration")}
    rep = R.bias(Store.from_url(db))
    assert [r.job_class for r in rep.rows] == sorted(ratios)
    for row in rep.rows:
        values = ratios[row.job_class]
        assert row.n_jobs == len(values)
        assert row.mean_ratio == approx(statistics.fmean(values))
        assert row.median_ratio == nearest(values, 50)
        assert (row.min_ratio, row.max_ratio) == (min(values), max(values))
        cal = calibration.get(row.job_class)
        assert row.calibrated_ratio == (cal["ratio"] if cal else None)
        assert row.calibrated_on == (cal["n_jobs"] if cal else None)
    assert rep.calibration == {k: (c["ratio"], c["n_jobs"]) for k, c in calibration.items()}


def test_bias_recovers_the_controller_histories_true_bias(ctl_db):
    """Running jobs were predicted at actual / bias, so the measured ratio is the bias."""
    path, specs = ctl_db
    rep = R.bias(Store.from_url(path))
    truth = {s["job_class"]: s["bias"] for s in specs}
    vanished = {j["job_id"] for j in raw(path, "jobs") if j["state"] == "COMPLETED?"}
    assert rep.rows and all(r.job_class in truth for r in rep.rows)
    for row in rep.rows:
        if not any(s["job_id"] in vanished and s["job_class"] == row.job_class for s in specs):
            assert row.median_ratio == pytest.approx(truth[row.job_class], rel=1e-9)
    assert next(r for r in rep.rows if r.job_class == "gpt-7b").calibrated_ratio == pytest.approx(1.3)


# ---------------------------------------------------------------- decisions and ticks


def test_decisions_match_python(db):
    rows = raw(db, "decisions")
    users = {j["job_id"]: j["user"] for j in raw(db, "jobs")}
    rep = R.decisions(Store.from_url(db), limit=15)
    intended = sorted((r for r in rows if r["intended"]), key=lambda r: -r["id"])
    assert [d.id for d in rep.rows] == [r["id"] for r in intended[:15]]
    outcome = {1: "applied", 0: "FAILED", None: "not applied"}
    for d, r in zip(rep.rows, intended[:15], strict=True):
        assert (d.job_id, d.user, d.kind, d.outcome, d.reason, d.at_s) == (
            r["job_id"],
            users[r["job_id"]],
            r["kind"],
            outcome[r["applied"]],
            r["reason"],
            r["at"],
        )
    assert rep.n_total == len(rows) and rep.n_intended == len(intended)
    assert rep.n_applied == sum(1 for r in rows if r["applied"] == 1)
    assert rep.n_failed == sum(1 for r in rows if r["applied"] == 0)
    assert rep.n_not_attempted == sum(1 for r in rows if r["intended"] and r["applied"] is None)
    job = rows[0]["job_id"]
    mine = R.decisions(Store.from_url(db), job_id=job, all_kinds=True, limit=1000)
    assert [d.id for d in mine.rows] == sorted((r["id"] for r in rows if r["job_id"] == job), reverse=True)


def test_levers_and_most_requeued_match_python(db_url):
    """Applied decisions per lever and the jobs requeued most, against the raw rows: a
    history with every lever, preemptions and reshapes, and refused and untried decisions
    (which do not count)."""
    cfg = ExecConfig(tp=1, pp=2, dp=4, micro_batch_size=1, num_micro_batches=8, num_nodes=1, gpus_per_node=8)
    store = Store.from_url(db_url)
    jobs = tuple(Job(i, "RUNNING" if i <= 3 else "PENDING", T0 - 900, gpus=8, user="u%d" % (i % 2),
                     start_time=T0 - 600 if i <= 3 else None, node_list=("n0",) if i <= 3 else ())
                 for i in range(1, 7))
    script = [  # per tick: (decision, applied)
        [(Decision(1, requeue=True, site_factor=0), True), (Decision(2, config=cfg, requeue=True), True),
         (Decision(4, hold=True), True), (Decision(5, config=cfg, site_factor=7), True),
         (Decision(6, partition="h100", config=cfg), False)],
        [(Decision(1, requeue=True, site_factor=0), True), (Decision(3, requeue=True), None),
         (Decision(4, hold=False), True), (Decision(5, time_limit_s=3600), True)],
        [(Decision(1, config=cfg, requeue=True), True), (Decision(2, requeue=True, site_factor=0), False),
         (Decision(6, partition="h100"), True), (Decision(5, reason="nothing to change"), True)],
    ]
    for i, tick in enumerate(script):
        with store.tick(T0 + i * TICK_S, "pipeswift:preempt") as tx:
            tx.save_snapshot(ClusterView(T0 + i * TICK_S, NODES, jobs))
            tx.record_decisions([d for d, _ in tick], {d.job_id: a for d, a in tick}, {})
            tx.finish(duration_s=0.01)
    store.engine.dispose()

    applied = [r for r in raw(db_url, "decisions") if r["applied"] == 1]
    kinds = [(r["job_id"], set(r["kind"].split("+"))) for r in applied]
    users = {j["job_id"]: j["user"] for j in raw(db_url, "jobs")}
    rep = R.decisions(Store.from_url(db_url))
    got = {c.lever: (c.n_decisions, c.n_jobs) for c in rep.levers}
    for lever in ("resize", "site_factor", "time_limit", "requeue", "hold", "release", "move"):
        hits = [j for j, k in kinds if lever in k]
        assert got[lever] == (len(hits), len(set(hits))), lever
    reshapes = [j for j, k in kinds if {"requeue", "resize"} <= k]
    assert got["requeue_reshape"] == (len(reshapes), len(set(reshapes))) == (2, 2)
    assert got["requeue"] == (4, 2) and got["hold"] == got["release"] == (1, 1) and got["move"] == (1, 1)
    assert [(j.job_id, j.user, j.requeues) for j in rep.most_requeued] == [(1, users[1], 3), (2, users[2], 1)]
    only = R.decisions(Store.from_url(db_url), job_id=2)
    assert {c.lever: c.n_decisions for c in only.levers}["requeue"] == 1
    assert [j.job_id for j in only.most_requeued] == [2]

    table = RR.levers_table(rep)
    assert [r[0] for r in table.rows] == [c.lever for c in rep.levers]
    assert "requeues: 4 on 2 job(s), 2 into a new shape (reshape), 2 without (preemption)" in table.notes[0]
    assert table.notes[1] == "requeued most: job 1 (%s) 3 x, job 2 (%s) 1 x" % (users[1], users[2])
    out = CliRunner().invoke(pipeswift, ["report", "decisions", "--db", db_url])
    assert out.exit_code == 0, out.output
    assert "Levers moved" in out.output and "requeued most: job 1" in out.output
    data = json.loads(CliRunner().invoke(pipeswift, ["report", "decisions", "--db", db_url, "--format", "json"]).output)
    assert {c["lever"]: c["n_decisions"] for c in data["levers"]}["requeue_reshape"] == 2


def test_levers_table_says_when_nothing_was_applied():
    from pipeswift_slurm.reports.base import DecisionsReport, LeverCount

    zeros = [LeverCount(name, 0, 0) for name in ("resize", "requeue", "requeue_reshape")]
    dry = RR.levers_table(DecisionsReport([], 5, 3, 0, 0, 3, 50, zeros))
    assert dry.notes == ["no decision was applied in the window (3 not attempted: a dry run?); these counts are of "
                         "applied decisions"]
    assert RR.levers_table(DecisionsReport([], 5, 0, 0, 0, 0, 50, zeros)).notes == []


def test_tick_stats_match_python(db):
    ticks = raw(db, "ticks")
    last = max(ticks, key=lambda t: (t["started_at"], t["tick_id"]))
    stats = R.tick_stats(Store.from_url(db))
    assert stats.n_ticks == len(ticks) and stats.n_failed == sum(t["status"] == "failed" for t in ticks)
    assert (stats.last_tick_s, stats.last_duration_s, stats.last_status) == (
        last["started_at"],
        last["duration_s"],
        last["status"],
    )
    assert stats.mean_duration_s == approx(statistics.fmean(t["duration_s"] for t in ticks))


def test_window_selects_by_submit_time(ctl_db):
    path, _ = ctl_db
    since, until = T0 + 2 * 3600, T0 + 6 * 3600
    jobs = [j for j in raw(path, "jobs") if in_window(j, since, until)]
    store = Store.from_url(path)
    window = R.Window(since, until)
    assert R.job_count(store, window).n_jobs == len(jobs)
    done = [j["end_time"] - j["submit_time"] for j in jobs if j["state"] in FINISHED]
    assert R.jct(store, window).overall.n_jobs == len(done)
    assert R.jct(store, window).overall.p50_s == nearest(done, 50)
    decisions = [d for d in raw(path, "decisions") if since <= d["at"] < until]
    assert R.decisions(store, window).n_total == len(decisions)


@pytest.mark.parametrize(
    "text, expected",
    [
        ("0", 0.0),
        ("1700000000.5", 1700000000.5),
        ("2023-11-14", 1699920000.0),
        ("2023-11-14T22:13:20", 1700000000.0),
        ("2023-11-14 23:13:20+01:00", 1700000000.0),
        ("-2h", 1700000000.0 - 7200),
        ("-1d", 1700000000.0 - 86400),
        ("-30m", 1700000000.0 - 1800),
        (None, None),
    ],
)
def test_parse_time(text, expected):
    assert R.parse_time(text, latest_s=1700000000.0) == expected


@pytest.mark.parametrize("text", ["yesterday", "2023-13-01", "-5y"])
def test_parse_time_rejects(text):
    with pytest.raises(R.ReportError):
        R.parse_time(text, latest_s=0.0)


@pytest.mark.parametrize("text", ["nan", "inf", "1e400", "9" * 23, "-99999999999999999999d"])
def test_parse_time_rejects_times_the_reports_cannot_show(text):
    """Such a --since/--until was taken, and printing the window raised OverflowError."""
    with pytest.raises(R.ReportError, match="between the years 1 and 9999"):
        R.parse_time(text, latest_s=0.0)


# ---------------------------------------------------------------- the sql/ files agree


@pytest.fixture(scope="module")
def run_sql(admin_sql):
    """run_sql(db, name): the rows of admin query sql/<name>.sql on that database."""
    return admin_sql


def hours(seconds):
    return pytest.approx(seconds / 3600.0, abs=6e-4)


def test_sql_files_agree_with_reports(db, run_sql):
    store = Store.from_url(db)
    by_hour = R.queue_ratio(store, by="hour")
    sql = run_sql(db, "queue_ratio_by_hour.sql")
    assert [(r["hour_utc"], r["n_jobs"]) for r in sql] == [(r.group, r.n_jobs) for r in by_hour.rows]
    for s, r in zip(sql, by_hour.rows, strict=True):
        assert s["queue_ratio"] == pytest.approx(r.queue_ratio, abs=6e-5)
    jct = {r.group: r for r in R.jct(store).rows}
    for s in run_sql(db, "jct_by_size_class.sql"):
        r = jct[s["size_class"]]
        assert s["n_jobs"] == r.n_jobs
        assert (s["mean_jct_h"], s["p50_jct_h"], s["p99_jct_h"], s["max_jct_h"]) == (
            hours(r.mean_s),
            hours(r.p50_s),
            hours(r.p99_s),
            hours(r.max_s),
        )
    waits = {r.group: r for r in R.waits(store).rows}
    for s in run_sql(db, "waits.sql"):
        r = waits[s["size_class"]]
        assert (s["n_jobs"], s["n_pending"], s["n_over_48h"]) == (r.n_jobs, r.n_pending, r.n_over_bound)
        assert (s["mean_wait_h"], s["max_wait_h"]) == (hours(r.mean_s), hours(r.max_s))
    bias = {r.job_class: r for r in R.bias(store).rows}
    for s in run_sql(db, "estimator_bias.sql"):
        r = bias[s["job_class"]]
        assert (s["n_jobs"], s["median_ratio"]) == (r.n_jobs, pytest.approx(r.median_ratio, abs=6e-5))
    assert [s["id"] for s in run_sql(db, "decisions.sql")] == [
        d.id for d in R.decisions(store, limit=50).rows
    ]


# ---------------------------------------------------------------- empty database


def test_empty_database_reports_are_empty(empty_db):
    store = Store.from_url(empty_db)
    full = R.full_report(store)
    assert full.jobs.n_jobs == 0 and full.queue_ratio.rows == [] and full.queue_ratio.bound is None
    assert full.jct.overall is None and full.waits.overall is None and full.bias.rows == []
    assert full.decisions.n_total == 0 and full.ticks.n_ticks == 0 and full.ticks.last_tick_s is None
    assert "no verdict" in full.queue_ratio.verdict
    assert RR.text_tables(RR.full_tables(full))  # renders without failing
    parse_prometheus(RR.prometheus_text(full))


# ---------------------------------------------------------------- renderers


def test_png_figures_have_their_content(ctl_db, tmp_path):
    from matplotlib.image import imread

    store = Store.from_url(ctl_db[0])
    full = R.full_report(store)
    hourly = R.queue_ratio(store, by="hour")
    fig = RR.figure("queue-ratio", hourly)
    ax = fig.axes[0]
    hours, rolling = ax.lines[0], ax.lines[1]
    assert len(ax.lines) == 3  # the faint hourly values, the 6-hour rolling curve, the threshold
    kept = [r for r in hourly.rows if r.queue_ratio is not None]
    assert list(hours.get_ydata()) == pytest.approx([r.queue_ratio for r in kept])
    assert "6-hour rolling" in rolling.get_label()
    for row, got in zip(kept, rolling.get_ydata()):  # queue / JCT of the buckets in the 6 h up to this one
        inside = [r for r in kept if row.bucket_s - 6 * 3600 < r.bucket_s <= row.bucket_s]
        assert got == pytest.approx(sum(r.queue_s for r in inside) / sum(r.queue_s + r.run_s for r in inside))
    values = R.jct_values(store)
    assert len(RR.figure("jct", full.jct, values).axes[0].lines) == len(values)
    bias_ax = RR.figure("bias", full.bias).axes[0]
    assert [p.get_height() for p in bias_ax.patches] == pytest.approx(
        [r.median_ratio for r in full.bias.rows]
    )
    assert len(RR.figure("waits", full.waits).axes[0].patches) == 2 * len(full.waits.rows)
    assert len(RR.figure("decisions", full.decisions).axes[0].patches) == 4
    all_fig = RR.figure("all", full, values)
    assert len(all_fig.axes) == 4
    out = tmp_path / "all.png"
    RR.save_png(all_fig, str(out))
    data = out.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 30_000
    height, width = imread(str(out)).shape[:2]
    assert (width, height) == (800, 4 * 360)
    assert imread(str(out))[..., :3].std() > 0.05  # not a blank canvas


def test_a_dollar_in_a_name_is_text_in_a_figure() -> None:
    """Found by fuzzing: a class or group name with '$' was read by matplotlib as a formula,
    and bad TeX in it failed the whole report."""
    from pipeswift_slurm.reports.queries import BiasReport, BiasRow

    rows = [BiasRow("gpt-$\\frac{", 3, 1.1, 1.0, 0.9, 1.2, None, None)]
    fig = RR.figure("bias", BiasReport(rows, {}))
    assert RR.png_bytes(fig)[:4] == b"\x89PNG"
    assert [t.get_text() for t in fig.axes[0].get_xticklabels()] == ["gpt-\\$\\frac{"]


def test_html_report_embeds_figures_and_tables(ctl_db):
    store = Store.from_url(ctl_db[0])
    full = R.full_report(store)
    tables = RR.full_tables(full)
    png = RR.png_bytes(RR.figure("all", full, R.jct_values(store)))
    page = RR.html_report("pipeswift report", [full.queue_ratio.verdict], tables, [("all", png)])
    assert page.count('<img src="data:image/png;base64,') == 1
    b64 = re.search(r'data:image/png;base64,([A-Za-z0-9+/=]+)"', page).group(1)
    assert base64.b64decode(b64) == png
    for header in (
        "<th>queue_ratio</th>",
        "<th>p95_s</th>",
        "<th>p99_s</th>",
        "<th>median_ratio</th>",
        "<th>n_over_bound</th>",
        "<th>outcome</th>",
    ):
        assert header in page
    assert page.count("<table>") == len(tables)
    assert html.escape(full.queue_ratio.verdict) in page


LINE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{([a-zA-Z_][a-zA-Z0-9_]*="(?:[^"\\]|\\.)*",?)*\})? (\S+)$')


def parse_prometheus(text: str) -> dict[tuple[str, tuple], float]:
    """Samples of a text exposition, checked line by line: {(name, labels): value}."""
    samples, typed = {}, set()
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            typed.add(line.split()[2])
            continue
        if line.startswith("#"):
            assert line.startswith("# HELP ")
            continue
        m = LINE.match(line)
        assert m, "bad exposition line: %r" % line
        labels = tuple(re.findall(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"', m.group(2) or ""))
        base = re.sub(r"_(sum|count)$", "", m.group(1))
        assert m.group(1) in typed or base in typed, "sample before its # TYPE: %s" % line
        samples[(m.group(1), labels)] = float(m.group(4))
    return samples


def test_prometheus_text_parses_and_matches(ctl_db, tmp_path):
    path, _ = ctl_db
    store = Store.from_url(path)
    full = R.full_report(store, by="size")
    out = tmp_path / "pipeswift.prom"
    write_atomic(str(out), RR.prometheus_text(full))
    assert [p.name for p in tmp_path.iterdir()] == ["pipeswift.prom"]  # no temp file left
    s = parse_prometheus(out.read_text())
    assert s[("pipeswift_queue_ratio", ())] == pytest.approx(full.queue_ratio.overall.queue_ratio)
    jct = {r.group: r for r in full.jct.rows}
    for size, row in jct.items():
        assert s[("pipeswift_jct_seconds", (("size", size), ("quantile", "0.99")))] == pytest.approx(
            row.p99_s
        )
        assert s[("pipeswift_jct_seconds", (("size", size), ("quantile", "0.95")))] == pytest.approx(
            row.p95_s
        )
        assert s[("pipeswift_jct_seconds_count", (("size", size),))] == row.n_jobs
    assert s[("pipeswift_jobs_over_wait_bound", ())] == full.waits.overall.n_over_bound
    for row in full.bias.rows:
        assert s[("pipeswift_estimator_bias", (("job_class", row.job_class),))] == pytest.approx(
            row.median_ratio
        )
    ticks = raw(path, "ticks")
    last = max(ticks, key=lambda t: t["started_at"])
    assert s[("pipeswift_last_tick_timestamp_seconds", ())] == last["started_at"]
    assert s[("pipeswift_tick_duration_seconds", ())] == pytest.approx(last["duration_s"])
    assert s[("pipeswift_calibration_ratio", (("job_class", "gpt-7b"),))] == pytest.approx(1.3)
    applied = [set(r["kind"].split("+")) for r in raw(path, "decisions") if r["applied"] == 1]
    assert s[("pipeswift_decision_levers", (("lever", "resize"),))] == sum("resize" in k for k in applied) > 0
    assert s[("pipeswift_decision_levers", (("lever", "requeue"),))] == 0 == s[("pipeswift_job_requeues_max", ())]


def test_prometheus_label_escaping():
    m = RR.Metrics()
    m.family("x", "gauge", "h", [({"job_class": 'a"b\\c\nd'}, 1.5)])
    assert 'x{job_class="a\\"b\\\\c\\nd"} 1.5' in m.text()
    parse_prometheus(m.text())


def test_csv_has_raw_seconds(ctl_db):
    full = R.full_report(Store.from_url(ctl_db[0]))
    text = RR.csv_tables([RR.jct_table(full.jct)])
    rows = list(csv.reader(io.StringIO(text)))
    assert rows[0] == ["size", "n_jobs", "mean_s", "p50_s", "p95_s", "p99_s", "max_s", "mean_queue_s"]
    last = rows[-1]
    assert last[0] == "all" and float(last[5]) == pytest.approx(full.jct.overall.p99_s)


# ---------------------------------------------------------------- CLI


def invoke(*args, env=None):
    return CliRunner().invoke(pipeswift, list(args), env=env)


def test_cli_json_numbers_equal_the_functions(db):
    result = invoke("report", "jct", "--db", db, "--format", "json")
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    rep = R.jct(Store.from_url(db))
    assert data["overall"]["p99_s"] == rep.overall.p99_s and data["overall"]["n_jobs"] == rep.overall.n_jobs
    result = invoke(
        "report", "queue-ratio", "--db", db, "--by", "user", "--format", "json", "--threshold", "0.9"
    )
    data = json.loads(result.output)
    assert data["overall"]["queue_ratio"] == R.queue_ratio(Store.from_url(db)).overall.queue_ratio
    assert data["threshold"] == 0.9 and {r["group"] for r in data["rows"]} == {
        r.group for r in R.queue_ratio(Store.from_url(db), by="user").rows
    }


def test_cli_all_writes_every_output(ctl_db, tmp_path):
    png, page, prom = tmp_path / "r.png", tmp_path / "r.html", tmp_path / "r.prom"
    result = invoke(
        "report",
        "all",
        "--db",
        ctl_db[0],
        "--plot",
        str(png),
        "--html",
        str(page),
        "--prometheus",
        str(prom),
        "--since",
        "2023-11-14",
        "--until",
        "-0h",
    )
    assert result.exit_code == 0, result.output
    for title in ("Queue-time ratio", "Job completion time", "Waits", "Estimator bias", "Decision log"):
        assert title in result.output
    assert re.search(r"(queue|execution)-bound: small jobs spend \d+% of their JCT queued", result.output)
    assert png.read_bytes()[:4] == b"\x89PNG" and len(png.read_bytes()) > 30_000
    assert '<img src="data:image/png;base64,' in page.read_text() and "<th>p99_s</th>" in page.read_text()
    assert ("pipeswift_queue_ratio", ()) in parse_prometheus(prom.read_text())


@pytest.mark.parametrize("kind", ["queue-ratio", "jct", "waits", "bias", "decisions"])
@pytest.mark.parametrize("fmt", ["table", "csv", "json"])
def test_cli_every_kind_and_format(sim_db, kind, fmt):
    result = invoke("report", kind, "--db", sim_db[0], "--format", fmt)
    assert result.exit_code == 0, result.output
    assert result.output.strip()
    if fmt == "json":
        json.loads(result.output)


def test_cli_db_from_environment(ctl_db):
    result = invoke("report", "waits", "--format", "csv", env={"PIPESWIFT_DB": ctl_db[0]})
    assert result.exit_code == 0 and result.output.startswith("size,n_jobs,n_pending")


def test_cli_empty_database_says_so(empty_db, tmp_path):
    prom = tmp_path / "p.prom"
    result = invoke(
        "report", "all", "--db", empty_db, "--prometheus", str(prom), "--plot", str(tmp_path / "x.png")
    )
    assert result.exit_code == 0
    assert result.output.strip() == "no jobs recorded in %s" % empty_db
    assert not (tmp_path / "x.png").exists()
    parse_prometheus(prom.read_text())
    result = invoke("report", "jct", "--db", empty_db, "--since", "0", "--until", "3600")
    assert result.exit_code == 0
    assert result.output.strip() == (
        "no jobs recorded between 1970-01-01 00:00:00 and 1970-01-01 01:00:00 UTC in %s" % empty_db
    )
    for kind in ("jct", "waits", "bias", "all"):  # JSON and CSV: the line on stderr, the empty tables on stdout
        as_json = invoke("report", kind, "--db", empty_db, "--format", "json")
        assert as_json.exit_code == 0 and as_json.stderr.startswith("no jobs recorded"), as_json.output
        json.loads(as_json.stdout)
        as_csv = invoke("report", kind, "--db", empty_db, "--format", "csv")
        assert as_csv.exit_code == 0 and as_csv.stderr.startswith("no jobs recorded"), as_csv.output


@pytest.mark.parametrize(
    "args, message",
    [
        (("--db", "/nonexistent/x.sqlite"), "no history database at /nonexistent/x.sqlite"),
        (("--db", "/"), "--db /: is a folder; give the history's file"),
        (("--since", "yesterday"), "--since/--until"),
        (("--since", "10", "--until", "5"), "--until must be later than --since"),
    ],
)
def test_cli_errors_are_one_line_exit_2(ctl_db, args, message):
    full = list(args) if args[0] == "--db" else ["--db", ctl_db[0], *args]
    result = invoke("report", "jct", *full)
    assert result.exit_code == 2
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and message in lines[0]


def test_cli_rejects_a_file_that_is_not_a_history(tmp_path):
    path = tmp_path / "other.sqlite"
    sqlite3.connect(path).execute("CREATE TABLE t (x)").connection.close()
    result = invoke("report", "bias", "--db", str(path))
    assert result.exit_code == 2 and "not a pipeswift history database" in result.output


def test_one_wait_bound_the_policys_in_reports_metrics_cli_and_sql() -> None:
    """Issue 28 item 9: the reports, Prometheus metrics, ``report --wait-bound-h`` and
    sql/waits.sql (one file for both databases) all count waits over the pipeswift policy's own
    default bound."""
    from pipeswift_slurm.policy import knob_defaults
    from pipeswift_slurm.reports.base import DEFAULT_WAIT_BOUND_S
    from pipeswift_slurm.reports.metrics import prometheus_text

    policy_s = knob_defaults("pipeswift")["wait_bound_s"]
    assert DEFAULT_WAIT_BOUND_S == policy_s == 48 * 3600.0
    assert R.waits(Store.in_memory()).wait_bound_s == policy_s
    assert "pipeswift_wait_bound_seconds 172800" in prometheus_text(R.full_report(Store.in_memory()))
    sql = (Path(__file__).resolve().parents[2] / "sql" / "waits.sql").read_text()
    assert [float(x) for x in re.findall(r"wait_s > (\d+)", sql)] == [policy_s, policy_s]
    report_cmd = pipeswift.commands["report"]
    for command in getattr(report_cmd, "commands", {"": report_cmd}).values():
        for param in command.params:
            if param.name == "wait_bound_h":
                assert param.default * 3600.0 == policy_s, command.name


def test_an_output_that_is_no_plain_file_is_never_replaced(ctl_db, tmp_path):
    """``--prometheus`` replaced a FIFO, a device (as root: /dev/full) or a link with a file
    of its own. A device or a FIFO is refused in one line; a link's target is written."""
    import os

    path, _ = ctl_db
    fifo = tmp_path / "metrics.fifo"
    os.mkfifo(fifo)
    devices = [Path("/dev/full")] if Path("/dev/full").is_char_device() else []  # (a chroot may lack it)
    for target in [fifo] + devices:
        got = invoke("report", "all", "--db", path, "-q", "--prometheus", str(target))
        assert got.exit_code == 2 and "is not a plain file (a device or a FIFO)" in got.output
        assert target.is_fifo() or target.is_char_device()
    real = tmp_path / "real.prom"
    real.write_text("old\n")
    (tmp_path / "link.prom").symlink_to(real)
    assert invoke("report", "all", "--db", path, "-q", "--prometheus", str(tmp_path / "link.prom")).exit_code == 0
    assert (tmp_path / "link.prom").is_symlink() and "pipeswift_queue_ratio" in real.read_text()
    with pytest.raises(OSError, match="is not a plain file"):
        write_atomic(str(fifo), "x")


def test_text_from_users_or_an_edited_history_cannot_drive_the_terminal() -> None:
    """Found by fuzzing: an ESC sequence in a stored reason (it set the terminal's title) and
    a newline in a user name reached the admin's terminal as they were; every table cell,
    CSV cell and explain line now shows them as escapes."""
    from pipeswift_slurm.core.fmt import table, visible
    from pipeswift_slurm.reports.render import Table, csv_tables

    assert visible("evil\x1b]0;pwn\x07\nuser") == "evil\\x1b]0;pwn\\x07\\nuser"
    assert visible("plain é, tabs\tno") == "plain é, tabs\\tno" and visible("ok") == "ok"
    shown = table(["user", "n"], [["a\nb\x1b[31m", 1]])
    assert "\x1b" not in shown and shown.splitlines()[2].startswith("a\\nb\\x1b[31m")
    csv = csv_tables([Table("t", "T", ["user"], [["a\x1bb"]], [])])
    assert "\x1b" not in csv and "a\\x1bb" in csv


def test_user_text_is_never_a_formula_nor_raw_in_notes_or_html() -> None:
    """Found by fuzzing the admins' outputs: a user name '=HYPERLINK(...)' was a live formula
    in the CSV an admin opens in a spreadsheet; a class name with ESC reached the terminal
    through a table's note, and ESC or U+202E the HTML report."""
    from pipeswift_slurm.reports.render import Table, csv_tables, html_table, text_tables

    rows = [["=HYPERLINK(\"http://x\",\"y\")", -1.5], ["+1", 2], ["@SUM(A1)", 3], ["-2+3", 4], ["ok", 5]]
    read = list(csv.reader(csv_tables([Table("t", "T", ["user", "n"], rows, [])]).splitlines()))
    assert [r[0] for r in read[1:]] == ["'=HYPERLINK(\"http://x\",\"y\")", "'+1", "'@SUM(A1)", "'-2+3", "ok"]
    assert read[1][1] == "-1.5"  # a number stays a number
    hostile = Table("t", "T", ["user"], [["a\u202eb\x1b[2J"]], ["class x\x1b[2J\ry"])
    for out in (text_tables([hostile]), html_table(hostile)):
        assert "\x1b" not in out and "\u202e" not in out and "\r" not in out


def test_a_url_sqlalchemy_cannot_read_is_shown_without_its_password() -> None:
    from pipeswift_slurm.store.history import shown_url

    assert shown_url("postgresql://u:secret@db:notaport/p") == "postgresql://u:***@db:notaport/p"


def test_json_outputs_are_strict_json_whatever_the_history_holds() -> None:
    """Found by fuzzing: an infinite value in an edited history, or a sum that overflowed,
    was printed as Infinity / NaN, which JSON readers refuse."""
    from pipeswift_slurm.core.fmt import json_text

    text = json_text({"a": math.inf, "b": [math.nan, 1.5, (-math.inf,)], "c": {"d": 2}})
    assert json.loads(text, parse_constant=lambda c: pytest.fail("non-strict %s" % c)) == \
        {"a": None, "b": [None, 1.5, [None]], "c": {"d": 2}}
