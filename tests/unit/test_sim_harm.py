"""The simulator's per-job do-no-harm measure (``sim/harm.py``): jobs run slower than their
user's own layout would have run, under the truth, at the same GPU count and at another."""

from pipeswift_slurm.core.costmodel import CostModel
from pipeswift_slurm.core.hardware import get_gpu_type
from pipeswift_slurm.core.megatron import profile_from_argv
from pipeswift_slurm.core.megatron_rules import user_layout_at
from pipeswift_slurm.core.planner import Planner
from pipeswift_slurm.sim.engine import JobRecord
from pipeswift_slurm.sim.harm import TOLERANCE_REL, layout_harm, resized_jct
from pipeswift_slurm.sim.truth import ShapeNoise, TruthModel
from pipeswift_slurm.sim.workload import WorkloadJob

A100 = get_gpu_type("A100-80GB")
ARGV = ["--num-layers", "24", "--hidden-size", "2048", "--num-attention-heads", "16", "--seq-length", "2048",
        "--max-position-embeddings", "2048", "--tensor-model-parallel-size", "2", "--pipeline-model-parallel-size",
        "1", "--micro-batch-size", "4", "--global-batch-size", "64", "--train-iters", "100", "--bf16"]


def _job(job_id: int, factor: float = 1.0) -> WorkloadJob:
    profile = profile_from_argv(ARGV, world_size=8, gpus_per_node=8).with_range(4, 16)
    return WorkloadJob(job_id, "j%d" % job_id, "u", 0.0, tuple(ARGV), profile, 3600.0, 7200, "gpt", truth_factor=factor)


def _ran(job: WorkloadJob, config, jct_s: float = 100.0) -> JobRecord:  # type: ignore[no-untyped-def]
    return JobRecord(job.job_id, job.name, "u", "gpt", "c", "", 0.0, job.gpus, first_start_s=0.0, end_s=jct_s,
                     gpus=config.gpus, config=config)


def test_relayout_on_the_users_count_against_the_users_layout_under_a_favouring_truth() -> None:
    truth = TruthModel(A100, ShapeNoise(user_favour=1.5))  # the user's shape runs 1.5 x faster than predicted
    cost, planner = CostModel(A100), Planner(CostModel(A100), 8, do_no_harm=False)
    kept, moved, resized = _job(1, 1.3), _job(2, 1.3), _job(3)
    fastest = planner.best(moved.profile, 8).config
    gain = 1 - cost.iter_time_s(moved.profile, fastest) / cost.iter_time_s(moved.profile, moved.profile.requested)
    assert 0 < gain < 1 - 1 / 1.5  # predicted faster, truly slower
    on12 = planner.best(resized.profile, 12).config  # tp2 mbs4 does not run on 12 GPUs (dp 6): compared with it on 8
    assert user_layout_at(resized.profile, 12, 8) is None
    records = [_ran(kept, kept.profile.requested), _ran(moved, fastest), _ran(resized, on12)]
    harm = layout_harm(records, [kept, moved, resized], truth, 8)
    same, other = harm["same_gpus"], harm["other_gpus"]
    want = truth.job_time_s(moved.profile, fastest) / truth.job_time_s(moved.profile, moved.profile.requested)
    assert same["jobs"] == 1 and same["slower_beyond_tolerance"] == 1 and same["worst_job_id"] == 2
    assert abs(same["worst_ratio"] - want) < 1e-9 and want > 1 + TOLERANCE_REL
    lost_h = (truth.job_time_s(moved.profile, fastest) - truth.job_time_s(moved.profile, moved.profile.requested)) \
        * 1.3 * 8 / 3600
    assert abs(same["gpu_hours_lost"] - lost_h) < 1e-6 and same["gpu_hours_gained"] == 0
    assert other["jobs"] == 1 and other["vs_fewer_gpus"] == 1 and other["no_user_layout"] == 0
    mine8 = user_layout_at(resized.profile, 8, 8)
    assert abs(other["worst_ratio"] - truth.job_time_s(resized.profile, on12)
               / truth.job_time_s(resized.profile, mine8)) < 1e-9
    plain = layout_harm(records, [kept, moved, resized], TruthModel(A100), 8)["same_gpus"]
    assert plain["slower_jobs"] == 0 and plain["worst_ratio"] < 1  # truth = the model: the move gains


def test_resized_jobs_jct_against_the_base_run() -> None:
    a, b = _job(1), _job(2)
    on4 = Planner(CostModel(A100), 8).best(a.profile, 4).config
    records = [_ran(a, on4, jct_s=150.0), _ran(b, b.profile.requested, jct_s=500.0)]
    base = {1: _ran(a, a.profile.requested, jct_s=100.0), 2: _ran(b, b.profile.requested, jct_s=100.0)}
    got = resized_jct(records, base)
    assert got is not None and got["jobs"] == 1 and got["slower_beyond_tolerance"] == 1  # b was not resized
    assert got["worst_ratio"] == 1.5 and got["worst_job_id"] == 1
    assert resized_jct(records, {}) is None


def test_simulate_json_carries_the_measure_per_policy() -> None:
    import json

    from click.testing import CliRunner

    from pipeswift_slurm.cli.main import pipeswift

    args = ["simulate", "--gpus", "16", "--jobs", "40", "--seed", "1", "--truth-user-favour", "1.15",
            "--truth-shape-noise", "0.15", "--policy", "slurm,pipeswift", "--json", "-"]
    result = CliRunner().invoke(pipeswift, args, catch_exceptions=False)
    assert result.exit_code == 0, result.output
    slurm, ps = json.loads(result.stdout)["policies"]
    assert slurm["do_no_harm"]["same_gpus"]["jobs"] == slurm["do_no_harm"]["other_gpus"]["jobs"] == 0
    assert slurm["do_no_harm"]["resized_jct_vs_slurm"]["jobs"] == 0
    harm = ps["do_no_harm"]
    # every job in another layout is compared, or counted as having no user's layout at or below its count
    assert harm["same_gpus"]["jobs"] + harm["other_gpus"]["jobs"] + harm["other_gpus"]["no_user_layout"] \
        == ps["relayout_jobs"] > 0
    assert harm["resized_jct_vs_slurm"]["jobs"] == ps["reconfigured_jobs"] > 0
    assert harm["tolerance_rel"] == TOLERANCE_REL
