"""PyslurmBackend against a fake module that follows pyslurm 25.11's documented API."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from pipeswift_slurm.core import token
from pipeswift_slurm.slurm.backends import BackendError, JobGone
from pipeswift_slurm.slurm.backends.pyslurm_ import PyslurmBackend, gres_dict_request, gres_text, modify_kwargs
from pipeswift_slurm.core.model import Decision, ExecConfig, GpuRequest, Job

sys.path.insert(0, str(Path(__file__).resolve().parent))
from fake_pyslurm import fail, fake_job, fake_node, make_fake  # noqa: E402

NOW = 1_800_000_000.0
CFG = ExecConfig(tp=1, pp=4, dp=1, micro_batch_size=1, num_micro_batches=8, num_nodes=2, gpus_per_node=2)
PROFILE = token.PROFILE_PREFIX + "args=W10="


class Recorder:
    def __init__(self, answers: dict[str, object] | None = None) -> None:
        self.calls: list[list[str]] = []
        self.answers = answers or {}

    def __call__(self, argv: list[str]) -> str:
        self.calls.append(argv)
        answer = self.answers.get(argv[0], "")
        if isinstance(answer, Exception):
            raise answer
        return str(answer)


def cluster() -> object:
    jobs = [
        fake_job(1, "RUNNING", num_nodes=2, gres_per_node={"gpu": 8}, allocated_nodes="node[1-2]",
                 start_time=1_700_000_100),
        fake_job(2, comment=PROFILE, gres_per_node={"gpu:a100": 1},
                 admin_comment=token.encode_decision(CFG, 1_700_000_000)),
        fake_job(3, comment=PROFILE, gres_per_node={"gres/gpu": 2}, time_limit=None),
        fake_job(4, comment=PROFILE, array_tasks_waiting="5-9", array_id=4),
        fake_job(5, "COMPLETED", end_time=1_700_000_500, start_time=1_700_000_400, partition="debug"),
    ]
    nodes = [fake_node("node1", used=8), fake_node("node2", used=8), fake_node("node3"),
             fake_node("node4", gpu_key="gpu:a100", state="DOWN+DRAIN", partitions=["debug"])]
    return make_fake(jobs, nodes)


def test_snapshot_maps_documented_attributes() -> None:
    mod, run = cluster(), Recorder({"sprio": "2|1500|500\n3|1000|0\n"})
    view = PyslurmBackend(module=mod, run=run, clock=lambda: NOW).snapshot()
    assert mod.calls == ["Jobs.load", "Nodes.load"]
    assert [c[0] for c in run.calls] == ["sprio", "scontrol", "sacctmgr", "sacctmgr"]  # site factors, limits
    jobs = {j.job_id: j for j in view.jobs}
    assert jobs[1].running and jobs[1].gpus == 16 and jobs[1].node_list == ("node1", "node2")
    assert jobs[2].opted_in and jobs[2].gpu_request == GpuRequest(count=1, gpu_type="a100")
    assert jobs[2].config == CFG and jobs[2].site_factor == 500
    assert jobs[3].gpu_request.slash and jobs[3].time_limit_s is None
    assert not jobs[4].opted_in  # array meta-record
    assert jobs[5].end_time == 1_700_000_500
    assert view.now == NOW and view.free_gpus == 8 and view.total_gpus == 24
    view = PyslurmBackend(module=mod, run=run, partitions=["debug"], read_site_factors=False).snapshot()
    assert [j.job_id for j in view.jobs] == [5] and [n.name for n in view.nodes] == ["node4"]


def test_snapshot_reads_what_the_newer_api_lacks_from_the_older_one(caplog: pytest.LogCaptureFixture) -> None:
    """A ``--gpus`` job (no ``gres_per_node``) and a node's used GPUs (``allocated_gres`` is
    empty unless GPUs are TRES) come from ``job().get()`` / ``node().get()``."""
    jobs = [fake_job(7, "RUNNING", num_nodes=2, allocated_nodes="node[1-2]", start_time=1_700_000_100),
            fake_job(8, gres_per_node={"gres/gpu:a100": 2})]
    older = {"job": {7: {"tres_per_job": "gres/gpu:3", "tres_per_node": None}, 8: {"tres_per_node": "gres/gpu:a100:2"}},
             "node": {"node1": {"gres_used": ["gpu:a100:2(IDX:0-1)"]}}}
    mod = make_fake(jobs, [fake_node("node1", gpu_key="gpu:a100"), fake_node("node2")], older)
    with caplog.at_level("INFO"):
        view = PyslurmBackend(module=mod, run=Recorder(), read_limits=False).snapshot()
    got = {j.job_id: j for j in view.jobs}
    assert got[7].gpus == 3 and got[7].gpu_request == GpuRequest(field="tres_per_job", count=3, slash=True)
    assert got[8].gpus == 2 and got[8].gpu_request == GpuRequest(count=2, gpu_type="a100", slash=True)
    assert [(n.name, n.gpus_alloc, n.gpu_type) for n in view.nodes] == [("node1", 2, "a100"), ("node2", 0, "")]
    assert mod.calls == ["job().get", "node().get", "Jobs.load", "Nodes.load"]


def test_snapshot_rpc_error_is_backend_error() -> None:
    mod = cluster()
    fail(mod, "Unable to contact slurm controller (connect failure)")
    with pytest.raises(BackendError, match="Jobs.load") as info:
        PyslurmBackend(module=mod, run=Recorder()).snapshot()
    assert not isinstance(info.value, JobGone)


def test_apply_resizes_via_scontrol_and_modifies_the_rest() -> None:
    mod, run = cluster(), Recorder()
    backend = PyslurmBackend(module=mod, run=run, clock=lambda: NOW)
    job = next(j for j in backend.snapshot().jobs if j.job_id == 2)
    mod.calls.clear()
    backend.apply(Decision(2, config=CFG, site_factor=7, time_limit_s=600), job)
    assert run.calls[-1] == ["scontrol", "update", "JobId=2", "NumNodes=2-2", "TresPerNode=gres:gpu:a100:2"]
    assert mod.calls == ["modify 2 %s" % sorted({
        "admin_comment": token.encode_decision(CFG, int(NOW), asked_gpus=1), "site_factor": 7, "time_limit": 10}.items())]
    assert job.gpus == 1 and "asked=1" in mod.calls[-1]  # the size it was submitted with: the controller reads it back


def test_apply_requeue_skip_and_errors() -> None:
    mod, run = cluster(), Recorder()
    backend = PyslurmBackend(module=mod, run=run, clock=lambda: NOW)
    running = Job(job_id=1, state="RUNNING", submit_time=0.0, opted_in=True)
    backend.apply(Decision(1, requeue=True), running)
    assert mod.calls == ["requeue 1"] and run.calls == []
    with pytest.raises(JobGone):
        backend.apply(Decision(1, config=CFG), running)
    backend.apply(Decision(9, site_factor=1), Job(job_id=9, state="PENDING", submit_time=0.0))
    assert mod.calls == ["requeue 1"]
    pending = Job(job_id=2, state="PENDING", submit_time=0.0, opted_in=True)
    fail(mod, "Job has already finished")
    with pytest.raises(JobGone):
        backend.apply(Decision(2, site_factor=1), pending)
    fail(mod, "Unable to contact slurm controller")
    with pytest.raises(BackendError) as info:
        backend.apply(Decision(2, site_factor=1), pending)
    assert not isinstance(info.value, JobGone)


def test_the_first_look_is_cleared_with_scontrol() -> None:
    """pyslurm sets a begin time only at submit: the first look's StartTime=now goes through
    scontrol, once, beside the SiteFactor through ``modify``."""
    from pipeswift_slurm.core import token

    mod, run = cluster(), Recorder()
    backend = PyslurmBackend(module=mod, run=run, clock=lambda: NOW)
    look = token.encode_profile(token.ProfileRequest(("--num-layers", "2"), first_look=True))
    waiting = Job(job_id=3, state="PENDING", submit_time=0.0, opted_in=True, comment=look, state_reason="BeginTime")
    backend.apply(Decision(3, site_factor=5), waiting)
    assert run.calls == [["scontrol", "update", "JobId=3", "StartTime=now"]]
    backend.apply(Decision(3, site_factor=6), Job(job_id=3, state="PENDING", submit_time=0.0, opted_in=True,
                                                   comment=look, state_reason="Priority", eligible_time=NOW - 5))
    assert len(run.calls) == 1


def test_helpers() -> None:
    assert gres_dict_request({"gpu": "4"}) == GpuRequest(count=4)
    assert gres_text({"gres/gpu:a100": 2, "gpu": {"count": 8, "indexes": "0-7"}}) == "gres/gpu:a100:2,gpu:8"
    assert gres_dict_request({"mps": 100}) == GpuRequest(count=0) == gres_dict_request(None)
    assert modify_kwargs(Decision(1), NOW) == {}


def test_module_is_imported_lazily() -> None:
    backend = PyslurmBackend(run=Recorder())  # constructing must not import pyslurm
    assert backend._module is None and "pyslurm" not in sys.modules
