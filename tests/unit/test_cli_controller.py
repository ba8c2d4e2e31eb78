"""``pipeswift controller tick|run`` (issue 28 item 13): with no config file a tick is a
dry run that writes no history and says so in one line with how to go live; ``run``
takes ``--dry-run`` too; a tick that finds the lock taken warns, naming the holder and
how long it has held it."""

from __future__ import annotations

import fcntl
import logging
import os
import time

import pytest
from click.testing import CliRunner

from pipeswift_slurm.cli.main import pipeswift
from pipeswift_slurm.core.model import ClusterView, Job, Node
from pipeswift_slurm.slurm import backends, config


class Idle:
    """A cluster with one pending job and no free GPU, recording what it is asked to do."""

    def __init__(self) -> None:
        self.applied: list = []

    def snapshot(self) -> ClusterView:
        return ClusterView(now=1_700_000_000.0, nodes=(Node("n1", 8, 8),),
                           jobs=(Job(7, "PENDING", 1_699_999_000.0, gpus=8),))

    def apply(self, decision, job) -> None:
        self.applied.append(decision)


@pytest.fixture
def cluster(monkeypatch, tmp_path):
    """No config file anywhere; a fake cluster."""
    backend = Idle()
    monkeypatch.delenv("PIPESWIFT_CONFIG", raising=False)
    monkeypatch.delenv("PIPESWIFT_DB", raising=False)
    monkeypatch.setattr(config, "DEFAULT_PATH", str(tmp_path / "absent.toml"))
    monkeypatch.setattr(backends, "get_backend", lambda name, partitions=None: backend)
    return backend


def _no_store(*_args, **_kw):
    raise AssertionError("a config-less dry run must not open the history")


def test_no_config_file_means_a_dry_run_that_records_nothing(cluster, monkeypatch, tmp_path):
    from pipeswift_slurm.store.history import Store

    monkeypatch.setattr(Store, "from_url", classmethod(_no_store))
    cfg = config.load_config()
    assert (cfg.dry_run, cfg.db_url, cfg.from_file) == (True, "", False)
    result = CliRunner().invoke(pipeswift, ["controller", "tick"], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    first = result.stderr.splitlines()[0]
    assert first.startswith("dry run (no config file") and "no history written" in first
    assert "dry_run = false" in first  # how to go live
    assert "(dry run)" in result.stderr and cluster.applied == []


def test_a_config_file_without_dry_run_is_live(cluster, tmp_path):
    path = tmp_path / "config.toml"
    path.write_text("[store]\nurl = '%s'\n" % (tmp_path / "h.sqlite"))
    cfg = config.load_config(str(path))
    assert (cfg.dry_run, cfg.from_file) == (False, True)
    result = CliRunner().invoke(pipeswift, ["controller", "tick", "--config", str(path)], catch_exceptions=False)
    assert result.exit_code == 0 and "dry run" not in result.stderr


def test_a_history_of_another_program_or_edited_by_hand_is_one_line_not_a_traceback(cluster, tmp_path):
    """Found by fuzzing: a database whose ``ticks`` and ``jobs`` are another program's tables
    ended the tick in an IntegrityError traceback; text in a finished job's run time ended a
    live tick in the calibration refit (a TypeError), after its decisions were recorded."""
    import sqlite3

    foreign = tmp_path / "other.sqlite"
    with sqlite3.connect(foreign) as db:
        db.execute("CREATE TABLE jobs (x)")
        db.execute("CREATE TABLE ticks (y)")
    path = tmp_path / "config.toml"
    path.write_text("[store]\nurl = '%s'\n[controller]\nlock_file = '%s'\n" % (foreign, tmp_path / "l.lock"))
    result = CliRunner().invoke(pipeswift, ["controller", "tick", "--dry-run", "--config", str(path)])
    assert result.exit_code == 1 and result.exception.__class__ is SystemExit, result.output
    assert result.stderr.splitlines()[-1].startswith("pipeswift: error: database %s: " % foreign)
    assert "is it pipeswift's history?" in result.stderr

    from pipeswift_slurm.store.history import Store

    mine = tmp_path / "h.sqlite"
    store = Store.from_url(str(mine))
    with sqlite3.connect(mine) as db:
        db.execute("INSERT INTO jobs (job_id, state, job_class, predicted_run_s, run_s, end_time)"
                   " VALUES (3, 'COMPLETED', 'gpt', 100.0, 'x', 1.0), (4, 'COMPLETED', 'gpt', 100.0, 90.0, 2.0)")
    assert [f.job_id for f in store.finished_jobs()] == [4]  # the row that is no run is not learned from


def test_run_takes_dry_run(cluster, tmp_path):
    path = tmp_path / "config.toml"
    path.write_text("[store]\nurl = '%s'\n[controller]\nlock_file = '%s'\n" % (tmp_path / "h.sqlite",
                                                                               tmp_path / "l.lock"))
    result = CliRunner().invoke(pipeswift, ["controller", "run", "--config", str(path), "--dry-run",
                                            "--max-ticks", "1", "--interval", "1"], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    assert result.stderr.startswith("dry run (--dry-run)") and "(dry run)" in result.stderr
    assert cluster.applied == []


def test_run_exits_1_when_its_last_tick_failed(cluster, tmp_path, monkeypatch):
    """A loop whose ticks fail (here Slurm does not answer) says so in its exit status."""
    from pipeswift_slurm.slurm.backends import BackendError

    def no_answer() -> ClusterView:
        raise BackendError("squeue: cannot reach slurmctld")

    monkeypatch.setattr(cluster, "snapshot", no_answer)
    path = tmp_path / "config.toml"
    path.write_text("[store]\nurl = '%s'\n[controller]\nlock_file = '%s'\n" % (tmp_path / "h.sqlite",
                                                                               tmp_path / "l.lock"))
    argv = ["controller", "run", "--config", str(path), "--dry-run", "--max-ticks", "2", "--interval", "1"]
    result = CliRunner().invoke(pipeswift, argv, catch_exceptions=False)
    assert result.exit_code == 1 and result.stderr.count("slurm: squeue: cannot reach slurmctld") == 2, result.output


def test_a_taken_lock_is_a_warning_naming_holder_and_age(cluster, tmp_path, caplog):
    lock = tmp_path / "tick.lock"
    path = tmp_path / "config.toml"
    path.write_text("[store]\nurl = '%s'\n[controller]\nlock_file = '%s'\n" % (tmp_path / "h.sqlite", lock))
    fd = os.open(lock, os.O_RDWR | os.O_CREAT)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        os.write(fd, b"4242 %d\n" % int(time.time() - 600))  # a tick stuck for 10 minutes
        with caplog.at_level(logging.INFO):
            result = CliRunner().invoke(pipeswift, ["controller", "tick", "--config", str(path)],
                                            catch_exceptions=False)
    finally:
        os.close(fd)
    assert result.exit_code == 0
    [warning] = [r for r in caplog.records if "another controller tick" in r.getMessage()]
    assert warning.levelno == logging.WARNING
    assert "held by pid 4242 for 6" in warning.getMessage()  # 600 s, give or take a second


def test_the_lock_holder_writes_its_pid_and_start(tmp_path):
    from pipeswift_slurm.cli.controller import lock_holder, tick_lock

    path = str(tmp_path / "tick.lock")
    with tick_lock(path) as got:
        assert got
        assert lock_holder(path, time.time() + 5).startswith("held by pid %d for " % os.getpid())
        with tick_lock(path) as second:
            assert second is False
    assert lock_holder(str(tmp_path / "none.lock"), 0.0) == ""
