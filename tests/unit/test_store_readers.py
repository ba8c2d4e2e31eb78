"""Read-only readers of the controller's history (issue 28 item 12): the file the
controller writes (as root) can be read by a user who may only read it, through the
reports' own opening (``Store.reader``) and through ``sqlite3 -readonly``."""

from __future__ import annotations

import os
import shutil
import sqlite3
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from sqlalchemy.exc import OperationalError

from pipeswift_slurm.core.model import ClusterView, Job, Node
from pipeswift_slurm.store.history import Store

NODES = (Node("n1", 8, 8),)


def controller_history(folder: Path) -> Path:
    """A history written the way the controller writes it (and then closed)."""
    path = folder / "pipeswift.sqlite"
    store = Store.from_url(str(path))
    with store.tick(100.0, "pipeswift") as tx:
        tx.save_snapshot(ClusterView(now=100.0, nodes=NODES, jobs=(Job(1, "RUNNING", 50.0, gpus=8, start_time=60.0),)))
    store.engine.dispose()
    return path


def test_the_reader_opens_read_only_and_creates_nothing(tmp_path):
    path = controller_history(tmp_path)
    before = sorted(os.listdir(tmp_path))
    reader = Store.reader(str(path))
    assert reader.known_jobs() == {1: "RUNNING"}
    with pytest.raises(OperationalError, match="readonly"):
        with reader.engine.begin() as conn:
            conn.exec_driver_sql("DELETE FROM ticks")
    reader.engine.dispose()
    assert sorted(os.listdir(tmp_path)) == before
    with pytest.raises(OperationalError):
        Store.reader(str(tmp_path / "absent.sqlite")).known_jobs()
    assert not (tmp_path / "absent.sqlite").exists()


def journal_mode(path: Path) -> str:
    conn = sqlite3.connect(path)
    try:
        return conn.execute("PRAGMA journal_mode").fetchone()[0]
    finally:
        conn.close()


def test_the_controller_switches_an_old_wal_history_to_a_rollback_journal(tmp_path):
    path = tmp_path / "old.sqlite"
    Store.from_url(str(path), journal_mode="WAL").engine.dispose()
    assert journal_mode(path) == "wal"
    reader = sqlite3.connect(path)
    reader.execute("BEGIN")
    reader.execute("SELECT count(*) FROM jobs").fetchall()  # a report reading right now
    store = Store.from_url(str(path), busy_timeout_s=0.1)
    with store.tick(1.0, "fifo"):
        pass  # the tick still runs; the switch waits for a later connection
    store.engine.dispose()
    reader.close()
    assert journal_mode(path) == "wal"
    Store.from_url(str(path)).engine.dispose()
    assert journal_mode(path) == "delete"


@pytest.fixture
def root_owned_history():
    """A root-owned folder (0755) and history (0644), as /var/lib/pipeswift is."""
    if os.geteuid() != 0 or shutil.which("runuser") is None:
        pytest.skip("needs root and runuser to read the history as an unprivileged user")
    folder = Path(tempfile.mkdtemp(prefix="pipeswift-ro-"))
    folder.chmod(0o755)
    path = controller_history(folder)
    path.chmod(0o644)
    yield path
    shutil.rmtree(folder)


def as_nobody(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run(["runuser", "-u", "nobody", "--", *argv], capture_output=True, text=True, timeout=60)


def test_sqlite3_readonly_reads_it_as_an_unprivileged_user(root_owned_history):
    if shutil.which("sqlite3") is None:
        pytest.skip("no sqlite3 command")
    out = as_nobody("sqlite3", "-readonly", str(root_owned_history), "SELECT job_id, state FROM jobs")
    assert (out.returncode, out.stdout.strip(), out.stderr) == (0, "1|RUNNING", "")


def test_pipeswift_report_reads_it_as_an_unprivileged_user(root_owned_history):
    probe = as_nobody(sys.executable, "-c", "import sqlalchemy, click")
    if probe.returncode != 0:
        pytest.skip("this Python (%s) or its packages are not readable by nobody" % sys.executable)
    env_path = os.environ.get("PYTHONPATH", "")
    out = as_nobody("env", "PYTHONPATH=%s" % env_path, sys.executable, "-m", "pipeswift_slurm.cli", "report", "all",
                    "--db", str(root_owned_history))
    assert out.returncode == 0, out.stderr
    assert "readonly" not in out.stderr
