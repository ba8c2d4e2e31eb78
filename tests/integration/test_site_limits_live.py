"""The site's limits hold on live Slurm with accounting (issue 23): on a cluster of 2 x 8
GPUs with slurmdbd that this module brings up itself, and a QOS with
``MaxTRESPerJob=gres/gpu=8`` and ``MaxWall=02:00:00``, cron ticks never push a job of that
QOS past 8 GPUs nor its TimeLimit past 2 hours, while the same jobs under a QOS without
those limits are pushed past both (so the setup does reach the limits).

Slurm exempts an admin's updates from QOS limits: without the controller's own checks
``scontrol update`` accepts both. Ports: PIPESWIFT_TBL_CTLD_PORT (6951),
PIPESWIFT_TBL_SLURMD_PORT_BASE (17501), PIPESWIFT_TBL_DBD_PORT (6959)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Iterator

import pytest

from pipeswift_slurm.core import token
from pipeswift_slurm.core.model import Job
from pipeswift_slurm.slurm.backends.slurm_cli import SQUEUE_JSON_ARGV, SubprocessRunner
from pipeswift_slurm.slurm.backends.slurm_parse import parse_squeue_json
from test_controller import MEGATRON, Site  # noqa: E402 (same folder)

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "slurm"))
from testbed_env import NoAccounting, dbd_cluster  # noqa: E402  (tests/slurm/testbed_env.py)

pytestmark = pytest.mark.slurm
QOS = "pslimit8"
ACCOUNT = "pslimits"
MAX_GPUS, MAX_WALL_S = 8, 2 * 3600


def profile(gpus: tuple[int, int]) -> str:
    return token.encode_profile(token.ProfileRequest(tuple(MEGATRON), gpus=gpus))


@pytest.fixture(scope="module")
def dbd_env() -> Iterator[dict[str, str]]:
    """A 2 x 8-GPU cluster with MariaDB + slurmdbd, the QOS and an account for root."""
    try:
        with dbd_cluster("pstbl-", os.environ.get("PIPESWIFT_TBL_CTLD_PORT", "6951"),
                         os.environ.get("PIPESWIFT_TBL_SLURMD_PORT_BASE", "17501"),
                         os.environ.get("PIPESWIFT_TBL_DBD_PORT", "6959")) as ready:
            for argv in (["add", "qos", QOS], ["modify", "qos", "where", "name=" + QOS, "set",
                                               "MaxTRESPerJob=gres/gpu=%d" % MAX_GPUS, "MaxWall=02:00:00"],
                         ["add", "account", ACCOUNT], ["add", "user", "root", "account=" + ACCOUNT,
                                                       "qos=normal," + QOS]):
                subprocess.run(["sacctmgr", "-i", *argv], env=ready, capture_output=True, text=True, timeout=60)
            shown = subprocess.run(["sacctmgr", "-nP", "show", "qos", QOS, "format=MaxWall,MaxTRES"], env=ready,
                                   capture_output=True, text=True, timeout=60).stdout.strip()
            assert shown == "02:00:00|gres/gpu=%d" % MAX_GPUS, shown
            yield ready
    except NoAccounting as exc:
        pytest.skip(str(exc))


@pytest.fixture
def slurm(dbd_env: dict[str, str]) -> Iterator[SubprocessRunner]:
    run = SubprocessRunner(timeout_s=30, env=dbd_env)
    yield run
    subprocess.run(["scancel", "-u", "root"], env=dbd_env, capture_output=True, timeout=30)
    deadline = time.monotonic() + 30
    while any(j.state in ("RUNNING", "PENDING", "COMPLETING") for j in jobs(run).values()) \
            and time.monotonic() < deadline:
        time.sleep(0.3)


def jobs(slurm: SubprocessRunner) -> dict[int, Job]:
    return {j.job_id: j for j in parse_squeue_json(slurm(list(SQUEUE_JSON_ARGV)))}


def submit(slurm: SubprocessRunner, *args: str) -> int:
    out = slurm(["sbatch", "--parsable", "-o", "/dev/null", "-D", "/tmp", *args, "--wrap", "sleep 600"])
    return int(out.strip().split(";")[0])


def running(slurm: SubprocessRunner, *job_ids: int) -> None:
    deadline = time.monotonic() + 30
    while not all(jobs(slurm)[j].state == "RUNNING" for j in job_ids):
        assert time.monotonic() < deadline, {j: jobs(slurm)[j].state for j in job_ids}
        time.sleep(0.3)


def tick(site: Site) -> None:
    done = site.tick()
    assert done.returncode == 0, done.stderr
    assert "profile request ignored" not in done.stderr, done.stderr


def test_jobs_of_the_qos_are_never_given_more_than_its_gpus(tmp_path: Path, dbd_env: dict[str, str],
                                                            slurm: SubprocessRunner) -> None:
    """Both nodes busy; two pending 4-GPU jobs allowing 1-16 GPUs, one in the QOS: the
    tick widens the other to 16, the QOS's job to 8 at most, on this tick and the next.
    Every lent GPU is allowed (``lend_efficiency`` 0): the caps are what is tested."""
    site = Site(tmp_path, dbd_env)
    site.config.write_text(site.config.read_text() + '[policy]\nname = "pipeswift"\n[policy.knobs]\nlend_efficiency = 0.0\n')
    running(slurm, submit(slurm, "-N2", "--exclusive", "--gpus-per-node=8", "-t", "10"))
    capped = submit(slurm, "-N1", "--gpus-per-node=4", "--account", ACCOUNT, "--qos", QOS,
                    "--comment", profile((1, 16)))
    free = submit(slurm, "-N1", "--gpus-per-node=4", "--account", ACCOUNT, "--qos", "normal",
                  "--comment", profile((1, 16)))
    assert slurm(["squeue", "-h", "-o", "%q %a", "-j", str(capped)]).split() == [QOS, ACCOUNT]
    for _ in range(2):
        tick(site)
        now = jobs(slurm)
        assert now[free].gpus > MAX_GPUS, "the control job was not widened past the QOS limit: the test proves nothing"
        assert now[capped].gpus <= MAX_GPUS, now[capped]


def test_jobs_of_the_qos_never_get_a_time_limit_past_its_max_wall(tmp_path: Path, dbd_env: dict[str, str],
                                                                  slurm: SubprocessRunner) -> None:
    """4 GPUs free on one node; an 8-GPU job allowing 1-8 GPUs with a 1:50 limit: shrunk to
    start now, its limit is scaled past 2 hours (the control job, QOS normal); the QOS's job
    is never given a limit past 2 hours (nor more GPUs than 8)."""
    site = Site(tmp_path, dbd_env)
    running(slurm, submit(slurm, "-N1", "-w", "node2", "--gpus-per-node=8", "-t", "10"),
            submit(slurm, "-N1", "-w", "node1", "--gpus-per-node=4", "-t", "10"))
    capped = submit(slurm, "-N1", "--gpus-per-node=8", "-t", "01:50:00", "--account", ACCOUNT, "--qos", QOS,
                    "--comment", profile((1, 8)))
    for _ in range(2):
        tick(site)
        job = jobs(slurm)[capped]
        assert job.time_limit_s is not None and job.time_limit_s <= MAX_WALL_S, job
        assert job.gpus <= MAX_GPUS, job
    slurm(["scancel", str(capped)])
    control = submit(slurm, "-N1", "--gpus-per-node=8", "-t", "01:50:00", "--account", ACCOUNT, "--qos", "normal",
                     "--comment", profile((1, 8)))
    tick(site)
    job = jobs(slurm)[control]
    assert job.time_limit_s is not None and job.time_limit_s > MAX_WALL_S, \
        "the control job's limit was not raised past 2 h: the test proves nothing (%s)" % job
