"""Mixed GPU partitions in the backends (issue 26 item 3): Slurm's text for a job pending in
several partitions, typed GRES per partition, the partition filter, a move
(``Decision.partition``) as one ``scontrol update`` with the resize (sent again when Slurm
24.11 refuses it at random), a typed GPU request never moved to another GPU type, and the
GRES check of ``slurm.partition_check``. The
recorded files are live output of ``tests/data/slurm/record.sh partitions`` (a cluster with
``GPU_PARTITIONS="a100:2 h100:2:4"``); the argvs asserted here are the ones record.sh ran
there. No Slurm needed."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from pipeswift_slurm.core import token
from pipeswift_slurm.core.model import ClusterView, Decision, ExecConfig, GpuRequest, Job, Node
from pipeswift_slurm.slurm.backends import BackendError, JobGone
from pipeswift_slurm.slurm.backends import slurm_cli as cli
from pipeswift_slurm.slurm.backends.pyslurm_ import PyslurmBackend
from pipeswift_slurm.slurm.backends.scontrol_argv import apply_argvs, check_move
from pipeswift_slurm.policy.partitions import partition_gres_types
from pipeswift_slurm.slurm.partition_check import gres_mismatches, gres_type_matches

sys.path.insert(0, str(Path(__file__).resolve().parent))
from fake_pyslurm import fake_job, fake_node, make_fake  # noqa: E402
from test_slurm_cli import FakeFeed, FakeRunner, read  # noqa: E402

NOW = 1_800_000_000.0
PROFILE = token.PROFILE_PREFIX + "args=W10="
CFG = ExecConfig(tp=1, pp=2, dp=2, micro_batch_size=1, num_micro_batches=8, num_nodes=2, gpus_per_node=2)
VERSIONS = ["22.05", "24.11"]


def recorded(version: str, moved: bool = False) -> FakeRunner:
    return FakeRunner({tuple(cli.SQUEUE_JSON_ARGV): read("squeue-%s-partitions%s.json"
                                                         % (version, "-moved" if moved else "")),
                       tuple(cli.NODES_ARGV): read("scontrol-nodes-%s-partitions.txt" % version)})


def backend(run: FakeRunner, **kw: object) -> cli.SlurmCliBackend:
    return cli.SlurmCliBackend(run=run, clock=lambda: NOW, read_site_factors=False, read_limits=False,
                               **kw)  # type: ignore[arg-type]


def opted(job: Job) -> Job:
    """A recorded job as if psbatch had opted it in (record.sh submits plain jobs)."""
    from dataclasses import replace

    return replace(job, opted_in=True, comment=PROFILE)


# ------------------------------------------------------------------ reading (recorded live)
@pytest.mark.parametrize("version", VERSIONS)
def test_a_job_pending_in_several_partitions_keeps_slurms_text(version: str) -> None:
    view = backend(recorded(version)).snapshot()
    jobs = {j.name: j for j in view.jobs}
    assert (jobs["multi"].partition, jobs["typed"].partition, jobs["blocker"].partition) == \
        ("a100,h100", "a100", "a100")
    assert jobs["typed"].gpu_request.gpu_type == "a100" and jobs["multi"].gpu_request.gpu_type is None
    moved = {j.name: j for j in backend(recorded(version, moved=True)).snapshot().jobs}
    assert {name: moved[name].partition for name in ("multi", "typed", "untyped")} == \
        {"multi": "h100", "typed": "a100", "untyped": "h100"}
    assert (moved["multi"].num_nodes, moved["multi"].gpu_request.count) == (2, 4)
    assert (moved["untyped"].num_nodes, moved["untyped"].gpus) == (2, 8)


@pytest.mark.parametrize("version", VERSIONS)
def test_typed_gres_gives_each_nodes_gpu_type(version: str) -> None:
    nodes = backend(recorded(version)).snapshot().nodes
    assert [(n.name, n.gpu_type, n.gpus, n.partitions) for n in nodes] == [
        ("node1", "a100", 8, ("a100",)), ("node2", "a100", 8, ("a100",)),
        ("node3", "h100", 4, ("h100",)), ("node4", "h100", 4, ("h100",))]
    assert partition_gres_types(nodes) == {"a100": "a100", "h100": "h100"}
    (node,) = cli.parse_scontrol_nodes("NodeName=g1 Gres=gpu:h100:4(S:0-1) GresUsed=gpu:h100:1(IDX:0) "
                                       "State=MIXED Partitions=h100,all")
    assert (node.gpu_type, node.gpus, node.gpus_alloc, node.partitions) == ("h100", 4, 1, ("h100", "all"))


@pytest.mark.parametrize("version", VERSIONS)
def test_partition_filter_keeps_a_job_pending_in_any_managed_partition(version: str) -> None:
    view = backend(recorded(version), partitions=["h100"]).snapshot()
    assert [j.name for j in view.jobs] == ["multi"] and [n.name for n in view.nodes] == ["node3", "node4"]
    view = backend(recorded(version), partitions=["a100", "other"]).snapshot()
    assert {j.name for j in view.jobs} == {"blocker", "multi", "typed", "untyped"}
    assert cli.in_partitions("a,b".split(","), frozenset({"b"})) and not cli.in_partitions(("a",), frozenset({"b"}))
    assert cli.in_partitions(("a",), None)


# ------------------------------------------------------------------ moving (the argvs record.sh ran live)
@pytest.mark.parametrize("version", VERSIONS)
def test_a_move_is_one_update_with_the_resize_and_a_typed_request_stays_on_its_type(version: str) -> None:
    run = recorded(version)
    cli_backend = backend(run)
    jobs = {j.name: opted(j) for j in cli_backend.snapshot().jobs}
    run.calls.clear()
    cfg = ExecConfig(tp=1, pp=2, dp=4, micro_batch_size=1, num_micro_batches=8, num_nodes=2, gpus_per_node=4)
    cli_backend.apply(Decision(jobs["multi"].job_id, partition="h100", config=cfg), jobs["multi"])
    with pytest.raises(BackendError, match="asks for gpu:a100 GPUs and partition h100's nodes report h100"):
        cli_backend.apply(Decision(jobs["typed"].job_id, partition="h100"), jobs["typed"])
    cli_backend.apply(Decision(jobs["typed"].job_id, partition="a100", site_factor=2), jobs["typed"])
    slash = "gres/" if jobs["multi"].gpu_request.slash else "gres:"
    assert [c[:6] for c in run.calls] == [
        ["scontrol", "update", "JobId=%d" % jobs["multi"].job_id, "Partition=h100", "NumNodes=2-2",
         "TresPerNode=%sgpu:4" % slash],
        ["scontrol", "update", "JobId=%d" % jobs["typed"].job_id, "Partition=a100", "SiteFactor=2"]]
    assert run.calls[0][6].startswith("AdminComment=" + token.DECISION_PREFIX)
    # a move alone of an untyped job is the partition only; of a running job, refused
    assert cli.update_argv(Decision(jobs["untyped"].job_id, partition="h100"), jobs["untyped"], NOW) == \
        ["scontrol", "update", "JobId=%d" % jobs["untyped"].job_id, "Partition=h100"]
    with pytest.raises(JobGone, match="not moved"):
        cli_backend.apply(Decision(1, partition="h100"), jobs["blocker"])


def test_a_typed_request_moves_only_to_its_gpu_type() -> None:
    typed = Job(job_id=3, state="PENDING", submit_time=0.0, gpu_request=GpuRequest(count=2, gpu_type="a100"))
    plain = Job(job_id=4, state="PENDING", submit_time=0.0, gpu_request=GpuRequest(count=2))
    types = {"a100": "a100", "a100-big": "a100", "h100": "h100"}
    check_move(Decision(3, partition="a100-big"), typed, types)
    check_move(Decision(3, site_factor=1), typed, {})
    check_move(Decision(4, partition="mixed"), plain, {})
    with pytest.raises(BackendError, match="job 3 asks for gpu:a100 GPUs and partition mixed's nodes report no one"):
        check_move(Decision(3, partition="mixed"), typed, types)


@pytest.mark.parametrize("name", ["a b", "a,b", "", "x" * 65, "h100\n"])
def test_a_move_to_an_odd_partition_name_is_refused(name: str) -> None:
    job = Job(job_id=6, state="PENDING", submit_time=0.0, opted_in=True, gpu_request=GpuRequest(count=1))
    with pytest.raises(BackendError, match="job 6"):
        cli.update_argv(Decision(6, partition=name), job, NOW)


def test_a_move_goes_through_hold_and_release_and_the_batch() -> None:
    job = Job(job_id=7, state="PENDING", submit_time=0.0, opted_in=True, gpu_request=GpuRequest(count=1),
              state_reason="JobHeldAdmin", admin_comment=token.encode_decision(CFG, 1, held=True))
    argvs = apply_argvs(Decision(7, partition="h100", hold=False, time_limit_s=600), job, NOW)
    assert argvs[0] == ["scontrol", "update", "JobId=7", "Partition=h100", "TimeLimit=10"]
    assert argvs[1] == ["scontrol", "release", "7"]
    held = apply_argvs(Decision(7, partition="h100", config=CFG, hold=True), job, NOW)
    assert held[0][3:6] == ["Partition=h100", "NumNodes=2-2", "TresPerNode=gres:gpu:2"] and held[0][-1] == "Priority=0"
    feed = FakeFeed()
    pending = Job(job_id=8, state="PENDING", submit_time=0.0, opted_in=True, gpu_request=GpuRequest(count=1))
    running = Job(job_id=9, state="RUNNING", submit_time=0.0, opted_in=True, gpu_request=GpuRequest(count=1))
    out = cli.SlurmCliBackend(run=FakeRunner({}), clock=lambda: NOW, feed=feed).apply_many(
        [(Decision(8, partition="h100", site_factor=3), pending), (Decision(9, partition="h100"), running)])
    assert out[0] is None and isinstance(out[1], JobGone)
    assert feed.inputs == [["update JobId=8 Partition=h100 SiteFactor=3"]]


def test_pyslurm_backend_moves_in_its_scontrol_update() -> None:
    mod = make_fake([fake_job(2, comment=PROFILE, partition="a100,h100", gres_per_node={"gpu": 1}),
                     fake_job(3, comment=PROFILE, partition="a100", gres_per_node={"gpu:a100": 1})],
                    [fake_node("node1", gpu_key="gpu:a100", partitions=["a100"]),
                     fake_node("node3", gpus=4, gpu_key="gpu:h100", partitions=["h100"])])
    run = FakeRunner({})
    ps = PyslurmBackend(module=mod, run=run, clock=lambda: NOW, partitions=["h100"], read_site_factors=False,
                        read_limits=False)
    (job,) = ps.snapshot().jobs  # job 3 is in a100 only
    assert job.partition == "a100,h100" and [n.name for n in ps.snapshot().nodes] == ["node3"]
    ps.apply(Decision(2, partition="h100", site_factor=4), job)
    assert run.calls == [["scontrol", "update", "JobId=2", "Partition=h100"]]
    assert mod.calls[-1] == "modify 2 [('site_factor', 4)]"
    typed = PyslurmBackend(module=mod, run=run, read_site_factors=False, read_limits=False)
    job3 = next(j for j in typed.snapshot().jobs if j.job_id == 3)
    with pytest.raises(BackendError, match="not moved"):
        typed.apply(Decision(3, partition="h100"), job3)
    assert len(run.calls) == 1


# ------------------------------------------------------------------ the GRES check
def view_of(*nodes: Node) -> ClusterView:
    return ClusterView(now=NOW, nodes=nodes, jobs=())


def test_gres_type_matching_normalises_and_takes_a_prefix() -> None:
    assert gres_type_matches("h100", "H100-80GB") and gres_type_matches("H100_80gb", "H100-80GB")
    assert gres_type_matches("", "A100-80GB")  # untyped: cannot be checked
    assert not gres_type_matches("a100", "H100-80GB") and not gres_type_matches("h100x", "H100-80GB")


def test_gres_mismatches_names_partition_node_and_both_types() -> None:
    nodes = (Node("node1", 8, gpu_type="a100", partitions=("a100",)),
             Node("node3", 4, gpu_type="h100", partitions=("h100",)),
             Node("node4", 4, gpu_type="h100", partitions=("h100",)))
    assert gres_mismatches(view_of(*nodes), {"a100": "A100-80GB", "h100": "H100-80GB"}) == {}
    found = gres_mismatches(view_of(*nodes), (("a100", "A100-80GB"), ("h100", "A100-80GB"), ("l40", "L40S")))
    assert sorted(found) == ["h100", "l40"]
    assert all(w in found["h100"] for w in ("partition h100", "node node3", "type h100", "A100-80GB")), found
    assert "partition l40 has no nodes" in found["l40"] and "L40S" in found["l40"]


def test_gres_mismatches_skips_unusable_and_untyped_nodes() -> None:
    nodes = (Node("node1", 8, gpu_type="a100", partitions=("h100",), state="DOWN+DRAIN"),
             Node("node2", 8, partitions=("h100",)), Node("node3", 0, partitions=("h100",)))
    assert gres_mismatches(view_of(*nodes), {"h100": "H100-80GB"}) == {}
    drained_only = (Node("node1", 8, gpu_type="a100", partitions=("h100",), state="DRAIN"),)
    assert gres_mismatches(view_of(*drained_only), {"h100": "H100-80GB"}) == {}
    assert "node node9" in gres_mismatches(view_of(Node("node9", 8, gpu_type="a100", partitions=("h100",))),
                                           {"h100": "H100-80GB"})["h100"]


# ------------------------------------------------------ Slurm 24.11's random EAGAIN (and EINTR) on a move
EAGAIN = "Resource temporarily unavailable"
EINTR = "Interrupted system call"


class RefusingFeed(FakeFeed):
    """A feed whose scontrol refuses each job's update ``refusals[job_id]`` times with
    ``why``: on a line naming the job, or (``naming_job`` false) on a line naming none."""

    def __init__(self, refusals: dict[int, int], why: str = EAGAIN, naming_job: bool = True) -> None:
        super().__init__()
        self.refusals, self.why, self.naming_job = dict(refusals), why, naming_job

    def __call__(self, argv: list[str], stdin_text: str) -> cli.CommandResult:
        self.inputs.append(stdin_text.splitlines())
        stderr = []
        for line in stdin_text.splitlines():
            job_id = int(line.split()[1].removeprefix("JobId="))
            if self.refusals.get(job_id, 0) > 0:
                self.refusals[job_id] -= 1
                stderr.append("%s for job %d" % (self.why, job_id) if self.naming_job
                              else "slurm_update error: %s" % self.why)
        return cli.CommandResult(1 if stderr else 0, "", "\n".join(stderr))


@pytest.mark.parametrize("why", [EAGAIN, EINTR], ids=["eagain", "eintr"])
def test_a_move_slurm_refuses_for_now_is_sent_again(why: str) -> None:
    jobs = [Job(job_id=j, state="PENDING", submit_time=0.0, opted_in=True, gpu_request=GpuRequest(count=1))
            for j in (1, 2, 3)]
    feed = RefusingFeed({1: 2, 3: cli.TRANSIENT_TRIES}, why)
    out = cli.SlurmCliBackend(run=FakeRunner({}), clock=lambda: NOW, feed=feed, batch_processes=1).apply_many(
        [(Decision(j.job_id, partition="h100"), j) for j in jobs])
    assert [len(lines) for lines in feed.inputs] == [3] + [2] * 2 + [1] * (cli.TRANSIENT_TRIES - 3)
    assert out[0] is None and out[1] is None
    assert isinstance(out[2], BackendError) and not isinstance(out[2], JobGone) and why in str(out[2])

    alone = RefusingFeed({1: 2}, why, naming_job=False)  # one job's refusal on a line naming no job
    out = cli.SlurmCliBackend(run=FakeRunner({}), clock=lambda: NOW, feed=alone, batch_processes=1).apply_many(
        [(Decision(1, partition="h100"), jobs[0])])
    assert out == [None] and len(alone.inputs) == 3
    lost = RefusingFeed({1: cli.TRANSIENT_TRIES}, why, naming_job=False)
    out = cli.SlurmCliBackend(run=FakeRunner({}), clock=lambda: NOW, feed=lost, batch_processes=1).apply_many(
        [(Decision(1, partition="h100"), jobs[0])])
    assert len(lost.inputs) == cli.TRANSIENT_TRIES and isinstance(out[0], BackendError) and why in str(out[0])

    calls: list[list[str]] = []

    def refusing_twice(argv: list[str]) -> str:
        calls.append(argv)
        if len(calls) <= 2:
            raise BackendError("scontrol update failed (exit 1): %s for job 1" % why)
        return ""

    cli.SlurmCliBackend(run=refusing_twice, clock=lambda: NOW).apply(Decision(1, partition="h100"), jobs[0])
    assert len(calls) == 3 and calls[0] == calls[2]
    with pytest.raises(BackendError, match="Invalid partition"):
        cli.run_update(FakeRunner({("scontrol", "update"): BackendError("Invalid partition name specified")}),
                       ["scontrol", "update", "JobId=1", "Partition=x"])
