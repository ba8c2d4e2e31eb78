"""One controller at a time, unblockable, and nothing lost (issue 23, issue 27 item 3).

The lock file lives where only the admin can write: a world-writable folder, a folder of
another user, a symlinked or foreign lock file is one line and exit 2. Two controllers on
one history (two processes, two lock files, one SQLite file): exactly one acts. Each
decision is written before Slurm is changed: with the database locked or the disk full
nothing is changed; when the write after the change fails, or the tick is killed with -9
right after it, the next tick reads the job back and the history shows the change; a
batch that timed out is settled per job by what Slurm shows. Holds: marked in the same
update that holds (Priority=0), released before the mark comes off, always released by the
controller (also for jobs it no longer manages), the same through pyslurm. AdminComment
keeps other admins' text. ``simulate --db`` refuses a file that is not a history."""

from __future__ import annotations

import logging
import os
import sqlite3
import stat
import subprocess
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any, Optional, Sequence

import pytest
from click.testing import CliRunner
from sqlalchemy import event
from sqlalchemy.exc import OperationalError

sys.path.insert(0, str(Path(__file__).resolve().parent))
from guard_backend import NOW, PROFILE, FileBackend, pending, read_state, write_state  # noqa: E402

from pipeswift_slurm.cli.main import pipeswift  # noqa: E402
from pipeswift_slurm.core import token  # noqa: E402
from pipeswift_slurm.core.costmodel import CostModel  # noqa: E402
from pipeswift_slurm.core.estimator import Estimator  # noqa: E402
from pipeswift_slurm.core.hardware import get_gpu_type  # noqa: E402
from pipeswift_slurm.core.model import Decision, ExecConfig, Job  # noqa: E402
from pipeswift_slurm.policy import get_policy  # noqa: E402
from pipeswift_slurm.slurm.backends import BackendError, OutcomeUnknown  # noqa: E402
from pipeswift_slurm.slurm.backends.scontrol_argv import (ADMIN_COMMENT_MAX_CHARS, admin_comment_value,  # noqa: E402
                                                          apply_argvs, update_argv)
from pipeswift_slurm.slurm.controller import Controller  # noqa: E402
from pipeswift_slurm.store.history import Store, StoreBusy, StoreError  # noqa: E402
from pipeswift_slurm.store.lease import take_lease, this_holder  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
CFG = ExecConfig(tp=1, pp=1, dp=2, micro_batch_size=4, num_micro_batches=8, num_nodes=1, gpus_per_node=2)


def estimator() -> Estimator:
    return Estimator(CostModel(get_gpu_type("A100-80GB")), 16)


def controller(backend: Any, store: Optional[Store]) -> Controller:
    return Controller(backend, get_policy("pipeswift"), estimator(), store)


def decisions(store: Store) -> list[tuple[int, int, Optional[bool], bool]]:
    """(tick_id, job_id, applied, awaiting_outcome) of every decision row."""
    with store.engine.connect() as conn:
        return [tuple(r) for r in conn.exec_driver_sql(  # type: ignore[misc]
            "SELECT tick_id, job_id, applied, awaiting_outcome FROM decisions ORDER BY id")]


def tick_rows(store: Store) -> list[tuple[int, str]]:
    with store.engine.connect() as conn:
        return [tuple(r) for r in conn.exec_driver_sql("SELECT tick_id, status FROM ticks ORDER BY tick_id")]  # type: ignore[misc]


# ------------------------------------------------------------------ the lock file
def _tick_with_lock(tmp_path: Path, lock: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    from pipeswift_slurm.slurm import backends

    state = tmp_path / "cluster.json"
    write_state(state, [pending(1)])
    monkeypatch.setattr(backends, "get_backend", lambda name, partitions=None: FileBackend(state))
    config = tmp_path / "config.toml"
    config.write_text("[store]\nurl = '%s'\n[controller]\nlock_file = '%s'\ndry_run = true\n"
                      % (tmp_path / "h.sqlite", lock))
    return CliRunner().invoke(pipeswift, ["controller", "tick", "--config", str(config)])


def _one_line_exit_2(result: Any, *words: str) -> None:
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output and result.exception is None or isinstance(result.exception, SystemExit)
    lines = [line for line in result.stderr.splitlines() if line.startswith("pipeswift: error")]
    assert len(lines) == 1, result.stderr
    assert all(w in lines[0] for w in words), lines[0]


def test_a_world_writable_lock_folder_is_refused(tmp_path, monkeypatch):
    folder = tmp_path / "shared"
    folder.mkdir()
    folder.chmod(0o1777)  # as /run/lock
    _one_line_exit_2(_tick_with_lock(tmp_path, folder / "tick.lock", monkeypatch), "world-writable", str(folder))


def test_a_lock_folder_of_another_user_is_refused(tmp_path, monkeypatch):
    if os.geteuid() != 0:
        pytest.skip("needs root to give a folder to another user")
    folder = tmp_path / "theirs"
    folder.mkdir(mode=0o755)
    os.chown(folder, 65534, 65534)
    _one_line_exit_2(_tick_with_lock(tmp_path, folder / "tick.lock", monkeypatch), "owned by uid 65534")


def test_a_symlinked_or_foreign_lock_file_is_refused(tmp_path, monkeypatch):
    folder = tmp_path / "run"
    folder.mkdir(mode=0o700)
    (folder / "tick.lock").symlink_to(tmp_path / "elsewhere")
    _one_line_exit_2(_tick_with_lock(tmp_path, folder / "tick.lock", monkeypatch), "symlink")
    assert not (tmp_path / "elsewhere").exists()
    if os.geteuid() == 0:
        (folder / "tick.lock").unlink()
        (folder / "tick.lock").write_text("")
        os.chown(folder / "tick.lock", 65534, 65534)
        _one_line_exit_2(_tick_with_lock(tmp_path, folder / "tick.lock", monkeypatch), "owned by uid 65534")


def test_a_missing_lock_folder_is_made_for_the_controller_only(tmp_path, monkeypatch):
    lock = tmp_path / "run" / "pipeswift" / "tick.lock"
    result = _tick_with_lock(tmp_path, lock, monkeypatch)
    assert result.exit_code == 0, result.output
    assert stat.S_IMODE(lock.parent.stat().st_mode) == 0o700
    assert stat.S_IMODE(lock.stat().st_mode) == 0o600


def test_the_default_lock_is_not_in_a_world_writable_folder():
    from pipeswift_slurm.slurm.config import DEFAULT_LOCK

    assert not DEFAULT_LOCK.startswith(("/run/lock/", "/var/lock/", "/tmp/")), DEFAULT_LOCK


# ------------------------------------------------------------------ the history's lease
def test_the_lease_goes_to_one_holder_until_it_expires_or_its_process_is_gone(tmp_path):
    store = Store.from_url(str(tmp_path / "h.sqlite"))
    engine = store._write_engine
    assert take_lease(engine, "hostA pid 1", 1000.0, 60).taken
    second = take_lease(engine, "hostB pid 2", 1010.0, 60)
    assert not second.taken and second.holder == "hostA pid 1"
    assert take_lease(engine, "hostA pid 1", 1020.0, 60).taken  # its own again (controller run)
    assert take_lease(engine, "hostB pid 2", 1081.0, 60).taken  # expired
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    gone = this_holder().replace("pid %d" % os.getpid(), "pid %s" % dead.stdout.strip())
    assert take_lease(engine, gone, 2000.0, 600).taken
    assert take_lease(engine, this_holder(), 2001.0, 600).taken  # a killed tick on this host blocks nothing
    store.release_lease(this_holder())
    assert take_lease(engine, "hostC pid 3", 2002.0, 600).taken


def _driver(state: Path, config: Path, **env: str) -> subprocess.Popen[str]:
    full = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]), **env)
    return subprocess.Popen([sys.executable, str(Path(__file__).with_name("guard_backend.py")), str(state),
                             str(config)], env=full, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _site(tmp_path: Path, name: str, db: Path) -> Path:
    config = tmp_path / ("%s.toml" % name)
    config.write_text("[store]\nurl = '%s'\n[controller]\nlock_file = '%s'\ndry_run = false\ncalibrate = false\n"
                      % (db, tmp_path / name / "tick.lock"))
    return config


def test_two_controllers_on_one_history_exactly_one_acts(tmp_path):
    """Two ticks at once, two lock files, one SQLite history (two hosts sharing a store):
    one acts, the other says so in one WARNING line and exits 0 without acting."""
    db, state = tmp_path / "shared.sqlite", tmp_path / "cluster.json"
    write_state(state, [pending(i) for i in (1, 2, 3)])
    Store.from_url(str(db))  # the schema, as a first tick would have made it
    procs = [_driver(state, _site(tmp_path, name, db), GUARD_SNAPSHOT_SLEEP_S="1.5") for name in ("a", "b")]
    outs = [p.communicate(timeout=120) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs
    acted = [out for out, _ in outs if out.startswith("acted")]
    assert len(acted) == 1, outs
    [idle_err] = [err for out, err in outs if out.startswith("did not act")]
    assert idle_err.count("WARNING") == 1 and "holds the history's lease" in idle_err, idle_err
    pids = {line.split()[0] for line in Path(str(state) + ".applied").read_text().splitlines()}
    assert len(pids) == 1  # every change in Slurm came from one controller


# ------------------------------------------------------------------ intents before changes
class Recording(FileBackend):
    """The file cluster, with a hook run after each change is applied."""

    def __init__(self, state: Path, after_apply: Any = None) -> None:
        super().__init__(state)
        self.after_apply = after_apply

    def apply(self, decision: Decision, job: Job) -> None:
        super().apply(decision, job)
        if self.after_apply is not None:
            self.after_apply()


def _cluster(tmp_path: Path, n: int = 2) -> Path:
    state = tmp_path / "cluster.json"
    write_state(state, [pending(i) for i in range(1, n + 1)])
    return state


def test_a_locked_database_changes_nothing_in_slurm(tmp_path):
    state = _cluster(tmp_path)
    store = Store(Store.from_url(str(tmp_path / "h.sqlite"), busy_timeout_s=0.2).engine)
    backend = Recording(state)
    other = sqlite3.connect(str(tmp_path / "h.sqlite"))
    other.execute("BEGIN IMMEDIATE")  # another writer holds the database
    with pytest.raises(StoreBusy):
        controller(backend, store).tick()
    assert backend.applied == []  # before: 2 updates sent, 0 recorded
    other.rollback()
    controller(backend, store).tick()
    assert {(j, a) for _, j, a, _ in decisions(store)} == {(1, True), (2, True)}


def test_a_database_locked_after_the_change_is_settled_by_the_next_tick(tmp_path):
    state = _cluster(tmp_path)
    store = Store.from_url(str(tmp_path / "h.sqlite"), busy_timeout_s=0.2)
    other = sqlite3.connect(str(tmp_path / "h.sqlite"), isolation_level=None)

    def lock() -> None:
        if not other.in_transaction:
            other.execute("BEGIN IMMEDIATE")

    backend = Recording(state, after_apply=lock)
    with pytest.raises(StoreBusy):
        controller(backend, store).tick()
    assert len(backend.applied) == 2
    assert [a for _, _, a, waiting in decisions(store)] == [None, None]  # intents, outcome unknown
    other.rollback()
    backend.after_apply = None
    backend.applied.clear()
    controller(backend, store).tick()
    assert backend.applied == []  # Slurm already has them
    first_tick = tick_rows(store)[0][0]
    assert [(t, a, w) for t, _, a, w in decisions(store)] == [(first_tick, True, False)] * 2
    assert tick_rows(store)[0][1] == "interrupted"


def _full_disk(store: Store) -> dict[str, bool]:
    """While ``full["now"]``, a commit of a transaction that wrote fails as SQLite's does
    on a full disk (reads still work, as they do)."""
    full = {"now": False}

    @event.listens_for(store.engine, "before_cursor_execute")
    def _wrote(conn: Any, _cursor: Any, statement: str, *_: Any) -> None:
        if statement.lstrip().upper().startswith(("INSERT", "UPDATE", "DELETE")):
            conn.info["wrote"] = True

    @event.listens_for(store.engine, "commit")
    def _commit(conn: Any) -> None:
        wrote = conn.info.pop("wrote", False)
        if full["now"] and wrote:
            raise OperationalError("COMMIT", {}, sqlite3.OperationalError("database or disk is full"))

    @event.listens_for(store.engine, "rollback")
    def _rollback(conn: Any) -> None:
        conn.info.pop("wrote", None)

    return full


def test_a_full_disk_changes_nothing_and_a_disk_filled_mid_tick_loses_nothing(tmp_path):
    state = _cluster(tmp_path, 3)
    store = Store.from_url(str(tmp_path / "h.sqlite"))
    full = _full_disk(store)
    backend = Recording(state)
    full["now"] = True
    with pytest.raises(StoreError, match="disk is full"):
        controller(backend, store).tick()
    assert backend.applied == []  # before: 40 updates sent, then a traceback
    full["now"] = False
    backend.after_apply = lambda: full.update(now=True)  # the disk fills while Slurm is changed
    with pytest.raises(StoreError):
        controller(backend, store).tick()
    assert len(backend.applied) == 3
    full["now"] = False
    backend.after_apply = None
    controller(backend, store).tick()
    assert sorted((j, a) for _, j, a, w in decisions(store) if not w) == [(1, True), (2, True), (3, True)]


def test_the_cli_says_a_full_disk_in_one_line(tmp_path, monkeypatch):
    from pipeswift_slurm.slurm import backends

    state = _cluster(tmp_path)
    monkeypatch.setattr(backends, "get_backend", lambda name, partitions=None: FileBackend(state))
    real = Store.from_url

    def full_store(url: str, *a: Any, **kw: Any) -> Store:
        store = real(url, *a, **kw)
        _full_disk(store)["now"] = True
        return store

    monkeypatch.setattr(Store, "from_url", staticmethod(full_store))
    config = _site(tmp_path, "x", tmp_path / "h.sqlite")
    result = CliRunner().invoke(pipeswift, ["controller", "tick", "--config", str(config)])
    assert result.exit_code == 1 and "Traceback" not in result.output, (result.output, result.exception)
    assert result.output.strip().splitlines()[-1].startswith("pipeswift: error: database: "), result.output
    assert Path(str(state) + ".applied").exists() is False


def test_kill_9_between_the_slurm_update_and_the_database_write(tmp_path):
    """The tick process is killed right after Slurm applied its first change: the next tick
    reads the job back and the history shows that change (before: no row at all)."""
    db, state = tmp_path / "h.sqlite", _cluster(tmp_path, 2)
    config = _site(tmp_path, "k", db)
    proc = _driver(state, config, GUARD_KILL_AFTER_APPLY="1")
    proc.communicate(timeout=120)
    assert proc.returncode == -9
    changed = [int(line.split()[1]) for line in Path(str(state) + ".applied").read_text().splitlines()]
    assert len(changed) == 1
    again = _driver(state, config)
    out, err = again.communicate(timeout=120)
    assert again.returncode == 0 and out.startswith("acted"), err
    store = Store.from_url(str(db))
    rows = decisions(store)
    killed_tick = tick_rows(store)[0]
    assert killed_tick[1] == "interrupted"
    assert (killed_tick[0], changed[0], True, False) in rows  # the change the killed tick made
    assert not any(w for *_, w in rows)
    applied_jobs = sorted(j for _, j, a, _ in rows if a)
    assert applied_jobs == sorted(int(line.split()[1]) for line in
                                  Path(str(state) + ".applied").read_text().splitlines())


class HalfBatch(Recording):
    """A batching backend whose batch times out after Slurm applied its first half."""

    def apply_many(self, items: Sequence[tuple[Decision, Job]]) -> list[Optional[BackendError]]:
        for decision, job in items[: len(items) // 2]:
            self.apply(decision, job)
        return [OutcomeUnknown("scontrol (%d commands on stdin) timed out after 60 s" % len(items))] * len(items)


def test_a_batch_that_timed_out_is_recorded_per_job_by_what_slurm_shows(tmp_path):
    state = _cluster(tmp_path, 4)
    store = Store.from_url(str(tmp_path / "h.sqlite"))
    backend = HalfBatch(state)
    with pytest.raises(BackendError, match="timed out"):
        controller(backend, store).tick()
    first = decisions(store)
    assert [(a, w) for *_, a, w in first] == [(None, True)] * 4  # not all failed: not known yet
    done = {d.job_id for d in backend.applied}
    assert len(done) == 2
    controller(Recording(state), store).tick()  # plain apply: nothing batched
    tick1 = tick_rows(store)[0][0]
    outcome = {j: a for t, j, a, w in decisions(store) if t == tick1}
    assert outcome == {j: j in done for j in (1, 2, 3, 4)}, outcome


# ------------------------------------------------------------------ holds
def test_a_hold_is_marked_in_the_same_update_that_holds():
    job = pending(5, 2, admin_comment="")
    [update] = apply_argvs(Decision(5, config=CFG, hold=True), job, NOW)
    assert update[:3] == ["scontrol", "update", "JobId=5"] and "Priority=0" in update
    [comment] = [w for w in update if w.startswith("AdminComment=")]
    assert token.held_by_controller(comment)
    assert not any(argv[1] == "hold" for argv in apply_argvs(Decision(5, config=CFG, hold=True), job, NOW))


def test_a_release_keeps_the_mark_until_the_job_is_released():
    held = pending(5, 2, state_reason="JobHeldAdmin", config=CFG,
                   admin_comment=token.encode_decision(CFG, int(NOW) - 60, held=True))
    argvs = apply_argvs(Decision(5, config=CFG, site_factor=7, hold=False), held, NOW)
    kinds = [argv[1] for argv in argvs]
    assert kinds == ["update", "release", "update"], argvs
    assert token.held_by_controller(" ".join(argvs[0])) and "SiteFactor=7" not in argvs[0]
    assert not token.held_by_controller(" ".join(argvs[2])) and "SiteFactor=7" in argvs[2]


def test_the_controller_releases_its_own_hold_on_a_job_it_no_longer_manages(tmp_path):
    """A job the controller held whose profile became invalid (or left the partition, or
    was opted out) is released, and its mark taken off, other admins' text kept."""
    state = tmp_path / "cluster.json"
    marked = token.encode_decision(CFG, int(NOW) - 60, held=True) + " ticket-42"
    write_state(state, [replace(pending(1, 2), state_reason="JobHeldAdmin", admin_comment=marked, opted_in=False)])
    backend = Recording(state)
    report = controller(backend, None).tick()
    assert [(d.job_id, d.hold) for d in report.decisions] == [(1, False)]
    [job] = read_state(state)
    assert not job.held
    argvs = apply_argvs(report.decisions[0], replace(pending(1, 2), state_reason="JobHeldAdmin",
                                                     admin_comment=marked, opted_in=False), NOW)
    assert [a[1] for a in argvs] == ["release", "update"]
    [comment] = [w for w in argvs[1] if w.startswith("AdminComment=")]
    assert not token.held_by_controller(comment) and comment.endswith(" ticket-42")


def test_pyslurm_marks_before_it_holds_and_releases_before_it_unmarks():
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from fake_pyslurm import fake_job, fake_node, make_fake

    from pipeswift_slurm.slurm.backends.pyslurm_ import PyslurmBackend

    fake = make_fake([fake_job(5, comment=PROFILE, gres_per_node={"gpu": 2})], [fake_node("n1")])
    backend = PyslurmBackend(module=fake, run=lambda argv: "", clock=lambda: NOW, read_site_factors=False)
    job = pending(5, 2, admin_comment="note")
    backend.apply(Decision(5, config=CFG, hold=True), job)
    assert [c.split()[0] for c in fake.calls] == ["modify", "hold"], fake.calls
    assert "hold=1" in fake.calls[0] and "note" in fake.calls[0] and "mode" not in fake.calls[1]
    fake.calls.clear()
    held = replace(job, state_reason="JobHeldAdmin", admin_comment=token.encode_decision(CFG, int(NOW), held=True))
    backend.apply(Decision(5, config=CFG, site_factor=3, hold=False), held)
    assert [c.split()[0] for c in fake.calls] == ["modify", "release", "modify"], fake.calls
    assert "hold=1" in fake.calls[0] and "hold=1" not in fake.calls[2] and "site_factor" in fake.calls[2]


# ------------------------------------------------------------------ AdminComment
def test_the_decision_token_replaces_only_our_own_word():
    old = token.encode_decision(CFG, 1, held=True)
    job = pending(5, 2, admin_comment="audit: ok %s ticket 42" % old)
    argv = update_argv(Decision(5, config=CFG), job, NOW)
    assert argv is not None
    [comment] = [w for w in argv if w.startswith("AdminComment=")]
    ours = token.encode_decision(CFG, int(NOW))
    assert comment == "AdminComment=%s audit: ok ticket 42" % ours
    assert token.decode_decision(comment)[1] == int(NOW)


def test_other_text_too_long_keeps_our_token_and_says_so(caplog):
    ours = token.encode_decision(CFG, int(NOW))
    with caplog.at_level(logging.WARNING):
        value = admin_comment_value("x" * ADMIN_COMMENT_MAX_CHARS, ours, 5)
    assert value == ours and "job 5" in caplog.text and "dropped" in caplog.text


def test_a_note_with_spaces_is_not_sent_in_a_batch_line():
    from pipeswift_slurm.slurm.backends.slurm_cli import CommandResult, SlurmCliBackend

    fed: list[str] = []
    ran: list[list[str]] = []
    backend = SlurmCliBackend(run=lambda argv: ran.append(argv) or "", clock=lambda: NOW, read_site_factors=False,
                              feed=lambda argv, text: fed.append(text) or CommandResult(0, "", ""))
    plain, noted = pending(1, 2), pending(2, 2, admin_comment="see ticket 42")
    assert backend.apply_many([(Decision(1, config=CFG), plain), (Decision(2, config=CFG), noted)]) == [None, None]
    assert fed and "JobId=1" in fed[0] and "JobId=2" not in "".join(fed)
    assert any("AdminComment=%s see ticket 42" % token.encode_decision(CFG, int(NOW)) in argv for argv in ran)


# ------------------------------------------------------------------ simulate --db
def test_simulate_refuses_to_overwrite_a_file_that_is_not_a_history(tmp_path):
    precious = tmp_path / "notes.sqlite"
    precious.write_text("not a database\n")
    other_db = tmp_path / "other.sqlite"
    conn = sqlite3.connect(str(other_db))
    conn.execute("CREATE TABLE payroll (x)")
    conn.commit()
    conn.close()
    for path in (precious, other_db):
        before = path.read_bytes()
        result = CliRunner().invoke(pipeswift, ["simulate", "--jobs", "5", "--db", str(path)])
        assert result.exit_code == 2, result.output
        lines = [ln for ln in result.stderr.splitlines() if ln.startswith("pipeswift: error")]
        assert len(lines) == 1 and str(path) in lines[0] and "not a pipeswift history" in lines[0], result.stderr
        assert path.read_bytes() == before


def test_simulate_never_replaces_a_controllers_history(tmp_path):
    """A history a controller wrote (a live tick took the lease, or a dry tick ran) has the
    simulation's tables; ``simulate --db`` and ``demo --db`` leave it alone. A simulation's
    own history (marked in its header, or an older one no controller could have written) is
    replaced as before."""
    from pipeswift_slurm.store.history import Store
    from pipeswift_slurm.store.lease import take_lease
    from pipeswift_slurm.store.simulated import SIMULATED_APPLICATION_ID, written_by_simulation

    live, dry, old_sim = (tmp_path / name for name in ("live.sqlite", "dry.sqlite", "old-sim.sqlite"))
    take_lease(Store.from_url(str(live)).engine, "host pid 1", NOW)
    with Store.from_url(str(dry)).tick(NOW, "pipeswift", dry_run=True):
        pass
    with Store.from_url(str(old_sim)).tick(NOW, "pipeswift"):
        pass
    for path in (live, dry):
        before = path.read_bytes()
        for argv in (["simulate", "--jobs", "5", "--db", str(path)], ["demo", "--db", str(path)]):
            result = CliRunner().invoke(pipeswift, argv)
            assert result.exit_code == 2, result.output
            lines = [ln for ln in result.stderr.splitlines() if ln.startswith("pipeswift: error")]
            assert len(lines) == 1 and "a controller's history" in lines[0] and str(path) in lines[0], result.stderr
            assert path.read_bytes() == before
        assert not written_by_simulation(path)
    assert written_by_simulation(old_sim)
    for _ in range(2):  # the older simulation's file, then the marked one it became
        result = CliRunner().invoke(pipeswift, ["simulate", "--jobs", "5", "--policy", "fifo", "--db", str(old_sim)])
        assert result.exit_code == 0, result.output
        assert sqlite3.connect(old_sim).execute("PRAGMA application_id").fetchone()[0] == SIMULATED_APPLICATION_ID


def test_an_output_never_replaces_a_database_or_the_commands_input(tmp_path):
    """``--html``/``--plot``/``--prometheus``/``--json`` onto the history a report reads (or
    any SQLite file), or onto the workload a simulation reads: one line, exit 2, untouched."""
    from pipeswift_slurm.store.history import Store

    db = tmp_path / "h.sqlite"
    with Store.from_url(str(db)).tick(NOW, "pipeswift"):
        pass
    workload = tmp_path / "w.csv"
    workload.write_text("job_id,user,vc,submit_time,duration_s,num_gpus\n")
    cases = [(["report", "jct", "--db", str(db), "--html", str(db)], db, "is a SQLite database"),
             (["report", "jct", "--db", str(db), "--prometheus", str(db)], db, "is a SQLite database"),
             (["simulate", "--jobs", "5", "--json", str(db)], db, "is a SQLite database"),
             (["demo", "--plot", str(db), "--db", str(tmp_path / "d.sqlite")], db, "is a SQLite database"),
             (["simulate", "--workload", str(workload), "--json", str(workload)], workload, "is this command's input"),
             (["simulate", "--workload", str(workload), "--plot", str(workload)], workload, "is this command's input"),
             (["simulate", "--jobs", "5", "--db", str(tmp_path / "new.sqlite"), "--json", str(tmp_path / "new.sqlite")],
              None, "is this command's input or another of its outputs"),
             (["simulate", "--jobs", "5", "--json", str(tmp_path / "o"), "--plot", str(tmp_path / "o")],
              None, "is this command's input or another of its outputs")]
    for argv, path, why in cases:
        before = path.read_bytes() if path else None
        result = CliRunner().invoke(pipeswift, argv)
        assert result.exit_code == 2, (argv, result.output)
        lines = [ln for ln in result.stderr.splitlines() if ln.startswith("pipeswift: error")]
        assert len(lines) == 1 and why in lines[0], (argv, result.stderr)
        assert path is None or path.read_bytes() == before
    assert not (tmp_path / "d.sqlite").exists() and not (tmp_path / "new.sqlite").exists()  # refused before any run
