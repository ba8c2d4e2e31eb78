"""The resize-and-launch loop on live Slurm (issue 28), through ``pipeswift controller tick``
as cron runs it: a job the controller resized keeps a valid config on every later tick and
runs with every allocated GPU busy (``pipeswift-launch --emulate``: the config it prints
covers the whole allocation), on the session's cluster of 8-GPU nodes and on a second
cluster of 4-GPU nodes that this module brings up itself (no ``gres:gpu:8`` there; a job
an earlier update left BadConstraints is repaired); held, dependent and GPU-less jobs are
never changed, and a tick with only those and unchanged jobs issues no update."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Iterator

import pytest

from pipeswift_slurm.core import token
from pipeswift_slurm.core.model import ExecConfig
from pipeswift_slurm.slurm.backends.slurm_cli import SubprocessRunner
from pipeswift_slurm.slurm.backends.slurm_parse import parse_kv_line
from test_controller import MEGATRON, PROFILE, Site, decision_row  # noqa: E402 (same folder)

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "slurm"))
from testbed_env import ClusterDown, own_cluster  # noqa: E402  (tests/slurm/testbed_env.py)

pytestmark = pytest.mark.slurm
ROOT = Path(__file__).resolve().parents[2]


def fields(slurm: SubprocessRunner, job_id: int) -> dict[str, str]:
    return parse_kv_line(slurm(["scontrol", "-o", "show", "job", str(job_id)]).splitlines()[0])


def wait_for(slurm: SubprocessRunner, job_id: int, state: str, timeout_s: float = 60.0) -> dict[str, str]:
    deadline = time.monotonic() + timeout_s
    now = fields(slurm, job_id)
    while now.get("JobState") != state:
        assert time.monotonic() < deadline, "job %d is %s/%s, not %s" % (
            job_id, now.get("JobState"), now.get("Reason"), state)
        time.sleep(0.3)
        now = fields(slurm, job_id)
    return now


def submit(slurm: SubprocessRunner, ids: list[int], *args: str, wrap: str = "sleep 300") -> int:
    out = slurm(["sbatch", "--parsable", "-o", "/dev/null", "-D", "/tmp", *args, "--wrap", wrap])
    ids.append(int(out.strip().split(";")[0]))
    return ids[-1]


def emulated_training(out: Path) -> str:
    """A job script body: the launcher, emulating, in front of a 1-process torchrun."""
    launcher = "%s -m pipeswift_slurm.submit.launcher --emulate" % sys.executable
    return ("PIPESWIFT_EMULATE_SCALE=0.0001 PYTHONPATH=%s %s -- torchrun --nproc_per_node 1 pretrain_gpt.py %s "
            "2> %s" % (os.environ.get("PYTHONPATH", str(ROOT)), launcher, " ".join(MEGATRON), out))


def tick_ok(site: Site) -> str:
    done = site.tick()
    assert done.returncode == 0, done.stderr
    assert "profile request ignored" not in done.stderr, done.stderr
    return done.stderr


def resized_job_runs_on_its_whole_allocation(site: Site, slurm: SubprocessRunner, ids: list[int],
                                             gpus_per_node: int) -> None:
    """Blocker on every node; a 1-GPU opted-in job (1-16 GPUs) that runs the emulating
    launcher; tick: resized within the nodes; tick again: nothing (its config still valid);
    blocker gone: it runs, and the launcher's config and processes fill the allocation."""
    nodes = int(slurm(["sinfo", "-h", "-o", "%D"]).split()[0])
    blocker = submit(slurm, ids, "-N%d" % nodes, "--exclusive", "--gpus-per-node=%d" % gpus_per_node)
    wait_for(slurm, blocker, "RUNNING", 30)
    out = site.dir / "launch.err"
    wide = token.encode_profile(token.ProfileRequest(tuple(MEGATRON), gpus=(1, 16)))
    job = submit(slurm, ids, "-N1", "--gpus-per-node=1", "--comment", wide, wrap=emulated_training(out))
    tick_ok(site)
    row = decision_row(site, job)
    assert row["applied"] == 1 and row["gpus_per_node"] <= gpus_per_node and row["gpus"] > 1, dict(row)
    calls = site.dir / "scontrol-calls"
    second = site.tick(site.fake_scontrol('echo "[$*]" >> %s' % calls))
    assert second.returncode == 0 and "profile request ignored" not in second.stderr, second.stderr
    assert [r["job_id"] for r in site.rows("SELECT job_id FROM decisions")] == [job]  # no second decision
    assert all("update" not in line for line in calls.read_text().splitlines())
    slurm(["scancel", str(blocker)])
    ran = wait_for(slurm, job, "COMPLETED", 120)
    text = out.read_text()
    alloc_nodes, per_node = int(ran["NumNodes"]), row["gpus_per_node"]
    assert alloc_nodes == row["num_nodes"], ran
    assert "running %dgpu=%dx%d" % (alloc_nodes * per_node, alloc_nodes, per_node) in text, text
    assert re.search(r"%d processes = %d node\(s\) x %d" % (alloc_nodes * per_node, alloc_nodes, per_node), text), text


@pytest.fixture
def ids(slurm_env: dict[str, str]) -> Iterator[list[int]]:
    submitted: list[int] = []
    yield submitted
    if submitted:
        subprocess.run(["scancel", *map(str, submitted)], env=slurm_env, capture_output=True, timeout=30)


# ------------------------------------------------------------------ the session cluster (8-GPU nodes)
def test_resized_job_keeps_a_valid_config_and_fills_its_allocation(
        tmp_path: Path, slurm_env: dict[str, str], slurm: SubprocessRunner, ids: list[int]) -> None:
    resized_job_runs_on_its_whole_allocation(Site(tmp_path, slurm_env), slurm, ids, 8)


def test_tick_with_only_held_dependent_and_unchanged_jobs_issues_no_update(
        tmp_path: Path, slurm_env: dict[str, str], slurm: SubprocessRunner, ids: list[int]) -> None:
    """Held (user), dependent (Dependency, and DependencyNeverSatisfied on a failed job) and
    GPU-less opted-in jobs get no decision and stay as submitted; a runnable one is decided
    once; the next tick issues no update and records no decision."""
    site = Site(tmp_path, slurm_env)
    failed = submit(slurm, ids, "-N1", wrap="exit 1")
    wait_for(slurm, failed, "FAILED", 30)
    nodes = int(slurm(["sinfo", "-h", "-o", "%D"]).split()[0])
    blocker = submit(slurm, ids, "-N%d" % nodes, "--exclusive", "--gpus-per-node=8")
    wait_for(slurm, blocker, "RUNNING", 30)
    held = submit(slurm, ids, "-H", "-N1", "--gpus-per-node=1", "--comment", PROFILE)
    dependent = submit(slurm, ids, "-d", "afterok:%d" % blocker, "-N1", "--gpus-per-node=1", "--comment", PROFILE)
    never = submit(slurm, ids, "-d", "afterok:%d" % failed, "-N1", "--gpus-per-node=1", "--comment", PROFILE)
    no_gpus = submit(slurm, ids, "-N1", "--comment", PROFILE)
    runnable = submit(slurm, ids, "-N1", "--gpus-per-node=1", "--comment", PROFILE)
    time.sleep(1)  # let Slurm give the dependent jobs their reasons
    untouched = [held, dependent, never, no_gpus]
    before = {j: fields(slurm, j) for j in untouched}
    assert fields(slurm, never)["Reason"] == "DependencyNeverSatisfied"
    first = site.tick()
    assert first.returncode == 0, first.stderr
    assert "job %d: profile request ignored (job left as submitted): the job asks for no GPUs" % no_gpus \
        in first.stderr, first.stderr
    assert {r["job_id"] for r in site.rows("SELECT job_id FROM decisions")} == {runnable}
    calls = site.dir / "scontrol-calls"
    done = site.tick(site.fake_scontrol('echo "[$*]" >> %s' % calls))
    assert done.returncode == 0, done.stderr
    last = site.rows("SELECT * FROM ticks ORDER BY tick_id DESC LIMIT 1")[0]
    assert (last["n_decisions"], last["n_applied"]) == (0, 0)
    lines = calls.read_text().splitlines()
    assert lines and all("update" not in line and "hold" not in line for line in lines), lines
    for job_id in untouched:
        after = fields(slurm, job_id)
        for key in ("NumNodes", "TresPerNode", "AdminComment", "JobState"):
            assert after.get(key) == before[job_id].get(key), (job_id, key, before[job_id].get(key), after.get(key))
    assert not fields(slurm, no_gpus).get("TresPerNode")


# ------------------------------------------------------------------ a second cluster: 2 nodes x 4 GPUs
@pytest.fixture(scope="module")
def four_gpu_env() -> Iterator[dict[str, str]]:
    """A cluster of 2 x 4 GPUs of this module's own (ports PIPESWIFT_TB4_CTLD_PORT, default
    6941, and PIPESWIFT_TB4_SLURMD_PORT_BASE, default 17401), taken down at the end."""
    try:
        with own_cluster("pstb4-", "a 4-GPU test cluster", NODES="2", GPUS="4",
                         CTLD_PORT=os.environ.get("PIPESWIFT_TB4_CTLD_PORT", "6941"),
                         SLURMD_PORT_BASE=os.environ.get("PIPESWIFT_TB4_SLURMD_PORT_BASE", "17401")) as env:
            yield env
    except ClusterDown as exc:
        pytest.skip(str(exc))


@pytest.fixture
def four(four_gpu_env: dict[str, str]) -> Iterator[tuple[SubprocessRunner, list[int]]]:
    slurm = SubprocessRunner(timeout_s=30, env=four_gpu_env)
    ids: list[int] = []
    yield slurm, ids
    if ids:
        subprocess.run(["scancel", *map(str, ids)], env=four_gpu_env, capture_output=True, timeout=30)


def test_on_4_gpu_nodes_a_resized_job_fits_and_fills_its_allocation(
        tmp_path: Path, four_gpu_env: dict[str, str], four: tuple[SubprocessRunner, list[int]]) -> None:
    slurm, ids = four
    resized_job_runs_on_its_whole_allocation(Site(tmp_path, four_gpu_env), slurm, ids, 4)


def test_on_4_gpu_nodes_a_job_left_bad_constraints_is_repaired(
        tmp_path: Path, four_gpu_env: dict[str, str], four: tuple[SubprocessRunner, list[int]]) -> None:
    """A job an older controller resized to 1 x 8 GPUs (Slurm accepts it; it pends with
    BadConstraints forever) is re-decided to a shape of at most 4 per node, and runs."""
    slurm, ids = four
    site = Site(tmp_path, four_gpu_env)
    blocker = submit(slurm, ids, "-N2", "--exclusive", "--gpus-per-node=4")
    wait_for(slurm, blocker, "RUNNING", 30)
    job = submit(slurm, ids, "-N1", "--gpus-per-node=1", "--comment", PROFILE)
    bad = ExecConfig(tp=1, pp=1, dp=8, micro_batch_size=4, num_micro_batches=2, num_nodes=1, gpus_per_node=8)
    slurm(["scontrol", "update", "JobId=%d" % job, "NumNodes=1-1", "TresPerNode=gres:gpu:8",
           "AdminComment=" + token.encode_decision(bad, int(time.time()))])
    tick_ok(site)
    row = decision_row(site, job)
    assert row["applied"] == 1 and row["gpus_per_node"] <= 4, dict(row)
    slurm(["scancel", str(blocker)])
    ran = wait_for(slurm, job, "RUNNING", 60)
    assert int(ran["NumNodes"]) == row["num_nodes"], ran
