"""Issue 24, items 2, 4 and 5 in the simulator: the truth's seeded factor per config shape
(sim/truth.py, ``--truth-shape-noise``), per-user JCT and slowdown with the worst user
against slurm (sim/metrics.py, synthetic users for rows without one), and the wait bound
facts and WARNING of ``pipeswift simulate``."""

from __future__ import annotations

import json
import math
from collections import Counter
from dataclasses import replace
from typing import Any

import pytest
from click.testing import CliRunner

from pipeswift_slurm.cli.main import pipeswift
from pipeswift_slurm.core import hardware
from pipeswift_slurm.core.costmodel import CostModel
from pipeswift_slurm.core.estimator import Estimator
from pipeswift_slurm.core.megatron import profile_from_argv
from pipeswift_slurm.core.model import ExecConfig
from pipeswift_slurm.policy import get_policy
from pipeswift_slurm.sim.engine import JobRecord, SimResult, SimSettings, Simulation
from pipeswift_slurm.sim.metrics import MIN_USER_JOBS, alone_s, lower_bound_s, summarize, worst_user
from pipeswift_slurm.sim.runner import RunSpec, build_jobs, run_comparison
from pipeswift_slurm.sim.truth import ShapeNoise, TruthModel, shape_key
from pipeswift_slurm.sim.workload import ZOO, Conversion, TraceRow, WorkloadJob, synthetic_user, to_megatron_job

HOUR = 3600.0
GPU = replace(hardware.get_gpu_type("A100-80GB"), name="TEST-A100", startup_s=0.0, load_s_per_bparam=0.0)
PLAIN = CostModel(GPU)


def cfg(tp: int = 1, pp: int = 1, dp: int = 8, mbs: int = 2, vp: int = 1) -> ExecConfig:
    return ExecConfig(tp=tp, pp=pp, dp=dp, micro_batch_size=mbs, num_micro_batches=512 // (mbs * dp), vp=vp,
                      num_nodes=1, gpus_per_node=8)


def job(job_id: int, mbs: int, hours: float, world: int = 8, user: str = "") -> WorkloadJob:
    """gpt-1.3b at tp1 pp1 with micro-batch ``mbs`` on ``world`` GPUs, about ``hours`` long (plain model)."""
    model = ZOO["gpt-1.3b"]

    def argv(iters: int) -> list[str]:
        args = model.argv(world, 512, iters)
        args[args.index("--pipeline-model-parallel-size") + 1] = "1"
        args[args.index("--micro-batch-size") + 1] = str(mbs)
        return args

    probe = profile_from_argv(argv(1), world_size=world, gpus_per_node=8)
    iters = max(1, round(hours * HOUR / PLAIN.iter_time_s(probe, probe.requested)))
    profile = profile_from_argv(argv(iters), world_size=world, gpus_per_node=8)
    return WorkloadJob(job_id, "j%d" % job_id, user or "u%d" % job_id, 0.0, tuple(argv(iters)), profile,
                       hours * HOUR, int(math.ceil(3 * hours)) * 1800, "gpt-1.3b")


def run(jobs: list[WorkloadJob], truth: CostModel, policy: str = "fifo", nodes: int = 2) -> SimResult:
    return Simulation(jobs, get_policy(policy), Estimator(CostModel(GPU), 8), truth, SimSettings(nodes, 8)).run()


# ------------------------------------------------------------------ shape factors

def test_shape_factors_are_seeded_per_shape_and_one_at_sigma_zero() -> None:
    shapes = [cfg(mbs=m, tp=t, pp=p) for m in (1, 2, 4) for t in (1, 2) for p in (1, 2)]
    noise = ShapeNoise(0.3, seed=7)
    factors = [noise.factor(c) for c in shapes]
    assert factors == [ShapeNoise(0.3, seed=7).factor(c) for c in shapes]  # same seed, same truth
    assert len(set(factors)) == len(shapes)  # one draw per shape
    assert factors != [ShapeNoise(0.3, seed=8).factor(c) for c in shapes]
    assert all(0.3 < f < 3.0 for f in factors)
    assert all(ShapeNoise(0.0, seed=7).factor(c) == 1.0 for c in shapes)
    # the GPU count (data parallelism) is not part of the shape: a resize keeps the factor
    assert shape_key(cfg(dp=8)) == shape_key(cfg(dp=2)) and noise.factor(cfg(dp=8)) == noise.factor(cfg(dp=2))
    assert noise.factor(cfg(vp=2)) != noise.factor(cfg(vp=1))  # interleaving is part of it


def test_truth_model_scales_the_iteration_time_of_each_shape_by_its_factor() -> None:
    a = job(1, mbs=2, hours=2.0)
    truth = TruthModel(GPU, ShapeNoise(0.4, seed=3))
    for config in (cfg(mbs=1), cfg(mbs=2), cfg(mbs=4), cfg(dp=4, mbs=2)):
        factor = truth.shape.factor(config)
        assert truth.iter_time_s(a.profile, config) == pytest.approx(PLAIN.iter_time_s(a.profile, config) * factor)
        assert truth.job_time_s(a.profile, config) == pytest.approx(
            PLAIN.startup_s(a.profile) + a.profile.plan.iterations * PLAIN.iter_time_s(a.profile, config) * factor)
    assert truth.startup_s(a.profile) == PLAIN.startup_s(a.profile)


def test_a_shape_factor_changes_the_true_run_time_of_that_shape_only() -> None:
    """Two jobs of different micro-batch sizes side by side under fifo (user configs):
    each runs for the plain model's time x its own shape's factor, nothing else."""
    jobs = [job(1, mbs=2, hours=2.0), job(2, mbs=4, hours=3.0)]
    plain = {r.job_id: r.run_s for r in run(jobs, PLAIN).records}
    truth = TruthModel(GPU, ShapeNoise(0.5, seed=11))
    noisy = {r.job_id: r.run_s for r in run(jobs, truth).records}
    factors = {j.job_id: truth.shape.factor(j.profile.requested) for j in jobs}
    assert factors[1] != factors[2] and abs(math.log(factors[1])) > 0.01
    for j in jobs:
        assert noisy[j.job_id] == pytest.approx(plain[j.job_id] * factors[j.job_id], rel=1e-9)


def test_user_favour_speeds_up_the_shape_the_job_asked_for_only() -> None:
    a = job(1, mbs=2, hours=2.0)  # asked for tp1 pp1 mbs2 on 8 GPUs
    favoured = TruthModel(GPU, ShapeNoise(0.2, seed=3, user_favour=2.0))
    unfavoured = TruthModel(GPU, ShapeNoise(0.2, seed=3))
    for config, ratio in ((cfg(mbs=2), 0.5), (cfg(mbs=2, dp=4), 0.5), (cfg(mbs=1), 1.0), (cfg(mbs=2, tp=2, dp=4), 1.0)):
        assert favoured.iter_time_s(a.profile, config) == pytest.approx(
            unfavoured.iter_time_s(a.profile, config) * ratio)
    assert ShapeNoise(0.2, 3, 2.0).factor(cfg(mbs=2)) == ShapeNoise(0.2, 3).factor(cfg(mbs=2))  # no job: no favour
    records = run([a], favoured).records
    assert records[0].run_s == pytest.approx(run([a], unfavoured).records[0].run_s / 2)


def test_sigma_zero_truth_model_is_the_cost_model() -> None:
    jobs = [job(1, mbs=2, hours=2.0), job(2, mbs=4, hours=3.0), job(3, mbs=1, hours=1.0, world=16)]
    for policy in ("fifo", "pipeswift"):
        a, b = run(jobs, PLAIN, policy), run(jobs, TruthModel(GPU, ShapeNoise(0.0, seed=5)), policy)
        assert [(r.end_s, r.gpus, r.config, r.restarts) for r in a.records] == \
               [(r.end_s, r.gpus, r.config, r.restarts) for r in b.records]


def test_lower_bound_uses_the_shape_factor() -> None:
    jobs = [job(1, mbs=2, hours=2.0), job(2, mbs=4, hours=3.0)]
    est = Estimator(CostModel(GPU), 8)
    truth = TruthModel(GPU, ShapeNoise(0.5, seed=2))
    expected = sum(PLAIN.job_time_s(j.profile, est.fastest(j.profile, 8).config)
                   * truth.shape.factor(est.fastest(j.profile, 8).config) for j in jobs) / 2
    assert lower_bound_s(jobs, est, truth, 16) == pytest.approx(expected)
    assert lower_bound_s(jobs, est, truth, 16) != pytest.approx(lower_bound_s(jobs, est, PLAIN, 16))


def test_runner_shape_noise_leaves_the_workload_and_gives_every_policy_the_same_truth() -> None:
    """The jobs (iterations) are the same whatever the shape sigma; only the truth differs,
    and under fifo (user configs, no requeue) every job runs plain x its shape's factor."""
    spec = RunSpec(gpus=16, synthetic_jobs=30, policies=("fifo", "slurm"), seed=4, noise_sigma=0.2)
    noisy_spec = replace(spec, shape_sigma=0.3)
    plain_jobs, _ = build_jobs(spec, CostModel(hardware.get_gpu_type("A100-80GB")))
    comp = run_comparison(noisy_spec)
    assert [j.profile.plan.iterations for j in comp.jobs] == [j.profile.plan.iterations for j in plain_jobs]
    assert [j.truth_factor for j in comp.jobs] == [j.truth_factor for j in plain_jobs]
    truth = TruthModel(hardware.get_gpu_type("A100-80GB"), ShapeNoise(0.3, 4))
    base = CostModel(hardware.get_gpu_type("A100-80GB"))
    by_id = {j.job_id: j for j in comp.jobs}
    assert len({truth.shape.factor(j.profile.requested) for j in comp.jobs}) > 1
    for result in comp.results:
        for r in result.records:
            j = by_id[r.job_id]
            assert r.restarts == 0 and r.config == j.profile.requested
            assert r.run_s == pytest.approx(
                (base.startup_s(j.profile) + j.profile.plan.iterations * base.iter_time_s(j.profile, j.profile.requested)
                 * truth.shape.factor(j.profile.requested)) * j.truth_factor, rel=1e-6)
    # the user's limit covers their own layout's true run time
    assert all(j.time_limit_s >= r.run_s for j, r in zip(comp.jobs, comp.results[0].records))


# ------------------------------------------------------------------ users

def test_rows_without_a_user_get_a_seeded_zipf_like_synthetic_user() -> None:
    names = ["philly-%d" % i for i in range(4000)]
    users = [synthetic_user(n) for n in names]
    assert users == [synthetic_user(n) for n in names]
    counts = Counter(users)
    assert set(counts) <= {"u%02d" % k for k in range(20)} and len(counts) == 20
    assert counts["u00"] > 2 * counts["u01"] * 0.8 and counts["u00"] > 8 * counts["u19"]
    conv = Conversion(CostModel(hardware.get_gpu_type("A100-80GB")), 64, 8, seed=1)
    other_seed = replace(conv, seed=9)
    row = TraceRow("philly-77", 0.0, 3600.0, 4, "", "b436b2")
    assert to_megatron_job(0, row, conv).user == synthetic_user("philly-77") == to_megatron_job(0, row, other_seed).user
    assert to_megatron_job(0, replace(row, user="alice"), conv).user == "alice"


def record(job_id: int, user: str, jct_h: float) -> JobRecord:
    rec = JobRecord(job_id, "j%d" % job_id, user, "m", "c", "", 0.0, 8)
    rec.end_s = jct_h * HOUR
    return rec


def test_user_metrics_and_the_worst_user() -> None:
    jobs = [job(i, mbs=2, hours=1.0) for i in range(1, 8)]
    users = ["a", "a", "a", "b", "b", "b", "c"]
    slurm = SimResult("slurm", [record(i, u, 2.0) for i, u in zip(range(1, 8), users)])
    other = SimResult("sjf", [record(i, u, h) for i, u, h in zip(range(1, 8), users, (1, 1, 1, 3, 3, 3, 100))])
    alone = {j.job_id: 1 * HOUR for j in jobs}
    ms, mo = summarize(slurm, jobs, 48 * HOUR, alone), summarize(other, jobs, 48 * HOUR, alone)
    assert mo["users"]["a"] == {"jobs": 3, "mean_jct_s": HOUR, "mean_slowdown": pytest.approx(1.0)}
    assert mo["users"]["b"]["mean_slowdown"] == pytest.approx(3.0) and mo["users"]["c"]["jobs"] == 1
    # c (1 job, 50 x) is under MIN_USER_JOBS: b (1.5 x) is the worst user
    assert MIN_USER_JOBS == 3
    assert worst_user(mo, ms) == {"user": "b", "jct_ratio": pytest.approx(1.5), "users": 2}
    assert worst_user(mo, ms, min_jobs=1)["user"] == "c"
    assert worst_user(mo, ms, min_jobs=4) is None
    assert summarize(slurm, jobs, 48 * HOUR)["users"]["a"]["mean_slowdown"] is None
    est_alone = alone_s(jobs, PLAIN)
    assert est_alone[1] == pytest.approx(PLAIN.job_time_s(jobs[0].profile, jobs[0].profile.requested))


def test_wait_bound_facts_per_policy() -> None:
    jobs = [job(1, mbs=2, hours=4.0, world=16), job(2, mbs=2, hours=1.0, world=16)]
    result = run(jobs, PLAIN, "fifo")
    m = summarize(result, jobs, 3 * HOUR)
    assert (m["wait_bound_s"], m["bound_kept"]) == (3 * HOUR, False) and m["max_wait_s"] > 3 * HOUR
    m = summarize(result, jobs, 5 * HOUR)
    assert m["bound_kept"] is True


# ------------------------------------------------------------------ the command

def invoke(*args: str) -> Any:
    return CliRunner().invoke(pipeswift, ["simulate", "--gpus", "16", "--jobs", "40", "--seed", "2", *args],
                              catch_exceptions=False)


def test_simulate_json_carries_shape_noise_users_and_the_wait_bound() -> None:
    result = invoke("--truth-noise", "0.3", "--truth-shape-noise", "0.15", "--wait-bound-h", "0.5",
                    "--policy", "fifo,slurm,pipeswift", "--json", "-")
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["spec"]["truth_shape_noise"] == 0.15 and data["spec"]["truth_noise"] == 0.3
    assert data["workload"]["fifo_bound_kept"] is False
    for m in data["policies"]:
        assert m["wait_bound_s"] == 1800.0 and m["bound_kept"] == (m["max_wait_s"] <= 1800.0)
        assert sum(u["jobs"] for u in m["users"].values()) == 40
        if m["policy"] != "pipeswift":  # (user configs: never faster than alone; pipeswift may be)
            assert all(u["mean_slowdown"] >= 0.999 for u in m["users"].values())
        worst = m["worst_user_vs_slurm"]
        assert worst["users"] >= 1 and m["users"][worst["user"]]["jobs"] >= MIN_USER_JOBS
    slurm = data["policies"][1]
    assert slurm["worst_user_vs_slurm"]["jct_ratio"] == pytest.approx(1.0)
    assert [m["keeps_wait_bound"] for m in data["policies"]] == [False, False, True]
    warning = [line for line in result.stderr.splitlines() if line.startswith("WARNING")]
    assert len(warning) == 1 and "pipeswift waited up to" in warning[0] and "fifo waited up to" in warning[0]
    assert "no order could have kept the bound" in warning[0]
    again = invoke("--truth-noise", "0.3", "--truth-shape-noise", "0.15", "--wait-bound-h", "0.5",
                   "--policy", "fifo,slurm,pipeswift", "--json", "-")
    assert [m["mean_jct_s"] for m in json.loads(again.stdout)["policies"]] == \
           [m["mean_jct_s"] for m in data["policies"]]
    plain = json.loads(invoke("--truth-noise", "0.3", "--wait-bound-h", "0.5", "--policy", "fifo,slurm,pipeswift",
                              "--json", "-").stdout)
    assert plain["spec"]["truth_shape_noise"] == 0.0
    assert [m["mean_jct_s"] for m in plain["policies"]] != [m["mean_jct_s"] for m in data["policies"]]


def test_simulate_prints_the_worst_user_line_and_no_warning_when_the_bound_is_kept() -> None:
    result = invoke("--policy", "slurm,pipeswift", "--wait-bound-h", "1000")
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    worst = [line for line in lines if line.startswith("worst user's mean JCT / slurm's (users with >= 3 jobs):")]
    assert len(worst) == 1 and "slurm 1.00" in worst[0] and "pipeswift " in worst[0]
    assert "WARNING" not in result.stderr


@pytest.mark.parametrize("option,value", [("--truth-shape-noise", "-0.1"), ("--truth-user-favour", "0"),
                                          ("--truth-user-favour", "nan")])
def test_simulate_rejects_bad_truth_options(option: str, value: str) -> None:
    result = invoke(option, value, "--policy", "fifo")
    assert result.exit_code == 2 and option in result.stderr
    assert "Traceback" not in result.output


def test_simulate_user_favour_is_in_the_spec_and_the_truth() -> None:
    args = ("--truth-shape-noise", "0.1", "--policy", "slurm,pipeswift", "--json", "-")
    plain, favoured = (json.loads(invoke(*args, *extra).stdout) for extra in ((), ("--truth-user-favour", "1.5")))
    assert (plain["spec"]["truth_user_favour"], favoured["spec"]["truth_user_favour"]) == (1.0, 1.5)
    # slurm runs every job in the layout it asked for: all of it 1.5 x faster (startup aside)
    assert favoured["policies"][0]["mean_jct_s"] < plain["policies"][0]["mean_jct_s"]
    assert favoured["workload"]["lower_bound_mean_jct_s"] <= plain["workload"]["lower_bound_mean_jct_s"]
