"""Store: one transaction per tick, history derived from job times, profiles, decisions
and idempotency, calibration, and SQLite files shared by several processes."""

from __future__ import annotations

import dataclasses
import sqlite3
import threading
import time

import pytest
from sqlalchemy import func, select, text
from sqlalchemy.exc import IntegrityError

from pipeswift_slurm.core import token
from pipeswift_slurm.reports import queries as R
from pipeswift_slurm.core.model import (ClusterView, Decision, ExecConfig, Job, JobProfile,
                                   ModelShape, Node, TrainingPlan)
from pipeswift_slurm.store.schema import Base
from pipeswift_slurm.store.history import (CONFIG_FIELDS, CalibrationEntry, Store, StoreBusy,
                                   same_action)

NODES = (Node("n1", 8, 0), Node("n2", 8, 0))


def view(now, *jobs, nodes=NODES):
    return ClusterView(now=now, nodes=nodes, jobs=tuple(jobs))


def pending(job_id, submit=100.0, gpus=8, **kw):
    return Job(job_id, "PENDING", submit, gpus=gpus, **kw)


def running(job_id, start, submit=100.0, gpus=8, **kw):
    return Job(job_id, "RUNNING", submit, gpus=gpus, start_time=start, **kw)


def cfg(pp=4, dp=2, M=16):
    return ExecConfig(tp=1, pp=pp, dp=dp, micro_batch_size=1, num_micro_batches=M,
                      num_nodes=1, gpus_per_node=pp * dp)


def profile(job_class="gpt-1b"):
    shape = ModelShape(num_layers=24, hidden_size=1024, num_attention_heads=16, seq_length=2048,
                       ffn_hidden_size=4096, kv_channels=64, num_query_groups=16)
    return JobProfile(shape=shape, plan=TrainingPlan(global_batch_size=256, train_iters=1000),
                      requested=cfg(), min_gpus=4, max_gpus=16, job_class=job_class)


def row_counts(store):
    with store.engine.connect() as conn:
        return {t.name: conn.execute(select(func.count()).select_from(t)).scalar()
                for t in Base.metadata.sorted_tables}


def rows(store, sql, **params):
    with store.engine.connect() as conn:
        return [tuple(r) for r in conn.execute(text(sql), params)]


@pytest.fixture
def store(backend, request, tmp_path, new_database):
    """A new, empty history: in-memory SQLite, or a fresh schema on the PostgreSQL test server."""
    if backend == "sqlite":
        yield Store.in_memory()
        return
    with new_database(backend, tmp_path, request.node.name) as url:
        store = Store.from_url(url)
        yield store
        store.engine.dispose()


# ------------------------------------------------------------------ types on every backend

def test_times_and_flags_come_back_exactly(store):
    """Epoch seconds with a fraction survive to the last bit (PostgreSQL's REAL is a 4-byte
    float: it would move them by minutes), and the boolean default holds on both backends."""
    submit, start = 1_700_010_492.1815805, 1_700_010_777.25
    with store.tick(start + 60.0, "fifo") as tx:
        tx.save_snapshot(view(start + 60.0, running(1, start, submit=submit)))
    assert rows(store, "SELECT submit_time, start_time, queue_s FROM jobs") == [
        (submit, start, start - submit)]
    assert rows(store, "SELECT at FROM state_transitions") == [(start,)]
    with store.engine.begin() as conn:
        conn.execute(text("INSERT INTO jobs (job_id, state) VALUES (2, 'PENDING')"))
    assert [bool(r[0]) for r in rows(store, "SELECT opted_in FROM jobs WHERE job_id = 2")] == [False]


# ------------------------------------------------------------------ transaction per tick

def test_exception_in_tick_leaves_every_table_as_it_was(store):
    with store.tick(50.0, "fifo") as tx:
        tx.save_snapshot(view(50.0, pending(1)))
    before = row_counts(store)
    with pytest.raises(RuntimeError, match="boom"):
        with store.tick(60.0, "pipeswift") as tx:
            tx.save_snapshot(view(60.0, running(1, 55.0), pending(2)))
            tx.upsert_profile(2, "pswift1;args=W10", profile(), None)
            tx.set_predicted_run(1, 3600.0)
            tx.record_decisions([Decision(2, cfg(), site_factor=3)], {2: True})
            tx.save_calibration([CalibrationEntry("gpt-1b", 3, 0.1, 60.0)])
            tx.finish()
            raise RuntimeError("boom")
    assert row_counts(store) == before
    assert store.known_jobs() == {1: "PENDING"}
    assert store.tick_count() == 1


def test_failed_tick_can_be_recorded_after_the_rollback(store):
    with pytest.raises(ValueError):
        with store.tick(60.0, "pipeswift"):
            raise ValueError("backend down")
    tick_id = store.record_failed_tick(60.0, "pipeswift", False, "backend down")
    assert rows(store, "SELECT tick_id, status, error FROM ticks") == [
        (tick_id, "failed", "backend down")]


def test_tick_row_counts_and_cluster_snapshot(store):
    nodes = (Node("n1", 8, 8), Node("n2", 8, 2), Node("n3", 8, 0, state="DOWN"))
    with store.tick(1000.0, "pipeswift", dry_run=True) as tx:
        tx.save_snapshot(view(1000.0, running(1, 900.0), pending(2, gpus=4), pending(3),
                              nodes=nodes))
        tx.record_decisions([Decision(2, cfg()), Decision(3, site_factor=5),
                             Decision(1, reason="leave it")],
                            applied={2: True}, errors={3: "scontrol: invalid"})
    (tick,) = rows(store, "SELECT started_at, policy, dry_run, n_pending, n_running, "
                          "n_decisions, n_applied, n_errors, status, duration_s >= 0 FROM ticks")
    assert tick == (1000.0, "pipeswift", 1, 2, 1, 3, 1, 1, "ok", 1)
    assert rows(store, "SELECT at, n_nodes, total_gpus, free_gpus, busy_gpus, pending_gpus, "
                       "n_pending, n_running FROM tick_snapshots") == [
        (1000.0, 3, 16, 6, 10, 12, 2, 1)]


def test_finish_overrides_and_status(store):
    with store.tick(5.0, "fifo") as tx:
        tx.finish(status="failed", error="apply partly failed", n_errors=2, duration_s=1.5)
    assert rows(store, "SELECT finished_at, duration_s, status, error, n_errors FROM ticks") == [
        (6.5, 1.5, "failed", "apply partly failed", 2)]
    with pytest.raises(TypeError):
        with store.tick(6.0, "fifo") as tx:
            tx.finish(n_bogus=1)


# ------------------------------------------------------------------ jobs and transitions

def test_lifecycle_transitions_and_durations(store):
    with store.tick(200.0, "fifo") as tx:
        tx.save_snapshot(view(200.0, pending(7, submit=100.0, eligible_time=150.0,
                                             user="ana", name="gpt", partition="gpu")))
    with store.tick(260.0, "fifo") as tx:
        tx.save_snapshot(view(260.0, pending(7, submit=100.0, eligible_time=150.0)))
    with store.tick(400.0, "fifo") as tx:
        tx.save_snapshot(view(400.0, running(7, 330.0, submit=100.0, eligible_time=150.0)))
    with store.tick(8000.0, "fifo") as tx:
        done = dataclasses.replace(running(7, 330.0, eligible_time=150.0), state="COMPLETED",
                                   end_time=7530.0)
        summary = tx.save_snapshot(view(8000.0, done))
    assert summary.n_transitions == 1 and summary.vanished == ()
    assert rows(store, "SELECT tick_id, at, from_state, to_state FROM state_transitions "
                       "ORDER BY id") == [
        (1, 100.0, None, "PENDING"), (3, 330.0, "PENDING", "RUNNING"),
        (4, 7530.0, "RUNNING", "COMPLETED")]
    (job,) = rows(store, "SELECT state, queue_s, run_s, first_seen_tick, last_seen_tick, "
                         "requested_gpus, gpus, size_class FROM jobs")
    # queue from eligible (150) to start (330); run 7200 s on 8 GPUs = 16 GPU-h
    assert job == ("COMPLETED", 180.0, 7200.0, 1, 4, 8, 8, "medium")


def test_first_sight_running_and_queue_from_submit(store):
    with store.tick(500.0, "fifo") as tx:
        tx.save_snapshot(view(500.0, running(3, 460.0, submit=400.0)))
    assert rows(store, "SELECT at, from_state, to_state FROM state_transitions") == [
        (460.0, None, "RUNNING")]
    assert rows(store, "SELECT queue_s, run_s FROM jobs") == [(60.0, None)]


def test_unchanged_job_only_advances_last_seen(store):
    for now in (10.0, 20.0, 30.0):
        with store.tick(now, "fifo") as tx:
            tx.save_snapshot(view(now, pending(1)))
    assert rows(store, "SELECT count(*) FROM state_transitions") == [(1,)]
    assert rows(store, "SELECT first_seen_tick, last_seen_tick FROM jobs") == [(1, 3)]


def test_resize_keeps_requested_gpus(store):
    with store.tick(10.0, "pipeswift") as tx:
        tx.save_snapshot(view(10.0, pending(1, gpus=16)))
    with store.tick(20.0, "pipeswift") as tx:
        tx.save_snapshot(view(20.0, pending(1, gpus=8)))
    assert rows(store, "SELECT requested_gpus, gpus FROM jobs") == [(16, 8)]


def test_requeue_counts_a_restart(store):
    with store.tick(10.0, "tiresias") as tx:
        tx.save_snapshot(view(10.0, running(1, 5.0)))
    with store.tick(20.0, "tiresias") as tx:
        tx.save_snapshot(view(20.0, pending(1)))
    assert rows(store, "SELECT restarts, state FROM jobs") == [(1, "PENDING")]
    assert rows(store, "SELECT at, from_state, to_state FROM state_transitions WHERE tick_id = 2") == [
        (20.0, "RUNNING", "PENDING")]


def test_requeues_add_up_the_earlier_runs(store):
    """Live Slurm forgets a job's run time at a requeue; the history keeps it: from its
    start to the first tick that saw it pending again, at the GPUs it ran on."""
    with store.tick(10.0, "pipeswift") as tx:
        tx.save_snapshot(view(10.0, running(1, 5.0, gpus=8)))
    # what the next tick's policy is told, before anything is written
    assert store.history_fields(65.0, [pending(1, 160.0, gpus=16, restarts=1)]) == {
        1: {"submit_time": 100.0, "eligible_time": None, "ran_s": 60.0, "attained_gpu_s": 480.0}}
    with store.tick(65.0, "pipeswift") as tx:
        tx.save_snapshot(view(65.0, pending(1, gpus=16, restarts=1)))
    with store.tick(100.0, "pipeswift") as tx:
        tx.save_snapshot(view(100.0, running(1, 90.0, gpus=16, restarts=1)))
    # requeued again and restarted between two ticks: it ran until its new start, at most
    with store.tick(300.0, "pipeswift") as tx:
        tx.save_snapshot(view(300.0, running(1, 250.0, gpus=4, restarts=2)))
    assert rows(store, "SELECT restarts, ran_s, attained_gpu_s FROM jobs") == [(2, 220.0, 480.0 + 160 * 16)]
    assert store.history_fields(400.0, [running(1, 250.0, gpus=4, restarts=2)])[1] == {
        "submit_time": 100.0, "eligible_time": None, "ran_s": 220.0, "attained_gpu_s": 3040.0}
    assert store.history_fields(400.0, [pending(7)]) == {7: {}}  # never seen: as Slurm says


def test_a_wait_counts_through_the_eligible_times_slurm_restarts(store):
    """Slurm shows no eligible time while a job is held and restarts it at the release, and
    at the StartTime=now that ends psbatch's first look. The history and the policy count
    the controller's (or an admin's) hold and the first look as queue time; a user's own
    hold or a dependency is not, nor a begin time the job waits on. A job first seen held by
    an admin counts from its submission (4), one held by its user from the release (5)."""
    look = token.encode_profile(token.ProfileRequest(("--num-layers", "2"), first_look=True))
    ticks = [  # (now, [(job, eligible time, reason)]): 1 held by the controller, 2 by its user, 3 first look
        (50.0, [(1, 0.0, "Priority"), (2, 0.0, "Priority"), (3, 60.0, "BeginTime")]),
        (100.0, [(1, None, "JobHeldAdmin"), (2, None, "JobHeldUser"), (3, 60.0, "BeginTime"),
                 (4, None, "JobHeldAdmin"), (5, None, "JobHeldUser")]),
        (200.0, [(1, 150.0, "Resources"), (2, 150.0, "Resources"), (3, 55.0, "Resources"),
                 (4, 150.0, "Resources"), (5, 150.0, "Resources")]),
    ]
    for now, jobs in ticks:
        with store.tick(now, "pipeswift") as tx:
            tx.save_snapshot(view(now, *[pending(i, submit=0.0, eligible_time=e, state_reason=r,
                                                 comment=look if i == 3 else "") for i, e, r in jobs]))
    assert rows(store, "SELECT job_id, eligible_time FROM jobs ORDER BY job_id") == [
        (1, 0.0), (2, 150.0), (3, 0.0), (4, 0.0), (5, 150.0)]
    # what the next tick's policy is told where Slurm restarted the time: the stored one
    seen = [pending(i, submit=0.0, eligible_time=150.0, state_reason="Resources") for i in (1, 2)]
    assert store.history_fields(250.0, seen) == {1: {"eligible_time": 0.0}, 2: {}}
    # a begin time set later (by its user) is a wait the job asked for
    later = pending(1, submit=0.0, eligible_time=900.0, state_reason="BeginTime")
    assert store.history_fields(250.0, [later]) == {1: {}}
    with store.tick(300.0, "pipeswift") as tx:
        tx.save_snapshot(view(300.0, *[running(i, 280.0, submit=0.0, eligible_time=e) for i, e in
                                       ((1, 150.0), (2, 150.0), (3, 55.0), (4, 150.0), (5, 150.0))]))
    assert rows(store, "SELECT job_id, queue_s FROM jobs ORDER BY job_id") == [
        (1, 280.0), (2, 130.0), (3, 280.0), (4, 280.0), (5, 130.0)]


def test_a_job_waiting_on_a_begin_time_ahead_has_waited_nothing_so_far(store):
    """The waits report counted (now - its begin time): a negative wait that pulled the mean down."""
    with store.tick(100.0, "pipeswift") as tx:
        tx.save_snapshot(view(100.0, pending(1, submit=50.0, eligible_time=400.0, state_reason="BeginTime"),
                              pending(2, submit=40.0, state_reason="Priority")))
    assert [(r.n_pending, r.mean_s, r.max_s) for r in R.waits(store).rows] == [(2, 30.0, 60.0)]


def test_a_requeued_job_keeps_its_first_submission_and_its_whole_wait(store):
    """Live Slurm moves a requeued job's submit (and eligible) time to the requeue; the
    history keeps the first, so its JCT and waits cover every wait, and never its runs."""
    with store.tick(50.0, "pipeswift:preempt") as tx:
        tx.save_snapshot(view(50.0, pending(1, submit=0.0, eligible_time=0.0)))
    with store.tick(100.0, "pipeswift:preempt") as tx:
        tx.save_snapshot(view(100.0, running(1, 100.0, submit=0.0, eligible_time=0.0)))
    # requeued: Slurm says submitted (and eligible) at 990; it ran 100 -> 1000 as seen
    with store.tick(1000.0, "pipeswift:preempt") as tx:
        tx.save_snapshot(view(1000.0, pending(1, submit=990.0, eligible_time=990.0, restarts=1)))
    assert rows(store, "SELECT submit_time, eligible_time, ran_s FROM jobs") == [(0.0, 0.0, 900.0)]
    # what the next tick's policy is told: the first times back, and the run to leave out
    requeued = pending(1, submit=990.0, eligible_time=990.0, restarts=1)
    told = store.history_fields(1200.0, [requeued])[1]
    assert told == {"submit_time": 0.0, "eligible_time": 0.0, "ran_s": 900.0, "attained_gpu_s": 7200.0}
    assert dataclasses.replace(requeued, **told).queued_s(1200.0) == 300.0  # 100 s before its run, 200 s since
    with store.tick(1500.0, "pipeswift:preempt") as tx:
        tx.save_snapshot(view(1500.0, running(1, 1400.0, submit=990.0, eligible_time=990.0, restarts=1)))
    with store.tick(3000.0, "pipeswift:preempt") as tx:
        tx.save_snapshot(view(3000.0, Job(1, "COMPLETED", 990.0, gpus=8, eligible_time=990.0, start_time=1400.0,
                                          end_time=2900.0, restarts=1)))
    # waited 100 s, then 400 s after the requeue; ran 900 s before it and 1,500 s after
    assert rows(store, "SELECT submit_time, queue_s, run_s, ran_s, end_time - submit_time FROM jobs") == [
        (0.0, 500.0, 1500.0, 900.0, 2900.0)]
    # a job never requeued keeps Slurm's times as they are
    with store.tick(3100.0, "pipeswift:preempt") as tx:
        tx.save_snapshot(view(3100.0, pending(2, submit=3050.0)))
    with store.tick(3200.0, "pipeswift:preempt") as tx:
        tx.save_snapshot(view(3200.0, running(2, 3150.0, submit=3040.0)))
    assert rows(store, "SELECT submit_time, queue_s FROM jobs WHERE job_id = 2") == [(3040.0, 110.0)]


def test_an_older_database_gets_the_new_columns(tmp_path):
    """A history file from a release without ``jobs.ran_s``/``attained_gpu_s``/
    ``wait_origin_time`` opens, gains them (zero, or NULL until its next tick, for the old
    rows) and records as before: a pending job's wait is in the waits report again."""
    from pipeswift_slurm.store import schema_sql

    old_ddl = schema_sql.render(without={"jobs.ran_s", "jobs.attained_gpu_s", "jobs.wait_origin_time"})
    path = tmp_path / "old.sqlite"
    with sqlite3.connect(path) as conn:
        conn.executescript(old_ddl)
        conn.execute("INSERT INTO jobs (job_id, state) VALUES (1, 'RUNNING')")
        conn.execute("INSERT INTO jobs (job_id, state, submit_time) VALUES (3, 'PENDING', 4.0)")
    assert "ran_s" not in {r[1] for r in sqlite3.connect(path).execute("PRAGMA table_info(jobs)")}
    store = Store.from_url(str(path))
    assert rows(store, "SELECT job_id, ran_s, attained_gpu_s, wait_origin_time FROM jobs ORDER BY job_id") == [
        (1, 0.0, 0.0, None), (3, 0.0, 0.0, None)]
    with store.tick(10.0, "pipeswift") as tx:
        tx.save_snapshot(view(10.0, running(2, 5.0), pending(3, submit=4.0)))
    assert rows(store, "SELECT job_id, wait_origin_time FROM jobs ORDER BY job_id") == [(1, None), (2, 100.0),
                                                                                       (3, 4.0)]
    assert [(r.n_pending, r.max_s) for r in R.waits(store).rows] == [(1, 6.0)]
    Store.from_url(str(path))  # and opens again with nothing to add


def test_an_older_history_gains_measurements_own_layout(tmp_path):
    """Measurements recorded before ``own_layout`` existed open with NULL there (no own
    term is fitted from them) and new ones record it."""
    from pipeswift_slurm.store import schema_sql
    from pipeswift_slurm.store.queries import MeasurementEntry

    old_ddl = schema_sql.render(without={"measurements.own_layout"})
    path = tmp_path / "old.sqlite"
    with sqlite3.connect(path) as conn:
        conn.executescript(old_ddl)
        conn.execute("INSERT INTO jobs (job_id, state) VALUES (1, 'COMPLETED')")
        conn.execute("INSERT INTO measurements (job_id, status, reported_at) VALUES (1, 'ok', 5.0)")
    assert "own_layout" not in {r[1] for r in sqlite3.connect(path).execute("PRAGMA table_info(measurements)")}
    store = Store.from_url(str(path))
    assert [m.own_layout for m in store.measurements()] == [None]
    store.save_measurements([MeasurementEntry(1, "u", "gpt-1b", "c", 1, 4, 1, 1, 1.0, 1.0, 10, "ok", 6.0,
                                              own_layout=0)])
    assert [(m.own_layout, m.reported_at) for m in store.measurements()] == [(0, 6.0)]


def test_vanished_jobs_are_reported_then_closed(store):
    with store.tick(100.0, "fifo") as tx:
        tx.save_snapshot(view(100.0, running(1, 40.0, gpus=2), pending(2), pending(3)))
    with store.tick(160.0, "fifo") as tx:
        summary = tx.save_snapshot(view(160.0, pending(3)))
        assert summary.vanished == (1, 2)
        assert tx.mark_vanished(summary.vanished) == 2
        assert tx.mark_vanished(summary.vanished) == 0  # already closed
    assert rows(store, "SELECT job_id, state, end_time, run_s, size_class FROM jobs ORDER BY job_id") == [
        (1, "COMPLETED?", 160.0, 120.0, "small"), (2, "CANCELLED?", 160.0, None, None),
        (3, "PENDING", None, None, None)]
    assert rows(store, "SELECT job_id, from_state, to_state, reason FROM state_transitions "
                       "WHERE tick_id = 2 ORDER BY job_id") == [
        (1, "RUNNING", "COMPLETED?", "vanished"), (2, "PENDING", "CANCELLED?", "vanished")]
    with store.tick(220.0, "fifo") as tx:  # closed jobs are no longer reported
        assert tx.save_snapshot(view(220.0, pending(3))).vanished == ()
        # sacct later tells the truth: it overrides the guess
        real = dataclasses.replace(running(1, 40.0, gpus=2), state="FAILED", end_time=130.0)
        tx.save_snapshot(view(220.0, real, pending(3)))
    assert rows(store, "SELECT state, end_time, run_s FROM jobs WHERE job_id = 1") == [
        ("FAILED", 130.0, 90.0)]


def test_reads_inside_a_tick_see_its_writes(store):
    with store.tick(10.0, "fifo") as tx:
        tx.save_snapshot(view(10.0, pending(1), running(2, 5.0)))
        assert tx.known_jobs() == {1: "PENDING", 2: "RUNNING"}
    assert store.known_jobs(active_only=True) == {1: "PENDING", 2: "RUNNING"}


def test_predicted_run_sets_size_class_until_actual_known(store):
    with store.tick(10.0, "sjf") as tx:
        tx.save_snapshot(view(10.0, pending(1, gpus=8)))
        tx.set_predicted_run(1, 5 * 3600.0)
    assert rows(store, "SELECT predicted_run_s, size_class FROM jobs") == [(18000.0, "large")]
    with store.tick(20.0, "sjf") as tx:  # not in this tick's snapshot: loaded on demand
        tx.set_predicted_runs({1: 600.0, 99: 1.0})  # unknown job ignored
    assert rows(store, "SELECT predicted_run_s, size_class FROM jobs") == [(600.0, "small")]


# ------------------------------------------------------------------ profiles

def test_profile_upsert(store):
    with store.tick(10.0, "pipeswift") as tx:
        tx.save_snapshot(view(10.0, pending(1), pending(2)))
        tx.upsert_profile(1, "pswift1;args=AAA", profile("gpt-1b"), None)
        tx.upsert_profile(2, "pswift1;args=%%%", None, "args is not base64 JSON")
    with store.tick(20.0, "pipeswift") as tx:
        tx.upsert_profile(1, "pswift1;args=BBB", profile("gpt-2b"), None)
    assert store.profile_texts([1, 2, 3]) == {1: "pswift1;args=BBB", 2: "pswift1;args=%%%"}
    assert rows(store, "SELECT job_id, job_class, num_layers, hidden_size, seq_length, "
                       "global_batch_size, train_iters, min_gpus, max_gpus, requested_config, "
                       "parse_error, created_at, updated_at FROM profiles ORDER BY job_id") == [
        (1, "gpt-2b", 24, 1024, 2048, 256, 1000, 4, 16, cfg().short(), None, 10.0, 20.0),
        (2, None, None, None, None, None, None, None, None, None, "args is not base64 JSON",
         10.0, 10.0)]
    assert rows(store, "SELECT job_class FROM jobs ORDER BY job_id") == [("gpt-2b",), (None,)]


def test_profile_needs_the_job_first(store):
    with pytest.raises(IntegrityError):
        with store.tick(10.0, "pipeswift") as tx:
            tx.upsert_profile(42, "pswift1;", None, "no job")
    assert store.tick_count() == 0


# ------------------------------------------------------------------ decisions

def test_config_columns_cover_exec_config():
    assert set(CONFIG_FIELDS) == {f.name for f in dataclasses.fields(ExecConfig)}


def test_last_applied_round_trips_and_ignores_unapplied(store):
    first = Decision(1, cfg(pp=2, dp=4), site_factor=7, time_limit_s=3600, reason="start now",
                     predicted_start_s=100.0, predicted_end_s=4000.0)
    with store.tick(100.0, "pipeswift") as tx:
        tx.save_snapshot(view(100.0, pending(1), pending(2)))
        assert tx.last_applied(1) is None
        tx.record_decisions([first, Decision(2, site_factor=1)], applied={1: True})
    assert store.last_applied(1) == first
    assert store.last_applied(2) is None  # not attempted
    later = dataclasses.replace(first, reason="still best", predicted_end_s=4100.0)
    assert same_action(store.last_applied(1), later)
    assert not same_action(store.last_applied(1), dataclasses.replace(first, site_factor=8))
    with store.tick(200.0, "pipeswift", dry_run=True) as tx:
        tx.record_decisions([Decision(1, cfg(pp=8, dp=1))])  # dry run: not applied
    with store.tick(300.0, "pipeswift") as tx:
        tx.record_decisions([Decision(1, cfg(pp=4, dp=2))], errors={1: "Invalid node count"})
    assert store.last_applied(1) == first
    assert store.last_applied_for([1, 2, 3]) == {1: first}
    history = store.decisions_for(1)
    assert [(h.tick_id, h.at, h.intended, h.applied, h.error) for h in history] == [
        (1, 100.0, True, True, None), (2, 200.0, True, None, None),
        (3, 300.0, True, False, "Invalid node count")]
    assert history[0].decision == first


def test_decision_row_columns(store):
    with store.tick(100.0, "pipeswift") as tx:
        tx.save_snapshot(view(100.0, pending(1), pending(2)))
        tx.record_decisions([Decision(1, cfg(), site_factor=2), Decision(2, reason="wait")])
    assert rows(store, "SELECT job_id, kind, config, gpus, tp, pp, dp, vp, micro_batch_size, "
                       "num_micro_batches, num_nodes, intended, applied FROM decisions") == [
        (1, "resize+site_factor", cfg().short(), 8, 1, 4, 2, 1, 1, 16, 1, 1, None),
        (2, "none", None, None, None, None, None, None, None, None, None, 0, None)]


def test_same_action_handles_none():
    assert same_action(None, None)
    assert not same_action(None, Decision(1))


# ------------------------------------------------------------------ calibration

def _finish(tx, job_id, start, end, predicted, job_class):
    tx.save_snapshot(view(end, dataclasses.replace(running(job_id, start), state="COMPLETED",
                                                   end_time=end)))
    tx.upsert_profile(job_id, "pswift1;", profile(job_class), None)
    tx.set_predicted_run(job_id, predicted)


def test_finished_jobs_for_calibration(store):
    with store.tick(1000.0, "sjf") as tx:
        _finish(tx, 1, 0.0, 1000.0, 800.0, "a")
    with store.tick(2000.0, "sjf") as tx:
        _finish(tx, 2, 500.0, 2000.0, 1500.0, "b")
        tx.save_snapshot(view(2000.0, running(3, 100.0), pending(4)))
        tx.set_predicted_runs({3: 50.0, 4: 60.0})
    with store.tick(3000.0, "sjf") as tx:
        tx.mark_vanished([3, 4])
    all_done = store.finished_jobs()
    assert [(f.job_id, f.job_class, f.predicted_run_s, f.run_s, f.end_time, f.state)
            for f in all_done] == [(1, "a", 800.0, 1000.0, 1000.0, "COMPLETED"),
                                   (2, "b", 1500.0, 1500.0, 2000.0, "COMPLETED"),
                                   (3, "", 50.0, 2900.0, 3000.0, "COMPLETED?")]
    assert [f.job_id for f in store.finished_jobs(job_class="a")] == [1]
    assert [f.job_id for f in store.finished_jobs(since=1500.0)] == [2, 3]
    assert [f.job_id for f in store.finished_jobs(include_vanished=False)] == [1, 2]


def test_calibration_save_and_load(store):
    store.save_calibration([CalibrationEntry("a", 10, 0.0, 5.0),
                            CalibrationEntry("b", 4, -0.5, 5.0)])
    with store.tick(10.0, "pipeswift") as tx:
        tx.save_calibration([CalibrationEntry("a", 12, 0.25, 10.0)])
    got = store.calibration()
    assert set(got) == {"a", "b"}
    assert got["a"] == (pytest.approx(1.2840254166877414), 12)
    assert got["b"] == (pytest.approx(0.6065306597126334), 4)
    assert rows(store, "SELECT log_ratio, updated_at FROM calibration WHERE job_class = 'a'") == [
        (0.25, 10.0)]


# ------------------------------------------------------------------ files and processes

def test_file_store_is_shared_by_two_instances(tmp_path):
    path = tmp_path / "pipeswift.sqlite"
    first = Store.from_url(str(path))
    with first.tick(10.0, "fifo") as tx:
        tx.save_snapshot(view(10.0, pending(1)))
    second = Store.from_url("sqlite:///%s" % path)  # as a later cron run would
    assert second.known_jobs() == {1: "PENDING"}
    with second.tick(20.0, "fifo") as tx:
        tx.save_snapshot(view(20.0, running(1, 15.0)))
    assert first.known_jobs() == {1: "RUNNING"}
    assert first.tick_count() == second.tick_count() == 2
    conn = sqlite3.connect(path)
    assert conn.execute("PRAGMA journal_mode").fetchone() == ("delete",)  # readable by read-only users
    with first.engine.connect() as c:
        assert c.exec_driver_sql("PRAGMA foreign_keys").scalar() == 1


def test_foreign_keys_are_enforced(store):
    with pytest.raises(IntegrityError):
        with store.tick(1.0, "fifo") as tx:
            tx.record_decisions([Decision(404, site_factor=1)])
    assert store.tick_count() == 0


def test_concurrent_writer_gets_a_clear_error(tmp_path):
    path = str(tmp_path / "busy.sqlite")
    holder = Store.from_url(path)
    other = Store.from_url(path, busy_timeout_s=0.2)
    with holder.tick(10.0, "fifo") as tx:
        tx.save_snapshot(view(10.0, pending(1)))
        began = time.monotonic()
        with pytest.raises(StoreBusy, match="locked"):
            with other.tick(11.0, "fifo"):
                pass
        assert time.monotonic() - began >= 0.15  # it waited busy_timeout first
        assert other.known_jobs() == {}  # readers are not blocked (WAL), see committed data
    assert other.known_jobs() == {1: "PENDING"}
    with other.tick(12.0, "fifo"):
        pass
    assert other.tick_count() == 2


def test_concurrent_writer_waits_for_the_lock(tmp_path):
    path = str(tmp_path / "wait.sqlite")
    Store.from_url(path)  # create tables before the race
    entered, errors = threading.Event(), []

    def hold_lock():
        try:
            with Store.from_url(path).tick(10.0, "fifo") as tx:
                tx.save_snapshot(view(10.0, pending(1)))
                entered.set()
                time.sleep(0.3)
        except Exception as exc:  # pragma: no cover - reported below
            errors.append(exc)
            entered.set()

    thread = threading.Thread(target=hold_lock)
    thread.start()
    assert entered.wait(10)
    waiter = Store.from_url(path, busy_timeout_s=10.0)
    with waiter.tick(20.0, "fifo") as tx:
        assert tx.known_jobs() == {1: "PENDING"}  # it ran after the holder committed
        tx.save_snapshot(view(20.0, running(1, 15.0)))
    thread.join()
    assert not errors
    assert waiter.known_jobs() == {1: "RUNNING"}
    assert [r[0] for r in rows(waiter, "SELECT started_at FROM ticks ORDER BY tick_id")] == [
        10.0, 20.0]


def test_in_memory_stores_are_private():
    a, b = Store.in_memory(), Store.in_memory()
    with a.tick(1.0, "fifo") as tx:
        tx.save_snapshot(view(1.0, pending(1)))
    assert a.known_jobs() == {1: "PENDING"} and b.known_jobs() == {}


def test_from_url_accepts_a_path_and_creates_its_folder(tmp_path):
    path = tmp_path / "var" / "lib" / "pipeswift" / "pipeswift.sqlite"
    store = Store.from_url(str(path))
    assert path.exists() and store.tick_count() == 0
    Store.from_url(str(path))  # reopening an existing file creates nothing, breaks nothing


def test_forecast_start_of_a_pending_job_is_not_a_fact(store):
    with store.tick(10.0, "slurm") as tx:  # squeue %S shows the expected start while pending
        tx.save_snapshot(view(10.0, pending(1, start_time=500.0, end_time=4100.0)))
    with store.tick(20.0, "slurm") as tx:
        assert tx.save_snapshot(view(20.0)).vanished == (1,)
        tx.mark_vanished([1])
    assert rows(store, "SELECT state, start_time, queue_s, run_s FROM jobs") == [
        ("CANCELLED?", None, None, None)]


# ---------------------------------------------------------------- failed ticks are recorded (issue 28 item 8)

class _DownBackend:
    """slurmctld down: the first snapshot works, later ones raise."""

    name = "down"

    def __init__(self) -> None:
        self.calls = 0

    def snapshot(self) -> ClusterView:
        from pipeswift_slurm.slurm.backends import BackendError

        self.calls += 1
        if self.calls > 1:
            raise BackendError("squeue: slurm_load_jobs error: Unable to contact slurm controller")
        return ClusterView(now=1_700_000_000.0, nodes=(), jobs=())

    def apply(self, decision: Decision, job: Job) -> None:
        raise AssertionError("nothing to apply")


def test_a_tick_that_cannot_see_the_cluster_is_recorded_as_failed() -> None:
    from pipeswift_slurm.core.costmodel import CostModel
    from pipeswift_slurm.core.estimator import Estimator
    from pipeswift_slurm.core.hardware import get_gpu_type
    from pipeswift_slurm.policy import get_policy
    from pipeswift_slurm.reports.metrics import prometheus_text
    from pipeswift_slurm.reports.queries import full_report, tick_stats
    from pipeswift_slurm.slurm.backends import BackendError
    from pipeswift_slurm.slurm.controller import Controller

    store = Store.in_memory()
    controller = Controller(_DownBackend(), get_policy("pipeswift"),
                            Estimator(CostModel(get_gpu_type("A100-80GB")), 8), store)
    controller.epoch_clock = lambda: 1_700_000_060.0
    controller.tick()
    ok = tick_stats(store)
    assert (ok.n_ticks, ok.n_failed, ok.last_status) == (1, 0, "ok")
    with pytest.raises(BackendError, match="Unable to contact"):
        controller.tick()
    failed = tick_stats(store)
    assert (failed.n_ticks, failed.n_failed, failed.last_status, failed.last_tick_s) == \
        (2, 1, "failed", 1_700_000_060.0)
    metrics = prometheus_text(full_report(store))
    assert "pipeswift_last_tick_ok 0" in metrics
    assert 'pipeswift_ticks{status="failed"} 1' in metrics


# ---------------------------------------------------------------- the controller's calibration step

def test_store_calibration_refits_from_finished_jobs_and_keeps_an_unchanged_estimator(store):
    from pipeswift_slurm.core.calibration import fit_bias, Observation
    from pipeswift_slurm.core.costmodel import CostModel
    from pipeswift_slurm.core.estimator import Estimator
    from pipeswift_slurm.core.hardware import get_gpu_type
    from pipeswift_slurm.slurm.calibrate import StoreCalibration

    with store.tick(1000.0, "pipeswift") as tx:
        _finish(tx, 1, 0.0, 1000.0, 800.0, "gpt-1b")
    with store.tick(2000.0, "pipeswift") as tx:
        _finish(tx, 2, 500.0, 2000.0, 1000.0, "gpt-1b")
    base = Estimator(CostModel(get_gpu_type("A100-80GB")), 8)
    step = StoreCalibration(store)
    fitted = step.refit(2000.0, base)
    expected = fit_bias([Observation("gpt-1b", 800.0, 1000.0, 1000.0), Observation("gpt-1b", 1000.0, 1500.0, 2000.0)],
                        now=2000.0)["gpt-1b"].ratio
    assert fitted is not base and fitted.bias("gpt-1b") == pytest.approx(expected) and expected > 1.0
    assert store.calibration()["gpt-1b"][1] == 2
    assert step.refit(2000.0, fitted) is fitted  # nothing new: the same estimator (policy caches kept)


class _Step:
    """A calibration step that records its calls and hands back a marked estimator."""

    def __init__(self) -> None:
        self.calls: list[float] = []

    def refit(self, now, estimator):
        self.calls.append(now)
        return ("refitted", estimator)

    def user_factor(self, user):
        return 1.0


@pytest.mark.parametrize("dry_run", [False, True])
def test_the_controller_tick_ends_with_the_calibration_step(dry_run):
    from pipeswift_slurm.policy import get_policy
    from pipeswift_slurm.slurm.controller import Controller, ControllerSettings

    class Up(_DownBackend):
        def snapshot(self):
            return ClusterView(now=1_700_000_000.0, nodes=(), jobs=())

    step = _Step()
    controller = Controller(Up(), get_policy("fifo"), "estimator", Store.in_memory(),
                            ControllerSettings(dry_run=dry_run), calibration=step)
    controller.tick()
    assert step.calls == ([] if dry_run else [1_700_000_000.0])
    assert controller.estimator == ("estimator" if dry_run else ("refitted", "estimator"))


def test_a_store_that_cannot_record_the_failed_tick_does_not_hide_the_backend_error() -> None:
    from pipeswift_slurm.policy import get_policy
    from pipeswift_slurm.slurm.backends import BackendError
    from pipeswift_slurm.slurm.controller import Controller

    class LockedStore:
        def record_failed_tick(self, now, policy, dry_run, error):
            raise StoreBusy("store is locked by another writer")

    backend = _DownBackend()
    backend.calls = 1  # already down
    with pytest.raises(BackendError, match="Unable to contact"):
        Controller(backend, get_policy("fifo"), None, LockedStore()).tick()
