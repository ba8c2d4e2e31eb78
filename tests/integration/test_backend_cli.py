"""SlurmCliBackend against the real test cluster (tests/slurm/testbed.sh up): snapshot of
pending jobs, resize + SiteFactor + AdminComment on pending jobs, start at the new size,
JobGone for finished jobs, BackendError when slurmctld does not answer."""

from __future__ import annotations

import re
import socket
import time
from pathlib import Path
from typing import Callable

import pytest

from pipeswift_slurm.core import token
from pipeswift_slurm.slurm.backends import BackendError, JobGone
from pipeswift_slurm.slurm.backends.slurm_cli import SlurmCliBackend, SubprocessRunner
from pipeswift_slurm.core.model import Decision, ExecConfig, GpuRequest, Job

pytestmark = pytest.mark.slurm

PROFILE = token.PROFILE_PREFIX + "args=W10=;gpus=1-8"
CFG_2X2 = ExecConfig(tp=1, pp=4, dp=1, micro_batch_size=1, num_micro_batches=8, num_nodes=2, gpus_per_node=2)


def job_of(backend: SlurmCliBackend, job_id: int) -> Job:
    job = backend.snapshot().job(job_id)
    assert job is not None, "job %d not in snapshot" % job_id
    return job


def test_snapshot_sees_pending_jobs(slurm: SubprocessRunner, blocker: int,
                                    submit_job: Callable[..., int]) -> None:
    per_node = submit_job("-N1", "--gpus-per-node=1", "--comment", PROFILE)
    per_job = submit_job("--gpus=3")
    held = submit_job("-H", "-N2", "--gres=gpu:2")
    view = SlurmCliBackend(run=slurm).snapshot()
    jobs = {j.job_id: j for j in view.jobs}
    assert jobs[blocker].running and jobs[blocker].gpus == 8 * len(view.nodes)
    assert view.free_gpus == 0 and all(n.gpus == 8 for n in view.nodes)
    assert jobs[per_node].pending and jobs[per_node].opted_in and jobs[per_node].gpus == 1
    assert jobs[per_node].gpu_request.field == "tres_per_node"
    assert not jobs[per_job].opted_in and jobs[per_job].gpus == 3
    assert jobs[per_job].gpu_request.field == "tres_per_job"
    assert jobs[held].held and jobs[held].num_nodes == 2 and jobs[held].gpus == 4


def test_apply_resizes_pending_jobs_which_start_at_new_size(
        slurm: SubprocessRunner, blocker: int, submit_job: Callable[..., int],
        wait_state: Callable[..., dict[str, str]], job_fields: Callable[..., dict[str, str]]) -> None:
    per_node = submit_job("-N1", "--gpus-per-node=1", "--comment", PROFILE)
    per_job = submit_job("--gpus=1", "--comment", PROFILE)
    backend = SlurmCliBackend(run=slurm)
    for job_id in (per_node, per_job):
        before = job_of(backend, job_id)
        backend.apply(Decision(job_id, config=CFG_2X2, site_factor=3000), before)
        after = job_of(backend, job_id)
        assert (after.num_nodes, after.gpus, after.site_factor) == (2, 4, 3000)
        assert after.config == CFG_2X2 and after.admin_comment.startswith(token.DECISION_PREFIX)
        assert 3000 <= after.priority - before.priority <= 3010  # age may add a point
        assert after.gpu_request.field == before.gpu_request.field
    assert job_fields(per_job)["TresPerJob"] in ("gres:gpu:4", "gres/gpu:4")  # 22.05 / 24.11 spelling
    slurm(["scancel", str(blocker)])
    for job_id in (per_node, per_job):
        fields = wait_state(job_id, "RUNNING", 40)
        assert fields["NumNodes"] == "2"
    detail = " ".join(job_fields(per_node, detail=True).values())
    assert re.findall(r"GRES=gpu:(\d+)", detail) == ["2"] or "gpu:2(IDX" in detail
    assert job_fields(per_job, detail=True).get("JOB_GRES") == "gpu:4"


def test_site_factor_on_held_job(slurm: SubprocessRunner, blocker: int,
                                 submit_job: Callable[..., int]) -> None:
    held = submit_job("-H", "-N1", "--gpus-per-node=1", "--comment", PROFILE)
    plain = submit_job("-N1", "--gpus-per-node=1")
    backend = SlurmCliBackend(run=slurm)
    backend.apply(Decision(held, site_factor=777, time_limit_s=20 * 60), job_of(backend, held))
    slurm(["scontrol", "release", str(held)])
    # sprio lists a released job only after the scheduler's next pass (Reason None -> Priority)
    deadline = time.monotonic() + 15
    while True:
        view = backend.snapshot()
        job, ref = view.job(held), view.job(plain)
        assert job is not None and ref is not None
        if job.site_factor or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert job.site_factor == 777 and job.time_limit_s == 1200
    assert 770 <= job.priority - ref.priority <= 790


def test_finished_or_unknown_job_is_gone(slurm: SubprocessRunner, submit_job: Callable[..., int],
                                         wait_state: Callable[..., dict[str, str]]) -> None:
    done = submit_job("-N1", "--comment", PROFILE, wrap="true")
    wait_state(done, "COMPLETED", 30)
    backend = SlurmCliBackend(run=slurm)
    stale = Job(job_id=done, state="PENDING", submit_time=0.0, opted_in=True, gpu_request=GpuRequest(count=1))
    with pytest.raises(JobGone):
        backend.apply(Decision(done, config=CFG_2X2), stale)
    with pytest.raises(JobGone):
        backend.apply(Decision(done, site_factor=5), stale)
    with pytest.raises(JobGone):
        backend.apply(Decision(987654321, site_factor=5), Job(987654321, "PENDING", 0.0, opted_in=True))


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_unreachable_controller_is_backend_error(slurm_env: dict[str, str], tmp_path: Path) -> None:
    # a copy of the config pointing at a port nobody listens on: the shared cluster stays up
    conf = Path(slurm_env["SLURM_CONF"]).read_text()
    conf = re.sub(r"(?m)^SlurmctldPort=.*$", "SlurmctldPort=%d" % _free_port(), conf)
    conf = re.sub(r"(?m)^MessageTimeout=.*$", "", conf) + "\nMessageTimeout=2\n"
    (tmp_path / "slurm.conf").write_text(conf)
    env = dict(slurm_env, SLURM_CONF=str(tmp_path / "slurm.conf"))
    backend = SlurmCliBackend(run=SubprocessRunner(timeout_s=30, env=env))
    with pytest.raises(BackendError) as info:
        backend.snapshot()
    assert not isinstance(info.value, JobGone)
    with pytest.raises(BackendError) as info:
        backend.apply(Decision(1, site_factor=1), Job(1, "PENDING", 0.0, opted_in=True))
    assert not isinstance(info.value, JobGone)
