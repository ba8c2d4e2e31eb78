"""The controller's side of the launcher's measurements (``slurm/measured.py``): a job's
report reaches the history, is bounded and checked against Slurm's elapsed time, and
changes the next prediction for that class and layout only."""

from __future__ import annotations

import dataclasses
import getpass
import json
import pwd
from pathlib import Path

import pytest
from test_calibration_records import DECIDED, USER, profile, record  # noqa: F401

from pipeswift_slurm.core.costmodel import CostModel
from pipeswift_slurm.core.estimator import Estimator
from pipeswift_slurm.core.hardware import get_gpu_type
from pipeswift_slurm.core.model import Job
from pipeswift_slurm.slurm.calibrate import StoreCalibration
from pipeswift_slurm.store.history import Store

ME = getpass.getuser()


@pytest.fixture
def estimator() -> Estimator:
    return Estimator(CostModel(get_gpu_type("A100-80GB")), 8)


def job(state: str = "RUNNING", user: str = ME, end: float | None = None) -> Job:
    return Job(1, state, 50.0, gpus=16, num_nodes=2, start_time=100.0, end_time=end, partition="gpu",
               opted_in=True, config=DECIDED, user=user)


def report(folder: Path, ratio: float, est, iterations: int = 100, job_id: int = 1) -> float:
    measured = est.cost.iter_time_s(profile(), DECIDED) * ratio
    (folder / ("%d.json" % job_id)).write_text(json.dumps({
        "job_id": job_id, "config": dataclasses.asdict(DECIDED), "median_iter_s": measured,
        "iterations": iterations, "samples": 10}))
    return measured


@pytest.fixture
def new_store(db_url: str):
    """A store on a new database of each backend (SQLite; PostgreSQL when a test server is up)."""
    store = Store.from_url(db_url)
    yield store
    store.engine.dispose()


def run(store: Store, tmp_path: Path, est, ratio: float, user: str = ME, iterations: int = 100
        ) -> tuple[Store, StoreCalibration]:
    record(store, 200.0, est, job(user=user))
    report(tmp_path, ratio, est, iterations)
    step = StoreCalibration(store, measure_dir=str(tmp_path))
    step.measured([job(user=user)], lambda j: profile(), est.cost.iter_time_s, 200.0)
    record(store, 1300.0, est, job("COMPLETED", user, 1300.0))  # elapsed 1200 s
    return store, step


def test_a_measurement_reaches_the_history_and_changes_that_layouts_prediction(new_store, tmp_path, estimator):
    store, step = run(new_store, tmp_path, estimator, 1.5)
    [m] = store.measurements()
    assert (m.status, m.config, m.tp, m.pp, m.user) == ("ok", DECIDED.short(), DECIDED.tp, DECIDED.pp, ME)
    assert m.own_layout == 1  # the user's tp1 pp4 mbs1, on 16 GPUs instead of 8: still their layout
    assert m.predicted_iter_s == pytest.approx(estimator.cost.iter_time_s(profile(), DECIDED))
    new = step.refit(1300.0, estimator)
    assert any(" tp=" in key for key in store.calibration())  # layout terms, beside the class
    assert "gpt-1b own=1" in store.calibration()
    assert new.bias("gpt-1b", DECIDED) > 1.1  # learned from the measured iteration time, not 1200 s elapsed
    other = dataclasses.replace(DECIDED, tp=2, dp=2)
    assert new.bias("gpt-1b", other) < new.bias("gpt-1b", DECIDED)  # another tp moves less
    assert new.bias("gpt-2b-other", DECIDED) == 1.0  # other classes untouched


@pytest.mark.parametrize("ratio, user, iterations, status", [
    (10.0, ME, 100, "out of bounds"),
    (1.5, "no-such-user-pipeswift", 100, None),  # not its user's file: skipped unread, as if absent
    (1.5, ME, 100_000, "ok"),  # 100,000 iterations cannot fit in 1200 s elapsed: refused at the refit
    (1.5, ME, 0, "no iterations"),  # nothing to check against the elapsed time
])
def test_refused_claims_are_recorded_and_never_learned(new_store, tmp_path, estimator, ratio, user, iterations,
                                                       status):
    store, step = run(new_store, tmp_path, estimator, ratio, user, iterations)
    assert [m.status for m in store.measurements()] == ([status] if status else [])
    step.refit(1300.0, estimator)
    assert not any(" tp=" in key for key in store.calibration())
    if status == "ok":
        assert [m.status for m in store.measurements()] == ["exceeds elapsed"]


@pytest.mark.parametrize("field, value, status", [
    ("median_iter_s", 10 ** 400, "no value"),  # an integer too large for a float
    ("median_iter_s", True, "no value"),
    ("iterations", 10 ** 25, "no iterations"),  # too large for an SQL integer
    ("iterations", -5, "no iterations"),
    ("iterations", 2.5, "no iterations"),
    ("tp", float("inf"), "invalid layout"),
    ("tp", 1e19, "invalid layout"),
    ("tp", None, "invalid layout"),
    ("num_nodes", None, "invalid layout"),
    ("pp", "4", "invalid layout"),
    ("decoder_first_pipeline_num_layers", -1, "invalid layout"),
])
def test_a_report_of_absurd_values_is_refused_and_the_tick_goes_on(tmp_path, estimator, field, value, status):
    """A user writes their own job's report: whatever it holds, it is refused with a status,
    and the other jobs' reports in the same tick are still taken in."""
    from pipeswift_slurm.slurm.measured import ingest

    store = Store.in_memory()
    second = dataclasses.replace(job(), job_id=2)
    record(store, 200.0, estimator, job(), second)
    report(tmp_path, 1.5, estimator)
    report(tmp_path, 1.5, estimator, job_id=2)
    body = json.loads((tmp_path / "1.json").read_text())
    if field in body["config"]:
        body["config"][field] = value
    else:
        body[field] = value
    (tmp_path / "1.json").write_text(json.dumps(body))
    assert ingest(str(tmp_path), [job(), second], lambda j: profile(), estimator.cost.iter_time_s, store) \
        == {status: 1, "ok": 1}
    assert sorted((m.job_id, m.status) for m in store.measurements()) == [(1, status), (2, "ok")]


def test_a_file_named_after_a_job_before_it_starts_cannot_keep_it_from_reporting(tmp_path, estimator):
    """The folder is shared: another user may create ``<job id>.json`` (or any name with that
    id) first, even with an mtime far in the future. The launcher's report has a random part
    in its name (``iterlog.report_name``), so it is written all the same, and the controller
    reads the job's user's file and skips the other one unread."""
    import os

    from pipeswift_slurm.slurm.measured import ingest
    from pipeswift_slurm.submit.iterlog import IterationLog, report_name, write_report

    store = Store.in_memory()
    record(store, 200.0, estimator, job())
    squatted = tmp_path / "1.json"
    squatted.write_text("{}")
    try:
        os.chown(squatted, pwd.getpwnam("nobody").pw_uid, -1)  # another user's file
    except (KeyError, PermissionError):
        pytest.skip("needs root and a user 'nobody' to make a file of another user")
    os.utime(squatted, (4e9, 4e9))
    name = report_name(1)
    assert name != report_name(1) and name.startswith("1.") and name.endswith(".json")
    log = IterationLog()
    ms = 1000 * estimator.cost.iter_time_s(profile(), DECIDED) * 1.5
    for i in (5, 10, 15):
        log.feed((" iteration %d/100 | elapsed time per iteration (ms): %.3f |" % (i, ms)).encode())
    write_report(str(tmp_path), name, 1, DECIDED, log)
    by_another = "no-such-user-pipeswift"  # the squatter's file, as the controller sees its owner
    assert ingest(str(tmp_path), [dataclasses.replace(job(), user=by_another)], lambda j: profile(),
                  estimator.cost.iter_time_s, store) == {}
    assert ingest(str(tmp_path), [job()], lambda j: profile(), estimator.cost.iter_time_s, store) == {"ok": 1}
    [m] = store.measurements()
    assert m.status == "ok" and m.iterations == 15


def test_a_report_for_another_job_id_is_refused(tmp_path, estimator):
    store = Store.in_memory()
    record(store, 200.0, estimator, job())
    report(tmp_path, 1.5, estimator)
    body = json.loads((tmp_path / "1.json").read_text())
    (tmp_path / "1.json").write_text(json.dumps({**body, "job_id": 2}))
    StoreCalibration(store, measure_dir=str(tmp_path)).measured([job()], lambda j: profile(),
                                                                 estimator.cost.iter_time_s, 200.0)
    assert [m.status for m in store.measurements()] == ["not this job's report"]


def test_a_layout_other_than_the_decided_one_is_refused_and_with_no_decision_taken(tmp_path, estimator):
    """The launcher runs the controller's decision where it fits the allocation: a report of
    another layout (valid, within bounds) is a run that never happened, and would have
    counted that layout as measured for every user's jobs of the class. With no decision
    (Slurm started the job before a tick), the launcher planned it: any valid layout."""
    from pipeswift_slurm.core.megatron_rules import enumerate_configs

    other = next(c for c in enumerate_configs(profile(), 16, 8) if c != DECIDED)
    store = Store.in_memory()
    undecided = dataclasses.replace(job(), job_id=2, config=None)
    record(store, 200.0, estimator, job(), undecided)
    for job_id in (1, 2):
        report(tmp_path, 1.0, estimator, job_id=job_id)
        body = json.loads((tmp_path / ("%d.json" % job_id)).read_text())
        body["config"] = dataclasses.asdict(other)
        body["median_iter_s"] = estimator.cost.iter_time_s(profile(), other)
        (tmp_path / ("%d.json" % job_id)).write_text(json.dumps(body))
    StoreCalibration(store, measure_dir=str(tmp_path)).measured([job(), undecided], lambda j: profile(),
                                                                 estimator.cost.iter_time_s, 200.0)
    assert sorted((m.job_id, m.status) for m in store.measurements()) == [(1, "not the decided layout"), (2, "ok")]


def test_a_link_is_refused(new_store, tmp_path, estimator):
    """A link named after a job is not a report of it, whoever owns its target."""
    record(new_store, 200.0, estimator, job())
    report(tmp_path, 1.5, estimator, job_id=9)
    (tmp_path / "1.json").symlink_to(tmp_path / "9.json")
    StoreCalibration(new_store, measure_dir=str(tmp_path)).measured([job()], lambda j: profile(),
                                                                     estimator.cost.iter_time_s, 200.0)
    assert [m.status for m in new_store.measurements()] == ["not a plain file"]


def test_only_new_reports_are_read_again(new_store, tmp_path, estimator):
    """A tick writes nothing for a report it has recorded; a rewritten one replaces it."""
    import os

    from pipeswift_slurm.slurm.measured import ingest

    record(new_store, 200.0, estimator, job())
    report(tmp_path, 1.5, estimator)
    again = (str(tmp_path), [job()], lambda j: profile(), estimator.cost.iter_time_s, new_store)
    assert ingest(*again) == {"ok": 1}
    assert ingest(*again) == {}
    measured = report(tmp_path, 1.2, estimator)
    later = new_store.measurements()[0].reported_at + 10
    os.utime(tmp_path / "1.json", (later, later))
    assert ingest(*again) == {"ok": 1}
    [m] = new_store.measurements([1])
    assert (m.iter_s, m.reported_at) == (pytest.approx(measured), later)


def test_a_report_swapped_for_a_fifo_after_the_check_does_not_hang_the_tick(tmp_path, monkeypatch):
    """The folder is world-writable: between the controller's lstat and its open, a user may
    put a FIFO where the plain file was. The open must not block; the report is refused."""
    import os

    from pipeswift_slurm.slurm import measured

    plain = tmp_path / "plain"
    plain.write_text("{}")
    os.mkfifo(tmp_path / "1.json")
    monkeypatch.setattr(measured.os, "lstat", lambda path: os.stat(plain))  # the check saw a file
    got = measured.read_report([str(tmp_path / "1.json")], job())
    assert got is not None and got[0] == {} and got[1] == "not a plain file of its user"


def test_a_flood_of_files_named_after_jobs_costs_a_tick_a_bounded_look(tmp_path, caplog):
    """Anyone may name files after any job in the shared folder: a tick looks only at the
    files of the jobs it asks about, at most MAX_FILES_PER_JOB of each, and says so."""
    from pipeswift_slurm.slurm.measured import MAX_FILES_PER_JOB, reports_in

    for i in range(MAX_FILES_PER_JOB + 10):
        (tmp_path / ("1.%016x.json" % i)).write_text("{}")
        (tmp_path / ("9.%016x.json" % i)).write_text("{}")
    (tmp_path / "2.json").write_text("{}")
    with caplog.at_level("WARNING"):
        got = reports_in(str(tmp_path), {1, 2})
    assert sorted(got) == [1, 2] and len(got[1]) == MAX_FILES_PER_JOB and len(got[2]) == 1
    assert "over %d files named after job(s) 1 " % MAX_FILES_PER_JOB in caplog.text
