"""The users' own layouts in the simulator (issue 24, item 1): ``Conversion.layouts``
"user" (the zoo default, unchanged) or "expert" (the planner's best at the job's GPU
count, with the recorded duration still defining the work), and ``simulate --layouts``."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
from click.testing import CliRunner

from pipeswift_slurm.cli.main import pipeswift
from pipeswift_slurm.core import hardware
from pipeswift_slurm.core.costmodel import CostModel
from pipeswift_slurm.core.megatron import profile_from_argv
from pipeswift_slurm.core.planner import Planner
from pipeswift_slurm.sim.workload import (ZOO, Conversion, TraceRow, WorkloadError, build_workload,
                                          synthetic_trace, to_megatron_job)

HOUR = 3600.0
COST = CostModel(hardware.get_gpu_type("A100-80GB"))
ROWS = synthetic_trace(80, 64, 0.9, 5) + [TraceRow("big", 0.0, 30 * HOUR, 128, "u", "x"),
                                          TraceRow("mid", 10.0, 5 * HOUR, 16, "u", "x")]


def _pairs(flex: float = 0.0) -> list[tuple]:
    user = build_workload(ROWS, Conversion(COST, 128, 8, flex=flex, seed=5))
    expert = build_workload(ROWS, Conversion(COST, 128, 8, flex=flex, seed=5, layouts="expert"))
    return list(zip(user, expert))


def test_an_expert_jobs_layout_is_the_planners_best_at_its_gpu_count() -> None:
    planner = Planner(COST, 8)
    changed = 0
    for user, expert in _pairs():
        assert (expert.model, expert.gpus, expert.truth_factor) == (user.model, user.gpus, user.truth_factor)
        best = planner.best(user.profile, user.gpus)
        assert expert.profile.requested == best.config
        changed += best.config != user.profile.requested
        # the argv says the same as the profile: the controller parses the same job
        parsed = profile_from_argv(expert.argv, world_size=expert.gpus, gpus_per_node=8)
        assert parsed.requested == expert.profile.requested
        assert parsed.plan.train_iters == expert.profile.plan.train_iters
        # the recorded duration is the work: the expert's config reproduces it
        iter_s = COST.iter_time_s(expert.profile, expert.profile.requested)
        if user.recorded_duration_s > COST.startup_s(expert.profile) + iter_s:
            predicted = COST.job_time_s(expert.profile, expert.profile.requested)
            assert abs(predicted - user.recorded_duration_s) <= max(0.01 * user.recorded_duration_s, iter_s)
        # nothing left to gain at the same GPU count
        assert planner.best(expert.profile, expert.gpus).iter_time_s == pytest.approx(iter_s)
    assert changed > len(ROWS) // 2  # the zoo defaults are mostly not the best


def test_flexible_expert_jobs_keep_the_users_range_and_seeded_draws() -> None:
    for user, expert in _pairs(flex=0.5):
        assert expert.profile.gpu_range == user.profile.gpu_range
        assert expert.profile.requested.gpus == user.gpus


def test_the_user_layout_path_is_unchanged() -> None:
    conv = Conversion(COST, 128, 8, seed=5)
    assert build_workload(ROWS, conv) == build_workload(ROWS, replace(conv, layouts="user"))
    for i, row in enumerate(ROWS):
        job = to_megatron_job(i, row, conv)
        model = ZOO[job.model]
        req = job.profile.requested
        assert (req.tp, req.pp, req.micro_batch_size, req.vp) == (model.tp, model.pp, model.micro_batch_size, 1)
        # the argv is the zoo's own command line plus the checkpoint flags
        iters = job.profile.plan.train_iters
        assert list(job.argv[:-6]) == model.argv(row.num_gpus, job.profile.plan.global_batch_size, iters)


def test_unknown_layouts_are_a_workload_error() -> None:
    with pytest.raises(WorkloadError, match="layouts 'tuned'.*user, expert"):
        Conversion(COST, 128, 8, layouts="tuned")


def test_simulate_layouts_option() -> None:
    runner = CliRunner()
    args = ["simulate", "--gpus", "16", "--gpus-per-node", "8", "--jobs", "20", "--policy", "fifo,pipeswift:order",
            "--json", "-"]
    result = runner.invoke(pipeswift, args + ["--layouts", "expert"], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["spec"]["layouts"] == "expert"
    user = json.loads(runner.invoke(pipeswift, args, catch_exceptions=False).stdout)
    assert user["spec"]["layouts"] == "user"
    # the same jobs and arrivals; the expert's configs reproduce the same recorded work
    assert data["workload"]["offered_load"] == pytest.approx(user["workload"]["offered_load"])
    bad = runner.invoke(pipeswift, args + ["--layouts", "tuned"])
    assert bad.exit_code == 2 and "--layouts" in bad.stderr and "Traceback" not in bad.output
