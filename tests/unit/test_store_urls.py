"""History URLs that cannot be used are one line and exit 2, never a traceback: a
PostgreSQL URL whose driver (psycopg) is not installed names the package to install, for
every command that opens a history; ``simulate``/``demo --db`` take a file and refuse a
database server's URL before anything runs, creating nothing."""

from __future__ import annotations

import sys

import pytest
from click.testing import CliRunner

from pipeswift_slurm.cli.main import pipeswift
from pipeswift_slurm.slurm import backends
from pipeswift_slurm.store.history import Store, StoreUnavailable

URL = "postgresql+psycopg://pipeswift:s3cret@db.example.org:5432/pipeswift"
INSTALL = "pip install 'pipeswift-slurm[postgres]'"


@pytest.fixture
def no_psycopg(monkeypatch):
    """psycopg is not importable (whether or not this machine has it)."""
    monkeypatch.setitem(sys.modules, "psycopg", None)


def _one_line(result) -> str:
    lines = (result.stderr or result.output).strip().splitlines()
    assert result.exit_code == 2, result.output
    assert len(lines) == 1, lines
    assert "Traceback" not in result.output
    return lines[0]


def test_the_store_names_the_package_to_install(no_psycopg):
    with pytest.raises(StoreUnavailable) as err:
        Store.from_url(URL)
    assert INSTALL in str(err.value) and "psycopg" in str(err.value)
    assert "s3cret" not in str(err.value)  # the password is never printed


@pytest.mark.parametrize("argv", [
    ("report", "jct", "--db", URL),
    ("report", "all", "--db", URL),
    ("explain", "42", "--db", URL),
])
def test_reading_commands_say_what_to_install(no_psycopg, argv):
    line = _one_line(CliRunner().invoke(pipeswift, list(argv)))
    assert INSTALL in line and "s3cret" not in line


def test_a_controller_tick_says_what_to_install(no_psycopg, monkeypatch, tmp_path):
    monkeypatch.setattr(backends, "get_backend", lambda name, partitions=None: object())
    config = tmp_path / "config.toml"
    config.write_text("[store]\nurl = '%s'\n[controller]\nlock_file = '%s'\n" % (URL, tmp_path / "tick.lock"))
    line = _one_line(CliRunner().invoke(pipeswift, ["controller", "tick", "--config", str(config)]))
    assert INSTALL in line and "s3cret" not in line


def test_an_unknown_url_scheme_is_one_line(monkeypatch, tmp_path):
    line = _one_line(CliRunner().invoke(pipeswift, ["report", "jct", "--db", "postgres://u@h/db"]))
    assert "postgresql+psycopg://" in line


def test_an_unreachable_server_is_one_line(monkeypatch, tmp_path):
    pytest.importorskip("psycopg", reason="psycopg is not installed (the postgres extra)")
    # a port nothing listens on (the test server, when up, is elsewhere)
    line = _one_line(CliRunner().invoke(pipeswift, ["report", "jct", "--db",
                                                    "postgresql+psycopg://u:s3cret@127.0.0.1:9/db"]))
    assert line.startswith("pipeswift: error: cannot read postgresql+psycopg://u:***@127.0.0.1:9/db")


@pytest.mark.parametrize("command", [("simulate", "--jobs", "5", "--gpus", "16"), ("demo",)])
def test_simulations_refuse_a_server_url_and_create_nothing(monkeypatch, tmp_path, command):
    monkeypatch.chdir(tmp_path)
    line = _one_line(CliRunner().invoke(pipeswift, [*command, "--db", URL]))
    assert "--db postgresql+psycopg://pipeswift:***@db.example.org" in line and "SQLite file" in line
    assert list(tmp_path.iterdir()) == []  # no folder named after the URL


def test_a_simulation_takes_a_sqlite_url_as_its_file(monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(pipeswift, ["simulate", "--jobs", "5", "--gpus", "16",
                                            "--policy", "pipeswift", "--db", "sqlite:///sim.sqlite"])
    assert result.exit_code == 0, result.output
    assert [p.name for p in tmp_path.iterdir() if not p.name.startswith("sim.sqlite-")] == ["sim.sqlite"]


class OnePending:
    """A cluster with one pending job and no free GPU."""

    name = "fake"

    def snapshot(self):
        from pipeswift_slurm.core.model import ClusterView, Job, Node

        return ClusterView(now=1_700_000_000.0, nodes=(Node("n1", 8, 8),),
                           jobs=(Job(7, "PENDING", 1_699_999_000.0, gpus=8, user="alice"),))

    def apply(self, decision, job) -> None:
        raise AssertionError("nothing to apply")


def test_cli_tick_then_reports_on_each_backend(db_url, monkeypatch, tmp_path):
    """``controller tick`` with ``[store] url`` on SQLite and on PostgreSQL creates the
    history (the first tick on PostgreSQL used to fail creating it), records the tick, and
    ``report``/``explain`` read it back."""
    monkeypatch.setattr(backends, "get_backend", lambda name, partitions=None: OnePending())
    config = tmp_path / "config.toml"
    config.write_text("[store]\nurl = '%s'\n[controller]\nlock_file = '%s'\n"
                      % (db_url, tmp_path / "tick.lock"))
    for _ in range(2):
        result = CliRunner().invoke(pipeswift, ["controller", "tick", "--config", str(config)])
        assert result.exit_code == 0, result.output
    store = Store.reader(db_url)
    try:
        assert store.tick_count() == 2
        assert store.known_jobs(active_only=True) == {7: "PENDING"}
    finally:
        store.engine.dispose()
    for argv in (["report", "all"], ["report", "waits", "--by", "user"], ["explain", "7"]):
        result = CliRunner().invoke(pipeswift, [*argv, "--db", db_url])
        assert result.exit_code == 0, result.output
    result = CliRunner().invoke(pipeswift, ["report", "waits", "--by", "user", "--format", "csv",
                                            "--db", db_url])
    assert result.output.splitlines()[1].startswith("alice,1,1,")  # "user" is the job's, not the session's


def test_a_reader_cannot_write(db_url):
    """``Store.reader`` (what report and explain open) refuses writes on either backend."""
    from sqlalchemy import text
    from sqlalchemy.exc import DBAPIError

    Store.from_url(db_url).engine.dispose()
    reader = Store.reader(db_url)
    try:
        with pytest.raises(DBAPIError, match="(?i)read.?only"):
            with reader.engine.begin() as conn:
                conn.execute(text("INSERT INTO calibration VALUES ('x', 1, 0.0, 1.0, 0.0)"))
    finally:
        reader.engine.dispose()
