"""PyslurmBackend live (pyslurm 24.11.0 on Slurm 24.11: the Debian 13 leg of
tests/slurm/other-debian.sh builds it from ../shared/vendor), against SlurmCliBackend on the
same cluster state: every Job and Node field of both snapshots, and the Slurm state (read
back by ``scontrol``/``sprio``) after the same Decisions were applied to twin jobs, one
twin through each backend.

pyslurm runs in a child process (this file run as a script): ``import pyslurm`` reads its
slurm.conf once and exits the interpreter without one, and a crash in it must not take
pytest down. The module brings up its own cluster, 3 nodes x 4 typed GPUs (``a100``), on
ports PIPESWIFT_TBP_CTLD_PORT (6971) and PIPESWIFT_TBP_SLURMD_PORT_BASE (17601).
Differences found and the fallbacks used: docs/slurm-backends.md.
"""

from __future__ import annotations

import dataclasses
import importlib.metadata
import importlib.util
import logging
import os
import pickle
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Iterator

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
from pipeswift_slurm.core import token  # noqa: E402
from pipeswift_slurm.core.model import Decision, ExecConfig, Job  # noqa: E402
from pipeswift_slurm.slurm.backends.detect import major_minor  # noqa: E402
from pipeswift_slurm.slurm.backends.pyslurm_ import PyslurmBackend  # noqa: E402
from pipeswift_slurm.slurm.backends.slurm_cli import SlurmCliBackend, SubprocessRunner  # noqa: E402
from pipeswift_slurm.slurm.backends.slurm_parse import parse_kv_line, parse_sprio  # noqa: E402

pytestmark = pytest.mark.slurm
TESTBED = ROOT / "tests" / "slurm" / "testbed.sh"
NOW = 1_800_000_000.0  # both backends stamp their decision tokens with this
PROFILE = token.PROFILE_PREFIX + "args=W10="
CFG = ExecConfig(tp=1, pp=4, dp=1, micro_batch_size=1, num_micro_batches=8, num_nodes=2, gpus_per_node=2)
# scontrol fields an update can change, compared between the twins
SHOWN = ("JobState", "Reason", "Priority", "NumNodes", "TimeLimit", "TresPerNode", "TresPerJob", "AdminComment")


# ------------------------------------------------------------------ the child: pyslurm in its own process
def _child(op: str) -> None:
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(name)s: %(message)s")
    backend = PyslurmBackend(run=SubprocessRunner(timeout_s=30), clock=lambda: NOW)
    if op == "snapshot":
        out: Any = backend.snapshot()
    else:
        decision, job = pickle.load(sys.stdin.buffer)
        out = backend.apply(decision, job)
    sys.stdout.buffer.write(pickle.dumps(out))


def in_child(env: dict[str, str], op: str, payload: Any = None) -> tuple[Any, str]:
    """Run ``op`` (snapshot | apply) through PyslurmBackend in a child; (result, its log)."""
    proc = subprocess.run([sys.executable, __file__, op], input=pickle.dumps(payload), capture_output=True,
                          env=dict(env, PYTHONPATH=str(ROOT)), timeout=120, check=False)
    log = proc.stderr.decode(errors="replace")
    assert proc.returncode == 0, "pyslurm child %s exited %d: %s" % (op, proc.returncode, log[-2000:])
    return pickle.loads(proc.stdout), log


# ------------------------------------------------------------------ the cluster
def _skip_reason(env: dict[str, str]) -> str:
    if importlib.util.find_spec("pyslurm") is None:
        return ("pyslurm is not installed (tests/slurm/other-debian.sh builds 24.11.0 from "
                "../shared/vendor/pyslurm-24.11.0.tar.gz in its Debian 13 chroot)")
    if not shutil.which("scontrol"):
        return "no Slurm client (scontrol) on PATH"
    have = importlib.metadata.version("pyslurm")
    running = subprocess.run(["scontrol", "-V"], capture_output=True, text=True, env=env, check=False).stdout
    if major_minor(have) != major_minor(running):
        return "pyslurm %s does not match %s" % (have, running.strip() or "this Slurm")
    return ""


@pytest.fixture(scope="module")
def env() -> Iterator[dict[str, str]]:
    why = _skip_reason(dict(os.environ))
    if why:
        pytest.skip(why)
    sys.path.insert(0, str(ROOT / "tests" / "slurm"))
    from testbed_env import cluster_env

    folder = tempfile.mkdtemp(prefix="pstbp-", dir="/tmp")
    tb = dict(os.environ, SLURM_TESTBED_DIR=folder, NODES="3", GPUS="4", GPU_TYPE="a100", FRESH="1",
              CTLD_PORT=os.environ.get("PIPESWIFT_TBP_CTLD_PORT", "6971"),
              SLURMD_PORT_BASE=os.environ.get("PIPESWIFT_TBP_SLURMD_PORT_BASE", "17601"))
    tb.pop("SLURM_CONF", None)
    up = subprocess.run(["bash", str(TESTBED), "up"], env=tb, capture_output=True, text=True, timeout=180)
    try:
        assert up.returncode == 0, "test cluster did not come up: %s" % (up.stderr or up.stdout)[-500:]
        yield cluster_env(tb)
    finally:
        subprocess.run(["bash", str(TESTBED), "down"], env=tb, capture_output=True, timeout=120)
        shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture
def slurm(env: dict[str, str]) -> Iterator[SubprocessRunner]:
    run = SubprocessRunner(timeout_s=30, env=env)
    yield run
    subprocess.run(["scancel", "--full", "--user=root"], env=env, capture_output=True, timeout=30)
    for _ in range(50):
        if not run(["squeue", "-h", "-o", "%i"]).strip():
            break
        time.sleep(0.2)


def sbatch(slurm: SubprocessRunner, *args: str) -> int:
    out = slurm(["sbatch", "--parsable", "-o", "/dev/null", "-D", "/tmp", *args, "--wrap", "sleep 300"])
    return int(out.strip().split(";")[0])


def shown(slurm: SubprocessRunner, job_id: int) -> dict[str, str]:
    """The SHOWN fields; a Reason other than a hold reads "waiting" (of two twins pending
    behind one blocker, Slurm says Resources for the first and Priority for the second)."""
    kv = parse_kv_line(slurm(["scontrol", "-o", "show", "job", str(job_id)]).splitlines()[0])
    got = {k: kv.get(k, "") for k in SHOWN}
    got["Reason"] = got["Reason"] if got["Reason"].startswith("JobHeld") else "waiting"
    return got


def wait_running(slurm: SubprocessRunner, ids: list[int]) -> None:
    for _ in range(150):
        if all(shown(slurm, i)["JobState"] == "RUNNING" for i in ids):
            return
        time.sleep(0.2)
    raise AssertionError("jobs %s did not start" % ids)


def as_fields(obj: Any) -> dict[str, Any]:
    return {f.name: getattr(obj, f.name) for f in dataclasses.fields(obj)}


# ------------------------------------------------------------------ reads
def settled_snapshots(env: dict[str, str], slurm: SubprocessRunner) -> tuple[Any, Any, str]:
    """A CLI snapshot, a pyslurm one, and the CLI again: retried until Slurm changed nothing
    in between (the scheduler sets a pending job's Reason on its own schedule)."""
    for _ in range(20):
        cli = SlurmCliBackend(run=slurm, clock=lambda: NOW).snapshot()
        ps, log = in_child(env, "snapshot")
        again = SlurmCliBackend(run=slurm, clock=lambda: NOW).snapshot()
        if (again.jobs, again.nodes) == (cli.jobs, cli.nodes):
            return cli, ps, log
        time.sleep(0.5)
    raise AssertionError("the cluster never held still for three snapshots")


def test_snapshots_agree_field_by_field(env: dict[str, str], slurm: SubprocessRunner) -> None:
    running = [sbatch(slurm, "-N1", "--gres=gpu:a100:2", "--comment=" + PROFILE),   # typed, per node
               sbatch(slurm, "-N2", "--gpus=3", "-t", "30")]                          # per job, untyped
    wait_running(slurm, running)
    later = "--begin=now+1hour"
    pending = [sbatch(slurm, "-N1", "--gpus-per-node=2", later, "--comment=" + PROFILE),
               sbatch(slurm, "-N2", "--gres=gpu:a100:1", later, "-t", "90", "--comment=" + PROFILE),
               sbatch(slurm, "-N1", "--gpus=2", later),
               sbatch(slurm, "-H", "-N1", "--gpus-per-node=1", "--comment=" + PROFILE),      # user hold
               sbatch(slurm, "-N1", later, "-J", "no-gpus"),
               sbatch(slurm, "-N1", "--gpus-per-node=1", "--array=1-3", "-H")]                # array meta
    slurm(["scontrol", "update", "JobId=%d" % pending[0], "SiteFactor=250"])  # (sprio lists no BeginTime job)
    slurm(["scontrol", "hold", str(pending[1])])                                             # admin hold
    slurm(["scontrol", "update", "JobId=%d" % pending[2],
           "AdminComment=" + token.encode_decision(CFG, int(NOW))])
    cli, ps, log = settled_snapshots(env, slurm)
    assert "sprio" in log and "older job()/node() API" in log  # the fallbacks are said
    cli_jobs, ps_jobs = {j.job_id: j for j in cli.jobs}, {j.job_id: j for j in ps.jobs}
    assert set(cli_jobs) == set(ps_jobs) and set(running + pending) <= set(cli_jobs)
    diffs = ["job %d %s: cli %r, pyslurm %r" % (i, k, v, as_fields(ps_jobs[i])[k])
             for i in sorted(cli_jobs) for k, v in as_fields(cli_jobs[i]).items() if as_fields(ps_jobs[i])[k] != v]
    cli_nodes, ps_nodes = {n.name: n for n in cli.nodes}, {n.name: n for n in ps.nodes}
    assert set(cli_nodes) == set(ps_nodes) == {"node1", "node2", "node3"}
    diffs += ["node %s %s: cli %r, pyslurm %r" % (n, k, v, as_fields(ps_nodes[n])[k])
              for n in sorted(cli_nodes) for k, v in as_fields(cli_nodes[n]).items()
              if as_fields(ps_nodes[n])[k] != v]
    assert diffs == []
    # the snapshot saw what was set up (so the agreement is not vacuous)
    assert cli_jobs[running[1]].gpus == 3 and cli_jobs[running[1]].gpu_request.field == "tres_per_job"
    assert cli_jobs[running[0]].gpu_request.gpu_type == "a100" and cli_jobs[pending[1]].state_reason == "JobHeldAdmin"
    assert cli_jobs[pending[2]].config == CFG and cli.total_gpus - cli.free_gpus == 5


# ------------------------------------------------------------------ updates, on twins
def twins(slurm: SubprocessRunner, *args: str) -> tuple[int, int]:
    return sbatch(slurm, *args, "--comment=" + PROFILE), sbatch(slurm, *args, "--comment=" + PROFILE)


def job_of(slurm: SubprocessRunner, job_id: int) -> Job:
    view = SlurmCliBackend(run=slurm, clock=lambda: NOW, read_limits=False).snapshot()
    return next(j for j in view.jobs if j.job_id == job_id)


def apply_both(env: dict[str, str], slurm: SubprocessRunner, pair: tuple[int, int],
               decision: Decision) -> str:
    """The decision through the CLI backend on the first twin, pyslurm on the second."""
    SlurmCliBackend(run=slurm, clock=lambda: NOW).apply(dataclasses.replace(decision, job_id=pair[0]),
                                                        job_of(slurm, pair[0]))
    _, log = in_child(env, "apply", (dataclasses.replace(decision, job_id=pair[1]), job_of(slurm, pair[1])))
    return log


def site_factors(slurm: SubprocessRunner) -> dict[int, int]:
    return parse_sprio(slurm(["sprio", "-h", "-o", "%i|%Y|%S"]))


@pytest.mark.parametrize("gres", ["--gres=gpu:a100:1", "--gpus-per-node=1", "--gpus=1"])
def test_updates_leave_the_same_state(env: dict[str, str], slurm: SubprocessRunner, gres: str) -> None:
    """Resize + SiteFactor + TimeLimit + token; hold; release (with and without a config)."""
    blocker = sbatch(slurm, "-N3", "--exclusive")  # the twins pend behind it, never start
    wait_running(slurm, [blocker])
    resize, hold, release, release_only = (twins(slurm, "-N1", gres) for _ in range(4))
    log = apply_both(env, slurm, resize, Decision(0, config=CFG, site_factor=500, time_limit_s=1799))
    assert "resizing with scontrol update" in log
    for pair in (hold, release, release_only):
        apply_both(env, slurm, pair, Decision(0, config=CFG, hold=True))
    apply_both(env, slurm, release, Decision(0, config=CFG, hold=False, site_factor=300))
    apply_both(env, slurm, release_only, Decision(0, hold=False))
    pairs = (resize, hold, release, release_only)
    # A job just released shows in sprio only after the next scheduling pass, and the twins
    # of a pair may straddle one: read until each pair is listed alike (both or neither).
    deadline = time.monotonic() + 20
    factors = site_factors(slurm)
    while any((p[0] in factors) != (p[1] in factors) for p in pairs) and time.monotonic() < deadline:
        time.sleep(0.5)
        factors = site_factors(slurm)
    for pair in pairs:
        assert shown(slurm, pair[0]) == shown(slurm, pair[1]), pair
        assert factors.get(pair[0], 0) == factors.get(pair[1], 0), pair
    a = shown(slurm, resize[0])
    assert a["NumNodes"] == "2-2" and a["TimeLimit"] == "00:30:00" and factors[resize[0]] == 500
    assert a["AdminComment"] == token.encode_decision(CFG, int(NOW), asked_gpus=1)  # the twins asked 1 GPU
    assert shown(slurm, hold[0])["Reason"] == "JobHeldAdmin" and shown(slurm, release[0])["Reason"] != "JobHeldAdmin"
    # (a job just released is not in sprio until the next scheduling pass: its priority shows the factor)
    assert int(shown(slurm, release[0])["Priority"]) - int(shown(slurm, release_only[0])["Priority"]) == 300


if __name__ == "__main__":
    _child(sys.argv[1])
