"""Mixed clusters: which partition each pending job goes to, per-partition planning, the
simulated Slurm's partitions, and the simulator's mixed clusters end to end."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from pipeswift_slurm.core import hardware, megatron
from pipeswift_slurm.core.costmodel import CostModel
from pipeswift_slurm.core.estimator import Estimator
from pipeswift_slurm.core.model import ClusterView, Decision, Job, Node
from pipeswift_slurm.core.token import ProfileRequest, TokenError, decode_profile, encode_profile
from pipeswift_slurm.policy import get_policy
from pipeswift_slurm.policy.partitions import (MOVE_GAIN, choose_partitions, decide_by_partition, job_partitions,
                                               partition_views)
from pipeswift_slurm.slurm.backends.sim import SimBackend, SimJob
from pipeswift_slurm.slurm.decision_diff import unchanged_parts
from pipeswift_slurm.sim.mixed import assign_partitions, parse_partition
from pipeswift_slurm.sim.workload import ZOO, WorkloadError

HOUR = 3600.0
A100 = replace(hardware.get_gpu_type("A100-80GB"), startup_s=0.0, load_s_per_bparam=0.0)
H100 = replace(hardware.get_gpu_type("H100-80GB"), startup_s=0.0, load_s_per_bparam=0.0)


def _profile(world: int, iters: int, parts: tuple[str, ...] = ()) -> Any:
    args = ZOO["gpt-1.3b"].argv(world, 512, 1)
    args[args.index("--pipeline-model-parallel-size") + 1] = "1"
    args[args.index("--train-iters") + 1] = str(iters)
    return replace(megatron.profile_from_argv(args, world_size=world, gpus_per_node=8), partitions=parts)


def _nodes(name: str, count: int, busy: int = 0, first: int = 1) -> tuple[Node, ...]:
    return tuple(Node("%s%d" % (name, i), 8, busy, "ALLOCATED" if busy else "IDLE", name, (name,))
                 for i in range(first, first + count))


def _estimators(a: Any = A100, b: Any = H100) -> dict[str, Estimator]:
    return {"a100": Estimator(CostModel(a), 8), "h100": Estimator(CostModel(b), 8)}


def _pending(job_id: int, partition: str, gpus: int = 8, submit_s: float = 0.0, priority: int = 0) -> Job:
    return Job(job_id, "PENDING", submit_s, gpus=gpus, partition=partition, opted_in=True, priority=priority,
               time_limit_s=int(24 * HOUR))


def _busy_a100_view(*pending: Job) -> ClusterView:
    """a100: 2 nodes, both busy for about 10 h with one long job; h100: 2 idle nodes."""
    long_run = Job(90, "RUNNING", 0.0, num_nodes=2, gpus=16, partition="a100", start_time=0.0,
                   time_limit_s=int(10 * HOUR), node_list=("a1001", "a1002"))
    return ClusterView(now=60.0, nodes=_nodes("a100", 2, busy=8) + _nodes("h100", 2),
                       jobs=(long_run,) + tuple(pending))


def test_a_job_that_allows_both_goes_where_it_finishes_first_and_others_stay() -> None:
    view = _busy_a100_view(_pending(1, "a100"), _pending(2, "a100"), _pending(3, "a100,h100"))
    profiles = {1: _profile(8, 2000, ("a100", "h100")), 2: _profile(8, 2000), 3: _profile(8, 2000)}
    where = choose_partitions(view, profiles, _estimators(), moves=True)
    assert where == {1: "h100", 2: "a100", 3: "h100"}  # 2 asked for a100 only
    # a policy that keeps jobs where they were submitted: the first planned of several
    assert choose_partitions(view, profiles, _estimators(), moves=False) == {1: "a100", 2: "a100", 3: "a100"}
    assert job_partitions(view.jobs[3], profiles[3], ["a100", "h100"]) == ("a100", "h100")
    assert job_partitions(view.jobs[1], profiles[1], ["h100"]) == ("h100",)  # only planned ones


def test_a_job_that_asks_for_a_gpu_type_stays_on_that_type() -> None:
    """A job asking gpu:a100 is never planned into the h100 partition (its nodes report
    h100), though its request names both; an untyped one is."""
    from pipeswift_slurm.core.model import GpuRequest

    typed = replace(_pending(1, "a100"), gpu_request=GpuRequest("tres_per_node", 8, "a100"))
    view = _busy_a100_view(typed, _pending(2, "a100"))
    view = replace(view, nodes=tuple(replace(n, gpu_type=n.partitions[0]) for n in view.nodes))
    profiles = {1: _profile(8, 2000, ("a100", "h100")), 2: _profile(8, 2000, ("a100", "h100"))}
    assert choose_partitions(view, profiles, _estimators(), moves=True) == {1: "a100", 2: "h100"}


def test_a_move_must_gain_more_than_the_margin() -> None:
    """Two partitions of the same GPUs; partition a100 frees its node after a share of the
    job's run time T, h100 is idle: the job in a100 moves only when waiting there costs more
    than MOVE_GAIN of its time to finish."""
    same = _estimators(A100, A100)
    profile = _profile(8, 2000, ("a100", "h100"))
    run_s = same["a100"].best_run_time_s(profile, 8)[1]

    def where(busy_share: float) -> str:
        running = Job(90, "RUNNING", 0.0, gpus=8, partition="a100", start_time=0.0,
                      time_limit_s=int(busy_share * run_s), node_list=("a1001",))
        view = ClusterView(now=0.0, nodes=_nodes("a100", 1, busy=8) + _nodes("h100", 1),
                           jobs=(running, _pending(1, "a100")))
        return choose_partitions(view, {1: profile}, same, moves=True)[1]

    assert where(0.5 * MOVE_GAIN) == "a100"  # would finish (1 + 0.05) T there: not worth a move
    assert where(3 * MOVE_GAIN) == "h100"
    assert 0 < MOVE_GAIN < 0.5


def test_decide_by_partition_plans_each_partition_alone_and_marks_moves() -> None:
    view = _busy_a100_view(_pending(1, "a100"), _pending(2, "a100", submit_s=5.0))
    profiles = {1: _profile(8, 2000, ("a100", "h100")), 2: _profile(8, 2000)}
    est = _estimators()
    policy = get_policy("pipeswift")
    decisions = {d.job_id: d for d in decide_by_partition(policy, view, profiles, est)}
    assert decisions[1].partition == "h100" and "in partition h100" in decisions[1].reason
    assert decisions[2].partition is None
    views = partition_views(view, {1: "h100", 2: "a100"}, ["a100", "h100"], profiles)
    assert [n.name for n in views["h100"].nodes] == ["h1001", "h1002"]
    assert {j.job_id for j in views["h100"].jobs} == {1} and views["h100"].jobs[0].partition == "h100"
    assert {j.job_id for j in views["a100"].jobs} == {90, 2}
    # the baselines never move a job, though they are planned per partition too
    assert all(d.partition is None for d in decide_by_partition(get_policy("sjf"), view, profiles, est))
    assert not any(d.partition for d in decide_by_partition(
        get_policy("pipeswift", move_partitions=False), view, profiles, est))


def test_a_job_already_where_it_was_sent_is_not_updated_again() -> None:
    job = _pending(1, "h100")
    assert not unchanged_parts(Decision(1, partition="h100"), job).changes_anything
    assert unchanged_parts(Decision(1, partition="a100"), job).partition == "a100"


def test_profile_request_partitions_are_checked_names() -> None:
    text = encode_profile(ProfileRequest(("--x",), partitions=("a100", "h100", "a100")))
    assert decode_profile(text).partitions == ("a100", "h100")
    for bad in ("a100,", "a" * 65, "a100,h$00", ",".join("p%d" % i for i in range(17))):
        with pytest.raises(TokenError):
            decode_profile("pswift1;args=WyItLXgiXQ==;parts=" + bad)


# ------------------------------------------------------------------ the simulated Slurm's partitions

def test_sim_backend_starts_jobs_only_in_their_partitions_and_blocks_per_partition() -> None:
    be = SimBackend(0, 8, scheduler="builtin", partitions=[("a100", "A100-80GB", 1, 8), ("h100", "H100-80GB", 1, 4)])
    be.submit(SimJob(1, "big-a", "u", 0.0, "", 1, 8, 3600, partition="a100"))
    be.submit(SimJob(2, "a-blocked", "u", 1.0, "", 1, 8, 3600, partition="a100"))
    be.submit(SimJob(3, "h", "u", 2.0, "", 1, 4, 3600, partition="h100"))
    be.submit(SimJob(4, "either", "u", 3.0, "", 1, 4, 3600, partition="a100,h100"))
    # builtin stops at the first job that does not fit, but only for that job's partitions
    assert [j.job_id for j in be.schedule(10.0)] == [1, 3]
    assert be.jobs[1].placement == (0,) and be.jobs[3].placement == (1,)
    view = be.snapshot()
    assert [(n.name, n.gpus, n.gpu_type, n.partitions) for n in view.nodes] == [
        ("node1", 8, "A100-80GB", ("a100",)), ("node2", 4, "H100-80GB", ("h100",))]
    assert view.job(4).partition == "a100,h100"
    be.apply(Decision(4, partition="h100"), view.job(4))
    assert be.snapshot().job(4).partition == "h100"
    be.finish(3, 20.0)
    assert [j.job_id for j in be.schedule(20.0)] == [4] and be.jobs[4].placement == (1,)


def test_sim_partition_specs_and_the_jobs_submitted_to_them() -> None:
    part = parse_partition("h100=H100-80GB:2x8")
    assert (part.name, part.gpu.name, part.num_nodes, part.gpus_per_node, part.text()) == (
        "h100", "H100-80GB", 2, 8, "h100=H100-80GB:2x8")
    for bad in ("h100", "h100=H100-80GB:0x8", "h100=B300:1x8", "h 100=H100-80GB:1x8"):
        with pytest.raises(WorkloadError, match="h"):
            parse_partition(bad)


@pytest.mark.parametrize("flex", [0.0, 1.0])
def test_mixed_cluster_simulation_moves_only_pipeswift_jobs(flex: float) -> None:
    from pipeswift_slurm.sim.runner import RunSpec, run_comparison

    parts = (parse_partition("a100=A100-80GB:2x8"), parse_partition("h100=H100-80GB:2x8"))
    spec = RunSpec(partitions=parts, synthetic_jobs=40, partition_flex=flex, policies=("slurm", "pipeswift"))
    comp = run_comparison(spec)
    assert comp.spec.gpus == 32 and comp.workload["partitions"] == [p.text() for p in parts]
    by_id = {j.job_id: j for j in comp.jobs}
    assert comp.workload["multi_partition_jobs"] == sum(1 for j in comp.jobs if j.partitions)
    for m, result in zip(comp.metrics, comp.results):
        for rec in result.records:
            job = by_id[rec.job_id]
            assert rec.partition in (job.partitions or (job.partition,))  # ran only where it may
        assert m["moved_partition_jobs"] == sum(1 for r in result.records if r.partition != by_id[r.job_id].partition)
    slurm, pipeswift = comp.metrics
    assert slurm["moved_partition_jobs"] == 0
    assert (pipeswift["moved_partition_jobs"] > 0) == (flex > 0)


def test_assign_partitions_is_seeded_per_job_and_drops_what_fits_nowhere() -> None:
    from pipeswift_slurm.sim.runner import RunSpec, build_jobs

    jobs, _ = build_jobs(RunSpec(gpus=64, synthetic_jobs=60), CostModel(A100))
    parts = (parse_partition("a=A100-80GB:1x8"), parse_partition("b=H100-80GB:3x8"))
    one, dropped = assign_partitions(jobs, parts, 0.5, seed=3)
    again, _ = assign_partitions(list(reversed(jobs)), parts, 0.5, seed=3)
    assert {j.job_id: (j.partition, j.partitions) for j in one} == {j.job_id: (j.partition, j.partitions)
                                                                       for j in again}
    assert dropped == sum(1 for j in jobs if j.gpus > 24) and dropped > 0
    assert all(j.gpus <= 8 or j.partition == "b" for j in one)
    assert all(not j.partitions or j.partitions == ("a", "b") for j in one)
    assert 0 < sum(1 for j in one if j.partitions) < len(one)


def test_simulate_cli_runs_a_mixed_cluster_and_says_so(tmp_path: Any) -> None:
    import json

    from click.testing import CliRunner

    from pipeswift_slurm.cli.main import pipeswift

    out = tmp_path / "m.json"
    args = ["simulate", "--jobs", "30", "--policy", "slurm,pipeswift", "--partition", "a=A100-80GB:2x8",
            "--partition", "b=H100-80GB:1x8", "--partition-flex", "0.5", "--truth-partition-factor", "b=1.2",
            "--json", str(out), "--db", str(tmp_path / "h.sqlite")]
    result = CliRunner().invoke(pipeswift, args, catch_exceptions=False)
    assert result.exit_code == 0, result.output
    assert "partitions: a=A100-80GB:2x8, b=H100-80GB:1x8;" in result.output and " moved " in result.output
    data = json.loads(out.read_text())
    assert data["spec"]["partitions"] == ["a=A100-80GB:2x8", "b=H100-80GB:1x8"] and data["spec"]["gpus"] == 24
    assert data["spec"]["partition_flex"] == 0.5 and data["spec"]["truth_partition_factors"] == {"b": 1.2}
    assert 0 < data["workload"]["multi_partition_jobs"] < data["workload"]["jobs"]
    assert [p["moved_partition_jobs"] > 0 for p in data["policies"]] == [False, True]
    # the history says where each moved job was sent, as a "move" decision
    import sqlite3

    with sqlite3.connect(tmp_path / "h.sqlite") as db:
        moves = db.execute("SELECT kind, partition FROM decisions WHERE partition IS NOT NULL").fetchall()
    assert moves and all("move" in kind and part in ("a", "b") for kind, part in moves)
