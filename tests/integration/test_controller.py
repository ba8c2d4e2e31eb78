"""The controller against the real test cluster (tests/slurm/testbed.sh up), driven through
``pipeswift controller tick`` as cron runs it (a subprocess with a TOML config) and through
the Python API where a test must reach inside a tick: a pending opted-in job is resized and
starts at its new size; jobs not opted in and running jobs are never modified; a job that
leaves between observe and act is skipped; with requeue allowed, a preempting tick and a
reshaping tick requeue running checkpointing jobs; overlapping and killed ticks leave one
consistent history; history rows carry Slurm's own queue and run seconds; a tick with
nothing new issues no update; and with slurmctld stopped a tick fails with one line and
leaves the database as it was (last in the module: it stops and restarts slurmctld).
Every test runs twice, with the history in SQLite and in PostgreSQL (the ``site`` fixture;
tests/pg/postgres.sh), the killed ticks included."""

from __future__ import annotations

import fcntl
import logging
import os
import re
import shutil
import signal
import sqlite3
import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path
from typing import Any, Callable, Iterator, Optional

import pytest

from pipeswift_slurm.core import token
from pipeswift_slurm.slurm.backends.slurm_cli import SlurmCliBackend, SubprocessRunner, parse_sprio
from pipeswift_slurm.slurm.backends.slurm_parse import parse_kv_line
from pipeswift_slurm.slurm.controller import Controller
from pipeswift_slurm.core.costmodel import CostModel
from pipeswift_slurm.core.estimator import Estimator
from pipeswift_slurm.core.hardware import get_gpu_type
from pipeswift_slurm.core.model import ClusterView, Decision, Job
from pipeswift_slurm.policy import get_policy
from pipeswift_slurm.store.history import Store, make_engine
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "slurm"))  # also when a killed-tick child imports this
from testbed_env import gpus_per_node_tres  # noqa: E402  (tests/slurm/testbed_env.py)

pytestmark = pytest.mark.slurm

MEGATRON = ["--num-layers", "24", "--hidden-size", "1024", "--num-attention-heads", "16",
            "--seq-length", "1024", "--max-position-embeddings", "1024", "--micro-batch-size", "4",
            "--global-batch-size", "64", "--train-iters", "1000"]
PROFILE = token.encode_profile(token.ProfileRequest(tuple(MEGATRON), gpus=(1, 8)))
# Fields that change by themselves between two looks at an untouched job.
VOLATILE = {"RunTime", "LastSchedEval", "StartTime", "EndTime", "Priority", "Reason", "AccrueTime",
            "EligibleTime", "Scheduler", "SecsPreSuspend", "SchedNodeList"}  # the last: backfill plan
TICK_TIMEOUT_S = 90


# ------------------------------------------------------------------ helpers and fixtures
class Site:
    """A controller site in tmp_path: config file, database (a SQLite file, or ``db_url``:
    a PostgreSQL schema of the test server), lock, and the Slurm env."""

    def __init__(self, tmp_path: Path, env: dict[str, str], db_url: Optional[str] = None) -> None:
        self.dir = tmp_path
        self.db: Any = db_url or tmp_path / "ps.sqlite"
        self.lock = tmp_path / "lock"
        self.config = tmp_path / "config.toml"
        self.config.write_text('[store]\nurl = "%s"\n[slurm]\nbackend = "cli"\n[controller]\nlock_file = "%s"\n'
                               % (self.db, self.lock))
        self.env = dict(env)
        self.env.pop("PIPESWIFT_CONFIG", None)
        self.env.pop("PIPESWIFT_DB", None)

    def argv(self) -> list[str]:
        return [sys.executable, "-m", "pipeswift_slurm.cli", "controller", "tick", "--config", str(self.config)]

    def tick(self, env: Optional[dict[str, str]] = None) -> subprocess.CompletedProcess[str]:
        """One cron-style tick; returns the finished process (not checked)."""
        return subprocess.run(self.argv(), env=env or self.env, capture_output=True, text=True,
                              timeout=TICK_TIMEOUT_S, check=False)

    def tick_ok(self) -> str:
        done = self.tick()
        assert done.returncode == 0, done.stderr
        return done.stderr

    def rows(self, sql: str, *args: Any) -> list[Any]:
        """Rows of ``sql`` (``?`` placeholders), readable by column name, from either backend."""
        if isinstance(self.db, str):
            engine = make_engine(self.db)
            try:
                with engine.connect() as conn:
                    result = conn.exec_driver_sql(sql.replace("?", "%s"), args)
                    keys = list(result.keys())
                    return [_Row(tuple(r), keys) for r in result]
            finally:
                engine.dispose()
        with sqlite3.connect(self.db) as conn:
            conn.row_factory = sqlite3.Row
            return list(conn.execute(sql, args))

    def count(self, table: str) -> int:
        return int(self.rows("SELECT count(*) FROM %s" % table)[0][0])

    def fake_scontrol(self, body: str) -> dict[str, str]:
        """An env whose ``scontrol`` runs ``body`` (sh) and then the real one."""
        real = shutil.which("scontrol", path=self.env.get("PATH"))
        assert real, "scontrol not on PATH"
        bindir = self.dir / "bin"
        bindir.mkdir(exist_ok=True)
        wrapper = bindir / "scontrol"
        wrapper.write_text("#!/bin/sh\n%s\nexec %s \"$@\"\n" % (body, real))
        wrapper.chmod(0o755)
        return dict(self.env, PATH="%s:%s" % (bindir, self.env.get("PATH", "")))


class _Row(tuple):
    """A result row readable by index and by column name, as sqlite3.Row is."""

    def __new__(cls, values: tuple, keys: list[str]) -> "_Row":
        row = super().__new__(cls, values)
        row._index = {k: i for i, k in enumerate(keys)}  # type: ignore[attr-defined]
        return row

    def __getitem__(self, key: Any) -> Any:  # type: ignore[override]
        return tuple.__getitem__(self, self._index[key] if isinstance(key, str) else key)  # type: ignore[attr-defined]

    def keys(self) -> list[str]:
        return list(self._index)  # type: ignore[attr-defined]


@pytest.fixture(params=["sqlite", "postgresql"])
def site(request: pytest.FixtureRequest, tmp_path: Path, slurm_env: dict[str, str],
         new_database: Any) -> Iterator[Site]:
    """A site with its history in a SQLite file, and again on PostgreSQL (a fresh schema of
    the test server; skipped, with the reason, when none is up): every controller test runs
    the same ticks with the same assertions on both stores."""
    backend = request.param
    if backend == "sqlite":
        yield Site(tmp_path, slurm_env)
        return
    with new_database(backend, tmp_path, "site") as url:
        yield Site(tmp_path, slurm_env, url)




@pytest.fixture
def cancel_later(slurm: SubprocessRunner) -> Iterator[list[int]]:
    """Job ids submitted without ``submit_job`` (psbatch); cancelled at teardown."""
    ids: list[int] = []
    yield ids
    if ids:
        subprocess.run(["scancel", *map(str, ids)], env=slurm.env, capture_output=True, timeout=30)


def opted_in(submit_job: Callable[..., int], *args: str, wrap: str = "sleep 300") -> int:
    """A 1 node x 1 GPU job opted in with a profile token (flexible 1-8 GPUs)."""
    return submit_job("-N1", "--gpus-per-node=1", "--comment", PROFILE, *args, wrap=wrap)


def stable_fields(slurm: SubprocessRunner, job_id: int) -> dict[str, str]:
    fields = parse_kv_line(slurm(["scontrol", "-o", "show", "job", str(job_id)]).splitlines()[0])
    return {k: v for k, v in fields.items() if k not in VOLATILE}


def site_factors(slurm: SubprocessRunner) -> dict[int, int]:
    return parse_sprio(slurm(["sprio", "-h", "-o", "%i|%Y|%S"]))


def epoch(value: str) -> float:
    return datetime.strptime(value, "%Y-%m-%dT%H:%M:%S").timestamp()


def decision_row(site: Site, job_id: int) -> sqlite3.Row:
    rows = site.rows("SELECT * FROM decisions WHERE job_id = ? ORDER BY id", job_id)
    assert len(rows) == 1, [dict(r) for r in rows]
    return rows[0]


def assert_consistent(site: Site) -> None:
    """No half-recorded tick: every tick closed (or, killed while acting, settled by a later
    one), every decision's tick and job exist, no intent left without its outcome but the
    last tick's."""
    if not isinstance(site.db, str):  # SQLite's own checks (PostgreSQL keeps its constraints itself)
        assert site.rows("PRAGMA integrity_check")[0][0] == "ok"
        assert site.rows("PRAGMA foreign_key_check") == []
    ticks = site.rows("SELECT * FROM ticks ORDER BY tick_id")
    assert ticks and all(t["status"] in ("ok", "failed", "interrupted") and t["finished_at"] is not None
                         for t in ticks[:-1])
    assert ticks[-1]["status"] in ("ok", "failed", "acting")
    assert site.rows("SELECT id FROM decisions WHERE awaiting_outcome AND tick_id != ?", ticks[-1]["tick_id"]) == []
    assert site.rows("SELECT id FROM decisions WHERE tick_id NOT IN (SELECT tick_id FROM ticks)") == []
    assert site.rows("SELECT tick_id FROM tick_snapshots WHERE tick_id NOT IN (SELECT tick_id FROM ticks)") == []


def api_controller(site: Site, backend: Any) -> Controller:
    """What ``build_controller`` makes from the default config, around ``backend``."""
    estimator = Estimator(CostModel(get_gpu_type("A100-80GB")), 8)
    return Controller(backend, get_policy("pipeswift"), estimator, Store.from_url(str(site.db)))


# ------------------------------------------------------------------ resize, then start at the new size
def test_tick_resizes_pending_psbatch_job_which_starts_at_new_size(
        site: Site, slurm: SubprocessRunner, blocker: int, cancel_later: list[int],
        wait_state: Callable[..., dict[str, str]], job_fields: Callable[..., dict[str, str]]) -> None:
    script = site.dir / "train.sh"
    script.write_text("#!/bin/bash\n#SBATCH -N1\n#SBATCH --gpus-per-node=1\n#SBATCH -o /dev/null\n"
                      "#PSWIFT gpus=1-8\nsleep 120\npython pretrain_gpt.py %s\n" % " ".join(MEGATRON))
    out = subprocess.run([sys.executable, "-m", "pipeswift_slurm.submit.psbatch", "--parsable", str(script)],
                         env=site.env, capture_output=True, text=True, timeout=60, check=True, cwd=site.dir)
    job_id = int(out.stdout.strip().split(";")[0])
    cancel_later.append(job_id)
    before = job_fields(job_id)
    assert before["JobState"] == "PENDING" and before["Comment"].startswith(token.PROFILE_PREFIX)
    assert (before["NumNodes"], before["TresPerNode"]) in (("1-1", "gres:gpu:1"), ("1-1", "gres/gpu:1"))

    site.tick_ok()
    row = decision_row(site, job_id)
    assert row["applied"] == 1 and row["error"] is None and row["gpus"] > 1, dict(row)
    after = job_fields(job_id)
    config, _at = token.decode_decision(after["AdminComment"])
    assert config.short() == row["config"]
    assert (config.num_nodes, config.gpus_per_node, config.pp, config.micro_batch_size) == (
        row["num_nodes"], row["gpus_per_node"], row["pp"], row["micro_batch_size"])
    assert after["NumNodes"] == "%d-%d" % (row["num_nodes"], row["num_nodes"])
    wanted = gpus_per_node_tres(row["gpus_per_node"])  # 22.05, 24.11
    assert after["TresPerNode"] in wanted
    assert site_factors(slurm)[job_id] == row["site_factor"] > 0

    slurm(["scancel", str(blocker)])
    running = wait_state(job_id, "RUNNING", 40)
    assert running["NumNodes"] == str(row["num_nodes"])
    detail = slurm(["scontrol", "-d", "-o", "show", "job", str(job_id)])
    per_node = re.findall(r"\bGRES=gpu:(\d+)\(IDX:[^)]*\)", detail)
    assert per_node == [str(row["gpus_per_node"])] * row["num_nodes"], detail


def test_first_look_psbatch_job_waits_for_the_tick_that_sizes_and_starts_it(
        site: Site, slurm: SubprocessRunner, cancel_later: list[int],
        wait_state: Callable[..., dict[str, str]], job_fields: Callable[..., dict[str, str]]) -> None:
    """psbatch gives an opted-in job a begin time a minute ahead (the first look), so Slurm
    does not start it on idle GPUs at its own size before the controller saw it. The tick
    plans it, resizes it and clears the begin time (StartTime=now): it runs at once, at the
    controller's size. A job whose user asked for a begin time keeps it."""
    deadline = time.monotonic() + 60  # earlier tests' jobs may still be ending: the GPUs must be free
    while slurm(["squeue", "-h", "-t", "RUNNING,COMPLETING,CONFIGURING"]).strip() and time.monotonic() < deadline:
        time.sleep(0.5)
    script = site.dir / "look.sh"
    script.write_text("#!/bin/bash\n#SBATCH -N1\n#SBATCH --gpus-per-node=1\n#SBATCH -o /dev/null\n"
                      "#PSWIFT gpus=1-8\nsleep 120\npython pretrain_gpt.py %s\n" % " ".join(MEGATRON))
    ids = []
    for extra in ([], ["--begin=now+600"]):
        out = subprocess.run([sys.executable, "-m", "pipeswift_slurm.submit.psbatch", "--parsable", *extra,
                              str(script)], env=site.env, capture_output=True, text=True, timeout=60, check=True,
                             cwd=site.dir)
        ids.append(int(out.stdout.strip().split(";")[0]))
    cancel_later.extend(ids)
    job_id, scheduled = ids
    before = job_fields(job_id)
    assert (before["JobState"], before["Reason"]) == ("PENDING", "BeginTime"), before
    waits_s = (datetime.fromisoformat(before["EligibleTime"]) - datetime.fromisoformat(before["SubmitTime"])).seconds
    assert 59 <= waits_s <= 61 and token.decode_profile(before["Comment"]).first_look
    assert not token.decode_profile(job_fields(scheduled)["Comment"]).first_look

    site.tick_ok()
    row = decision_row(site, job_id)
    assert row["applied"] == 1 and row["error"] is None and row["gpus"] > 1, dict(row)
    running = wait_state(job_id, "RUNNING", 20)  # long before its begin time
    assert running["NumNodes"] == str(row["num_nodes"])
    assert site.rows("SELECT job_id FROM decisions WHERE job_id = ?", scheduled) == []
    still = job_fields(scheduled)
    assert (still["JobState"], still["Reason"]) == ("PENDING", "BeginTime"), still
    # Slurm's eligible time is now the tick's StartTime=now; the history counts the first
    # look as queue time, from the submission
    site.tick_ok()
    [stored] = site.rows("SELECT submit_time, eligible_time, start_time, queue_s FROM jobs WHERE job_id = ?", job_id)
    assert stored["eligible_time"] == stored["submit_time"], dict(stored)
    assert stored["queue_s"] == stored["start_time"] - stored["submit_time"], dict(stored)


def test_a_released_jobs_wait_counts_from_before_its_hold(
        site: Site, slurm: SubprocessRunner, submit_job: Callable[..., int],
        job_fields: Callable[..., dict[str, str]]) -> None:
    """Slurm restarts a job's eligible time when an admin's (or the controller's) hold on
    it is released: the history keeps the time it was eligible before the hold, and a hold
    its user asked for is not queue time. A job an admin held before the controller first
    saw it counts from its submission too."""
    blocker = submit_job("-N4", "--exclusive", "--gpus-per-node=8", "-J", "blocker")
    ours, users, first = (submit_job("-N1", "--gpus-per-node=1", "-J", name)
                          for name in ("admin-held", "user-held", "held-unseen"))
    time.sleep(1.2)  # a hold in its submission's second leaves the eligible time shown; later, none
    slurm(["scontrol", "hold", str(first)])
    assert job_fields(first)["EligibleTime"] == "Unknown", job_fields(first)
    site.tick_ok()
    slurm(["scontrol", "hold", str(ours)])
    slurm(["scontrol", "uhold", str(users)])
    site.tick_ok()
    time.sleep(1.2)  # Slurm's times are whole seconds
    slurm(["scontrol", "release", str(ours), str(users), str(first)])
    site.tick_ok()  # the view may show no eligible time yet: Slurm sets it at its next pass
    deadline = time.monotonic() + 30
    while "Unknown" in (job_fields(ours)["EligibleTime"], job_fields(users)["EligibleTime"],
                        job_fields(first)["EligibleTime"]):
        assert time.monotonic() < deadline, (job_fields(ours), job_fields(users), job_fields(first))
        time.sleep(0.3)
    site.tick_ok()
    for job_id in (ours, users, first):
        fields = job_fields(job_id)
        assert fields["Reason"] not in ("JobHeldAdmin", "JobHeldUser"), fields
        assert fields["EligibleTime"] > fields["SubmitTime"], fields
    stored = {r["job_id"]: r for r in site.rows(
        "SELECT job_id, submit_time, eligible_time FROM jobs WHERE job_id IN (?, ?, ?)", ours, users, first)}
    assert stored[ours]["eligible_time"] == stored[ours]["submit_time"], dict(stored[ours])
    assert stored[first]["eligible_time"] == stored[first]["submit_time"], dict(stored[first])
    assert stored[users]["eligible_time"] > stored[users]["submit_time"], dict(stored[users])
    slurm(["scancel", str(blocker), str(ours), str(users), str(first)])


# ------------------------------------------------------------------ never touch what is not ours
def test_tick_never_modifies_unmanaged_or_running_jobs(
        site: Site, slurm: SubprocessRunner, submit_job: Callable[..., int],
        wait_state: Callable[..., dict[str, str]]) -> None:
    ours_running = opted_in(submit_job, "--exclusive", "--gpus-per-node=8")
    plain_running = submit_job("-N3", "--exclusive", "--gpus-per-node=8", "-J", "plain-running")
    wait_state(ours_running, "RUNNING", 30)
    wait_state(plain_running, "RUNNING", 30)
    plain_pending = submit_job("-N1", "--gpus-per-node=1", "-J", "plain-pending")
    plain_per_job = submit_job("--gpus=2", "--comment", "pswift-like but no token", "-J", "plain-gpus")
    plain_held = submit_job("-H", "-N2", "--gres=gpu:2", "-J", "plain-held")
    ours_pending = opted_in(submit_job)
    untouched = [ours_running, plain_running, plain_pending, plain_per_job, plain_held]
    before = {j: stable_fields(slurm, j) for j in untouched}

    site.tick_ok()
    assert decision_row(site, ours_pending)["applied"] == 1  # the tick did act, on its own job
    after = {j: stable_fields(slurm, j) for j in untouched}
    for job_id in untouched:
        changed = {k: (before[job_id].get(k), after[job_id].get(k))
                   for k in before[job_id].keys() | after[job_id].keys()
                   if before[job_id].get(k) != after[job_id].get(k)}
        assert changed == {}, "job %d changed: %s" % (job_id, changed)
    factors = site_factors(slurm)
    assert factors.get(plain_pending, 0) == 0 and factors.get(plain_per_job, 0) == 0
    assert site.rows("SELECT job_id FROM decisions WHERE job_id IN (%s)" % ",".join(map(str, untouched))) == []


# ------------------------------------------------------------------ preemption (opt-in), for real
def test_preempting_tick_requeues_a_long_checkpointing_job_for_short_ones(
        site: Site, slurm: SubprocessRunner, submit_job: Callable[..., int],
        wait_state: Callable[..., dict[str, str]], job_fields: Callable[..., dict[str, str]]) -> None:
    """pipeswift with ``preempt`` on and requeue allowed: a long opted-in job that saves and
    loads checkpoints holds every GPU; two short opted-in jobs wait. One tick requeues the
    long job in Slurm (Restarts=1, pending again) and the short ones start in its place.
    A long job without checkpoints would never be requeued (unit-tested)."""
    site.config.write_text(
        '[store]\nurl = "%s"\n[slurm]\nbackend = "cli"\n[policy]\nname = "pipeswift"\n'
        '[policy.knobs]\npreempt = true\npreempt_min_run_s = 0\n'
        '[controller]\nlock_file = "%s"\nallow_requeue = true\ndry_run = false\n' % (site.db, site.lock))
    nodes = int(slurm(["sinfo", "-h", "-o", "%D"]).split()[0])
    args = list(MEGATRON)
    args[args.index("--global-batch-size") + 1] = str(4 * 8 * nodes * 2)
    args[args.index("--train-iters") + 1] = "1000000"
    args += ["--save", "-", "--load", "-", "--save-interval", "100"]
    long_token = token.encode_profile(token.ProfileRequest(tuple(args)))
    long_job = submit_job("-N%d" % nodes, "--exclusive", "--gpus-per-node=8", "--requeue", "-J", "long",
                          "--comment", long_token)
    wait_state(long_job, "RUNNING", 30)
    shorts = [opted_in(submit_job, "-J", "short") for _ in range(2)]

    site.tick_ok()
    row = decision_row(site, long_job)
    assert row["requeue"] == 1 and row["applied"] == 1 and row["error"] is None, dict(row)
    assert row["reason"].startswith("requeued for 2 shorter jobs")
    for job_id in shorts:
        wait_state(job_id, "RUNNING", 60)
    fields = job_fields(long_job)
    assert fields["JobState"] == "PENDING" and fields["Restarts"] == "1", fields
    # Slurm forgets its run time at the requeue; the next tick keeps it in the history
    # (from its start to the tick that saw it pending), for the policy's next decisions.
    [before] = site.rows("SELECT start_time, gpus, submit_time, eligible_time FROM jobs WHERE job_id = ?", long_job)
    site.tick_ok()
    [after] = site.rows("SELECT ran_s, attained_gpu_s, restarts, state FROM jobs WHERE job_id = ?", long_job)
    assert after["restarts"] == 1 and after["state"] == "PENDING"
    assert 0 < after["ran_s"] <= time.time() - before["start_time"] + 1
    assert after["attained_gpu_s"] == after["ran_s"] * before["gpus"]
    # Slurm also restarted its submit time; the policy is told the first one back, so its
    # wait since its first submission, less its run, keeps counting toward the bound
    seen: list[ClusterView] = []

    class Spy:
        name = "spy"

        def decide(self, view: ClusterView, profiles: object, estimator: object) -> list[Decision]:
            seen.append(view)
            return []

    backend = SlurmCliBackend(run=slurm)
    live = backend.snapshot().job(long_job)
    assert live is not None and live.submit_time > before["submit_time"]
    Controller(backend, Spy(), Estimator(CostModel(get_gpu_type("A100-80GB")), 8), Store.from_url(str(site.db))).tick()
    told = seen[0].job(long_job)
    assert told is not None and (told.submit_time, told.ran_s) == (before["submit_time"], after["ran_s"])
    assert told.eligible_time == before["eligible_time"]
    assert told.queued_s(seen[0].now) == pytest.approx(
        seen[0].now - before["eligible_time"] - after["ran_s"], abs=0.01)


def test_reshaping_tick_grows_a_running_checkpointing_job_onto_idle_gpus(
        site: Site, slurm: SubprocessRunner, submit_job: Callable[..., int],
        wait_state: Callable[..., dict[str, str]], job_fields: Callable[..., dict[str, str]]) -> None:
    """pipeswift with ``reshape_running`` on and requeue allowed, nothing pending: a running
    flexible job (4-16 GPUs) that checkpoints, on 4 GPUs of one node, is requeued in Slurm
    into the bigger shape the tick chose, which fits on the idle GPUs now (Restarts=1, its
    new size and decision token set), and it runs again at that size."""
    site.config.write_text(
        '[store]\nurl = "%s"\n[slurm]\nbackend = "cli"\n[policy]\nname = "pipeswift"\n'
        '[policy.knobs]\nreshape_running = true\n'
        '[controller]\nlock_file = "%s"\nallow_requeue = true\ndry_run = false\n' % (site.db, site.lock))
    args = list(MEGATRON)
    args[args.index("--train-iters") + 1] = "1000000"
    args += ["--save", "-", "--load", "-", "--save-interval", "100"]
    grow = token.encode_profile(token.ProfileRequest(tuple(args), gpus=(4, 16)))
    deadline = time.monotonic() + 60  # earlier tests' jobs may still be ending: the GPUs must stay free
    while slurm(["squeue", "-h", "-t", "RUNNING,COMPLETING,CONFIGURING"]).strip() and time.monotonic() < deadline:
        time.sleep(0.5)
    job_id = submit_job("-N1", "--gpus-per-node=4", "--requeue", "-J", "grow", "--comment", grow)
    wait_state(job_id, "RUNNING", 30)

    site.tick_ok()
    row = decision_row(site, job_id)
    assert row["requeue"] == 1 and row["applied"] == 1 and row["error"] is None, dict(row)
    assert row["reason"].startswith("reshape to %d GPUs" % row["gpus"]) and 4 < row["gpus"] <= 16
    after = job_fields(job_id)
    assert after["Restarts"] == "1", after
    config, _at = token.decode_decision(after["AdminComment"])
    assert config.short() == row["config"]
    wanted = gpus_per_node_tres(row["gpus_per_node"])  # 22.05, 24.11
    assert after["TresPerNode"] in wanted
    # (NumNodes still shows the old allocation's count until the job runs again.) Slurm
    # makes a requeued job wait two minutes before it is eligible again. Skipping that with
    # StartTime=now made the restarted job fail now and then (its first run still ending on
    # the node), so the test waits.
    running = wait_state(job_id, "RUNNING", 240)
    assert running["NumNodes"] == str(row["num_nodes"]) and running["Restarts"] == "1"
    assert running["TresPerNode"] in wanted
    detail = slurm(["scontrol", "-d", "-o", "show", "job", str(job_id)])
    assert re.search(r"\bJOB_GRES=gpu:%d\b" % row["gpus"], detail), detail


# ------------------------------------------------------------------ a job leaves between observe and act
class CancelAfterSnapshot:
    """The real CLI backend, but ``victim`` is cancelled (real scancel) right after the
    snapshot that still shows it pending."""

    name = "cli"

    def __init__(self, inner: SlurmCliBackend, slurm: SubprocessRunner, victim: int) -> None:
        self.inner, self.slurm, self.victim = inner, slurm, victim

    def snapshot(self) -> ClusterView:
        view = self.inner.snapshot()
        job = view.job(self.victim)
        assert job is not None and job.pending
        self.slurm(["scancel", str(self.victim)])
        deadline = time.monotonic() + 15
        while "JobState=CANCELLED" not in self.slurm(["scontrol", "-o", "show", "job", str(self.victim)]):
            assert time.monotonic() < deadline, "scancel did not take"
            time.sleep(0.2)
        return view

    def apply(self, decision: Decision, job: Job) -> None:
        self.inner.apply(decision, job)

    def apply_many(self, items: list[tuple[Decision, Job]]) -> list[Any]:
        return self.inner.apply_many(items)


def test_job_gone_between_observe_and_act_is_skipped(
        site: Site, slurm: SubprocessRunner, blocker: int, submit_job: Callable[..., int],
        caplog: pytest.LogCaptureFixture) -> None:
    victim = opted_in(submit_job)
    survivor = opted_in(submit_job)
    backend = CancelAfterSnapshot(SlurmCliBackend(run=slurm), slurm, victim)
    with caplog.at_level(logging.INFO, logger="pipeswift_slurm.slurm.controller"):
        report = api_controller(site, backend).tick()
    assert report.failed is None and report.errors == []
    skipped = dict(report.skipped)
    assert victim in skipped and "gone" in skipped[victim], report.skipped
    assert victim not in report.applied and survivor in report.applied
    assert any("job %d skipped" % victim in r.getMessage() for r in caplog.records)
    row = decision_row(site, victim)
    assert row["applied"] is None and row["error"] is None
    assert site.rows("SELECT status FROM ticks")[0]["status"] == "ok"


# ------------------------------------------------------------------ overlapping and killed ticks
def test_tick_while_another_holds_the_lock_exits_0_with_one_warning(site: Site, blocker: int,
                                                         submit_job: Callable[..., int]) -> None:
    opted_in(submit_job)
    site.tick_ok()
    n_ticks, n_decisions = site.count("ticks"), site.count("decisions")
    fd = os.open(site.lock, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        done = site.tick()
    finally:
        os.close(fd)
    # exit 0 for cron, but not silent: a stuck tick must show (issue 28 item 13)
    lines = done.stderr.strip().splitlines()
    assert (done.returncode, done.stdout, len(lines)) == (0, "", 1), done.stderr
    assert "WARNING" in lines[0] and "another controller tick is running" in lines[0]
    assert (site.count("ticks"), site.count("decisions")) == (n_ticks, n_decisions)


def test_two_ticks_started_together_one_acts(site: Site, blocker: int, submit_job: Callable[..., int]) -> None:
    opted_in(submit_job)
    env = site.fake_scontrol("sleep 2")  # every tick takes > 2 s, so the two overlap
    procs = [subprocess.Popen(site.argv(), env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for _ in range(2)]
    outs = [p.communicate(timeout=TICK_TIMEOUT_S) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs
    kinds = sorted("another controller tick is running" in err for _, err in outs)
    assert kinds == [False, True], outs  # one acted (its summary), the other said why it did not
    assert site.count("ticks") == 1
    assert_consistent(site)


def _kill_when(proc: subprocess.Popen[str], marker: Path, timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while not marker.exists():
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, "tick never reached the marker"
        time.sleep(0.05)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(timeout=10)


_KILL_IN_STORE = """
import os, signal, sys
from pipeswift_slurm.store import history as store
from pipeswift_slurm.slurm.backends.slurm_cli import SlurmCliBackend
sys.path.insert(0, {testdir!r})
from test_controller import Site, api_controller
from pathlib import Path

def die(self, *args, **kwargs):
    Path({marker!r}).touch()
    os.kill(os.getpid(), signal.SIGKILL)  # inside the tick's transaction, rows written

store.TickTx.finish = die
api_controller(Site(Path({dir!r}), dict(os.environ), {db_url!r}), SlurmCliBackend()).tick()
"""


def test_killed_ticks_leave_no_half_recorded_tick(site: Site, blocker: int,
                                                  submit_job: Callable[..., int]) -> None:
    """A tick killed while acting left its intents (written before Slurm was changed); one
    killed inside its store transaction left nothing; one killed with -9 right after Slurm
    applied its batch (before the database heard of it) is settled by the next tick, and
    the history shows the change (issue 23: nothing lost)."""
    job_id = opted_in(submit_job)
    site.tick_ok()
    slurm = SubprocessRunner(env=site.env)
    # killed while acting: the batched scontrol hangs (nothing applied)
    marker = site.dir / "acting"
    env = site.fake_scontrol('[ $# -eq 0 ] && { touch %s; sleep 60; }' % marker)
    slurm(["scontrol", "update", "JobId=%d" % job_id, "SiteFactor=0"])  # something to do again
    proc = subprocess.Popen(site.argv(), env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    _kill_when(proc, marker)
    ticks = site.rows("SELECT tick_id, status FROM ticks ORDER BY tick_id")
    assert [t["status"] for t in ticks] == ["ok", "acting"]
    unapplied = ticks[1]["tick_id"]  # ids need not be consecutive (a PostgreSQL sequence skips)
    # killed inside the store transaction, after the tick's rows were written: nothing kept
    marker = site.dir / "recording"
    code = _KILL_IN_STORE.format(testdir=str(Path(__file__).parent), marker=str(marker), dir=str(site.dir),
                                 db_url=site.db if isinstance(site.db, str) else None)
    proc = subprocess.Popen([sys.executable, "-c", code], env=site.env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    _kill_when(proc, marker)
    assert site.count("ticks") == 2
    # killed with -9 right after the real scontrol applied the batch
    real = shutil.which("scontrol", path=site.env.get("PATH"))
    marker = site.dir / "applied"
    env = site.fake_scontrol('[ $# -eq 0 ] && { %s; touch %s; kill -9 $PPID; exit 0; }' % (real, marker))
    proc = subprocess.Popen(site.argv(), env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    proc.communicate(timeout=TICK_TIMEOUT_S)
    assert proc.returncode == -signal.SIGKILL and marker.exists()
    killed = site.rows("SELECT tick_id, status FROM ticks ORDER BY tick_id DESC LIMIT 1")[0]
    assert killed["status"] == "acting"
    factor = site_factors(slurm).get(job_id)
    assert factor, "the killed tick's batch set the job's SiteFactor"
    site.tick_ok()  # settles both killed ticks from what Slurm shows
    assert_consistent(site)
    rows = {r["tick_id"]: r for r in site.rows("SELECT * FROM decisions WHERE job_id = ?", job_id)}
    assert rows[killed["tick_id"]]["applied"] == 1 and rows[killed["tick_id"]]["site_factor"] == factor
    assert site.rows("SELECT status FROM ticks WHERE tick_id = ?", killed["tick_id"])[0][0] == "interrupted"
    assert rows[unapplied]["applied"] == 0  # killed before its batch ran: Slurm shows it was not applied


# ------------------------------------------------------------------ history: queue and run seconds
def test_history_rows_carry_slurms_queue_and_run_seconds(
        site: Site, submit_job: Callable[..., int], wait_state: Callable[..., dict[str, str]]) -> None:
    job_id = opted_in(submit_job, wrap="sleep 3")
    fields = wait_state(job_id, "COMPLETED", 40)
    site.tick_ok()
    row = site.rows("SELECT * FROM jobs WHERE job_id = ?", job_id)[0]
    submit, start, end = (epoch(fields[k]) for k in ("SubmitTime", "StartTime", "EndTime"))
    assert row["state"] == "COMPLETED" and row["opted_in"] == 1
    assert abs(row["start_time"] - start) <= 1 and abs(row["end_time"] - end) <= 1
    assert abs(row["queue_s"] - (start - submit)) <= 1
    assert abs(row["run_s"] - (end - start)) <= 1 and row["run_s"] >= 2


# ------------------------------------------------------------------ idempotency
def test_second_tick_with_nothing_new_issues_no_update(site: Site, blocker: int,
                                                       submit_job: Callable[..., int]) -> None:
    jobs = [opted_in(submit_job) for _ in range(3)]
    site.tick_ok()
    assert {r["job_id"] for r in site.rows("SELECT job_id FROM decisions WHERE applied")} == set(jobs)
    calls = site.dir / "scontrol-calls"
    env = site.fake_scontrol('echo "[$*]" >> %s' % calls)
    done = site.tick(env)
    assert done.returncode == 0, done.stderr
    second = site.rows("SELECT * FROM ticks ORDER BY tick_id DESC LIMIT 1")[0]
    assert (second["status"], second["n_decisions"], second["n_applied"]) == ("ok", 0, 0)
    assert site.rows("SELECT id FROM decisions WHERE tick_id = ?", second["tick_id"]) == []
    lines = calls.read_text().splitlines()
    assert lines and all(line.startswith("[-") and "update" not in line for line in lines), lines


# ------------------------------------------------------------------ slurmctld stopped (keep last)
def _ctld_pidfile(env: dict[str, str]) -> Path:
    conf = Path(env["SLURM_CONF"]).read_text()
    match = re.search(r"(?m)^SlurmctldPidFile=(\S+)", conf)
    assert match, "no SlurmctldPidFile in slurm.conf"
    return Path(match.group(1))


def test_slurmctld_stopped_tick_fails_with_one_line_and_is_recorded_as_failed(
        site: Site, slurm: SubprocessRunner, submit_job: Callable[..., int]) -> None:
    opted_in(submit_job)
    site.tick_ok()
    counts = {t: site.count(t) for t in ("jobs", "ticks", "decisions", "state_transitions", "profiles")}
    pidfile = _ctld_pidfile(site.env)
    pid = int(pidfile.read_text())
    os.kill(pid, signal.SIGTERM)
    try:
        deadline = time.monotonic() + 30
        while Path("/proc/%d" % pid).exists():
            assert time.monotonic() < deadline, "slurmctld did not stop"
            time.sleep(0.1)
        done = site.tick()
        assert done.returncode == 1
        lines = done.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("pipeswift: error: slurm:"), done.stderr
        assert "slurmctld is not answering" in lines[0] and "DOWN" in lines[0], lines[0]
        # Nothing about the jobs changes; the failed tick itself is recorded, so the metrics
        # (pipeswift_last_tick_ok, the failed-tick counter) see it (issue 28 item 8).
        assert {t: site.count(t) for t in counts} == dict(counts, ticks=counts["ticks"] + 1)
        last = site.rows("SELECT status, error FROM ticks ORDER BY tick_id DESC LIMIT 1")[0]
        assert last["status"] == "failed" and "slurmctld is not answering" in last["error"], dict(last)
    finally:
        subprocess.run(["/usr/sbin/slurmctld", "-f", site.env["SLURM_CONF"]], env=site.env, check=True, timeout=30)
        deadline = time.monotonic() + 30
        while subprocess.run(["squeue", "-h"], env=site.env, capture_output=True, timeout=15).returncode != 0:
            assert time.monotonic() < deadline, "slurmctld did not come back"
            time.sleep(0.3)
