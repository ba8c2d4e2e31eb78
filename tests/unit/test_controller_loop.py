"""The controller tick's rules for the live loop (issue 28), against an in-memory backend
that keeps what was applied, as Slurm does: plans use the cluster's own GPUs per node
(never ``gres:gpu:8`` on 4-GPU nodes, and a job an earlier update left BadConstraints is
re-decided); a job that asked for no GPUs is never managed; held (not by us), dependent
and begin-time jobs are neither planned nor updated, and a tick with only those and
unchanged jobs issues no update; a held job's SiteFactor is set only with its release."""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import replace
from typing import Any, Mapping

import pytest

from pipeswift_slurm.core import token
from pipeswift_slurm.core.costmodel import CostModel
from pipeswift_slurm.core.estimator import Estimator
from pipeswift_slurm.core.hardware import get_gpu_type
from pipeswift_slurm.core.model import ClusterView, Decision, ExecConfig, GpuRequest, Job, JobProfile, Node
from pipeswift_slurm.policy import get_policy
from pipeswift_slurm.slurm.controller import Controller, ControllerSettings, cluster_gpus_per_node
from pipeswift_slurm.slurm.holds import not_runnable
from pipeswift_slurm.slurm.decision_diff import unchanged_parts

NOW = 1_700_000_000.0
ARGV = ("--num-layers", "24", "--hidden-size", "1024", "--num-attention-heads", "16", "--seq-length", "1024",
        "--max-position-embeddings", "1024", "--micro-batch-size", "4", "--global-batch-size", "64",
        "--train-iters", "1000")
PROFILE = token.encode_profile(token.ProfileRequest(ARGV, gpus=(1, 16)))


def estimator() -> Estimator:
    """What ``build_controller`` makes with no ``gpus_per_node`` in the config (8)."""
    return Estimator(CostModel(get_gpu_type("A100-80GB")), 8)


class KeepingBackend:
    """Shows its jobs on nodes of ``gpn`` GPUs and keeps every applied change, as Slurm
    shows it back: size, decision token and SiteFactor (none for held jobs, as sprio)."""

    name = "keeping"

    def __init__(self, nodes: int, gpn: int, jobs: list[Job]) -> None:
        self.nodes = tuple(Node("node%d" % (i + 1), gpn, partitions=("gpu",)) for i in range(nodes))
        self.jobs = {j.job_id: j for j in jobs}
        self.applied: list[Decision] = []

    def snapshot(self) -> ClusterView:
        jobs = tuple(replace(j, site_factor=0) if j.held else j for j in self.jobs.values())
        return ClusterView(now=NOW, nodes=self.nodes, jobs=jobs)

    def apply(self, decision: Decision, job: Job) -> None:
        self.applied.append(decision)
        changes: dict[str, Any] = {}
        if decision.config is not None:
            cfg = decision.config
            changes.update(config=cfg, gpus=cfg.gpus, num_nodes=cfg.num_nodes,
                           admin_comment=token.encode_decision(cfg, int(NOW), held=bool(decision.hold)))
        if decision.site_factor is not None:
            changes["site_factor"] = decision.site_factor
        if decision.time_limit_s is not None:
            changes["time_limit_s"] = decision.time_limit_s
        if decision.hold is not None:
            changes["state_reason"] = "JobHeldAdmin" if decision.hold else "Priority"
        self.jobs[job.job_id] = replace(self.jobs[job.job_id], **changes)


def pending(job_id: int, gpus: int = 1, reason: str = "Priority", **kw: Any) -> Job:
    return Job(job_id=job_id, state="PENDING", submit_time=NOW - 600, num_nodes=1, gpus=gpus, opted_in=True,
               comment=PROFILE, state_reason=reason, gpu_request=GpuRequest("tres_per_node", gpus),
               time_limit_s=3600, partition="gpu", **kw)


# ------------------------------------------------------------------ item 2: GPUs per node from Slurm
def test_cluster_gpus_per_node_is_the_fewest_of_the_managed_usable_nodes() -> None:
    nodes = (Node("a", 8, partitions=("big",)), Node("b", 4, partitions=("small",)),
             Node("c", 2, state="DOWN", partitions=("small",)), Node("cpu", 0, partitions=("small",)))
    view = ClusterView(now=NOW, nodes=nodes, jobs=())
    assert cluster_gpus_per_node(view) == 4  # the down node does not count
    assert cluster_gpus_per_node(view, ("big",)) == 8
    assert cluster_gpus_per_node(ClusterView(now=NOW, nodes=(Node("cpu", 0),), jobs=())) == 0


@pytest.mark.parametrize("fixed", [0, 8])
def test_on_4_gpu_nodes_every_resize_fits_a_node(fixed: int) -> None:
    """An estimator built for 8 GPUs per node (the CLI's fallback, or a site's fixed 8) on
    2 x 4 GPUs: every config the tick applies has at most 4 GPUs per node, and the job
    still grows past one node (the old code asked for gres:gpu:8: BadConstraints)."""
    backend = KeepingBackend(2, 4, [pending(1)])
    controller = Controller(backend, get_policy("pipeswift"), estimator(),
                            settings=ControllerSettings(gpus_per_node=fixed))
    controller.tick()
    configs = [d.config for d in backend.applied if d.config is not None]
    assert configs and all(c.gpus_per_node <= 4 and c.num_nodes <= 2 for c in configs), configs
    assert controller.estimator.gpus_per_node == 4


def test_a_job_left_bad_constraints_by_an_earlier_update_is_re_decided() -> None:
    """A job an earlier tick resized to 1 x 8 on 4-GPU nodes (pending, BadConstraints) gets
    a valid shape on the next tick; then the tick after issues nothing."""
    bad = ExecConfig(tp=1, pp=1, dp=8, micro_batch_size=4, num_micro_batches=2, num_nodes=1, gpus_per_node=8)
    job = replace(pending(1, gpus=8, reason="BadConstraints"), config=bad,
                  admin_comment=token.encode_decision(bad, int(NOW) - 60))
    backend = KeepingBackend(2, 4, [job])
    controller = Controller(backend, get_policy("pipeswift"), estimator())
    controller.tick()
    [fixed] = [d.config for d in backend.applied if d.config is not None]
    assert fixed.gpus_per_node <= 4, fixed
    backend.jobs[1] = replace(backend.jobs[1], state_reason="Resources")
    backend.applied.clear()
    assert controller.tick().decisions == [] and backend.applied == []


# ------------------------------------------------------------------ item 3(c): no GPUs asked, none given
def test_a_job_that_asked_for_no_gpus_is_never_managed(caplog: pytest.LogCaptureFixture) -> None:
    cpu_job = replace(pending(1, gpus=0), gpu_request=GpuRequest(count=0))
    backend = KeepingBackend(2, 8, [cpu_job])
    with caplog.at_level(logging.WARNING, logger="pipeswift_slurm.slurm.controller"):
        report = Controller(backend, get_policy("pipeswift"), estimator()).tick()
    assert backend.applied == [] and report.decisions == []
    assert any("job 1: profile request ignored" in r.getMessage() and "no GPUs" in r.getMessage()
               for r in caplog.records)


# ------------------------------------------------------------------ item 4: held and dependent jobs
def test_not_runnable_names_holds_dependencies_and_begin_times() -> None:
    cfg = ExecConfig(tp=1, pp=1, dp=1, micro_batch_size=4, num_micro_batches=16, num_nodes=1, gpus_per_node=1)
    assert not_runnable(pending(1, reason="JobHeldUser"), NOW) == "held (JobHeldUser)"
    assert not_runnable(pending(1, reason="JobHeldAdmin"), NOW) == "held (JobHeldAdmin)"
    assert not_runnable(pending(1, reason="DependencyNeverSatisfied"), NOW) == "pending on DependencyNeverSatisfied"
    assert not_runnable(pending(1, reason="Dependency"), NOW) == "pending on Dependency"
    assert not_runnable(pending(1, reason="BeginTime"), NOW) == "pending on BeginTime"
    ours = pending(1, reason="JobHeldAdmin", admin_comment=token.encode_decision(cfg, int(NOW), held=True))
    assert not_runnable(ours, NOW) == "" and not_runnable(pending(1, reason="Resources"), NOW) == ""
    # psbatch's first look: planned now (its begin time is the controller's to clear), but
    # not a requeued job's begin time, nor a user's begin time on a job without the mark
    look = token.encode_profile(dataclasses.replace(token.decode_profile(PROFILE), first_look=True))
    waiting = replace(pending(1, reason="BeginTime"), comment=look)
    assert not_runnable(waiting, NOW) == ""
    assert not_runnable(replace(waiting, restarts=1), NOW) == "pending on BeginTime"
    assert not_runnable(replace(waiting, state_reason="Priority"), NOW) == ""
    # just submitted: no reason yet, but its eligible time (the begin time) is ahead
    assert not_runnable(replace(waiting, state_reason="None", eligible_time=NOW + 60), NOW) == ""
    # a dependency comes first: not planned before it is met
    assert not_runnable(replace(waiting, state_reason="Dependency", eligible_time=NOW + 60), NOW) == \
        "pending on Dependency"


def test_held_and_dependent_jobs_are_not_planned_nor_updated() -> None:
    """Idle 2 x 8 GPUs: held (by user and admin) and dependent jobs are not given to the
    policy (so none is planned 'start now' ahead of the runnable one) and get no update;
    the second tick, with everything as the first left it, issues none."""
    seen: list[Mapping[int, JobProfile]] = []

    class Spy:
        name = "spy"
        site_factor_max = 100_000_000
        preempts = False

        def __init__(self) -> None:
            self.inner = get_policy("pipeswift")

        def decide(self, view: ClusterView, profiles: Mapping[int, JobProfile], est: Any) -> list[Decision]:
            seen.append(profiles)
            return self.inner.decide(view, profiles, est)

    blocked = [pending(1, 8, "JobHeldUser"), pending(2, 8, "JobHeldAdmin"), pending(3, 8, "Dependency"),
               pending(4, 8, "DependencyNeverSatisfied")]
    backend = KeepingBackend(2, 8, [*blocked, pending(5, 8)])
    controller = Controller(backend, Spy(), estimator())
    first = controller.tick()
    assert set(seen[0]) == {5}
    assert {d.job_id for d in backend.applied} == {5}
    assert [d.job_id for d in first.decisions] == [5]
    backend.applied.clear()
    second = controller.tick()
    assert second.decisions == [] and backend.applied == [], second.decisions


def test_a_held_jobs_site_factor_is_set_only_with_its_release() -> None:
    """Slurm reports no SiteFactor for a held job (sprio leaves it out): a factor for a job
    held by the controller is not re-issued while it stays held, and goes with its release."""
    cfg = ExecConfig(tp=1, pp=1, dp=1, micro_batch_size=4, num_micro_batches=16, num_nodes=1, gpus_per_node=1)
    held = pending(1, reason="JobHeldAdmin", config=cfg, admin_comment=token.encode_decision(cfg, int(NOW), held=True))
    assert not unchanged_parts(Decision(1, site_factor=5000), held).changes_anything
    assert not unchanged_parts(Decision(1, site_factor=5000, hold=True), held).changes_anything
    release = unchanged_parts(Decision(1, site_factor=5000, hold=False), held)
    assert (release.hold, release.site_factor) == (False, 5000)


# ------------------------------------------------------------------ a resized job, seen again by cron
def test_a_cron_tick_leaves_the_size_an_earlier_tick_gave_a_job() -> None:
    """A 1-GPU job allowing 1-16 GPUs on 4 x 8 free GPUs, one fresh controller per tick
    (cron): each re-reads the job at the size the last one gave it. BUG (the live tests,
    when lent GPUs first had to pay): the bar was set by the job's own count, which a cron
    tick reads as its current size, so each tick widened the job again (4 -> 8 -> ...).
    The bar is now set by the job's best count, which no resize moves."""
    backend = KeepingBackend(4, 8, [pending(1)])
    sizes = []
    for _ in range(3):
        Controller(backend, get_policy("pipeswift"), estimator()).tick()
        sizes.append(backend.jobs[1].gpus)
    assert sizes[0] > 1 and sizes == [sizes[0]] * 3, sizes
