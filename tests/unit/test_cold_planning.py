"""The shortcuts that make a cold tick's planning cheap (issue 24, decide() cold) choose
exactly what the plain definitions choose: the pruned search for the fastest config
(``Planner.best``) is the ranking's first, one shared search per shape and range
(``Estimator.option_run_times_s``) is ``option`` count by count, the floor that
orders the search is below every pipeline time it stands for, and the enumeration's
cheap pre-checks drop no config that ``check_config`` accepts.
(``python bench/decide_latency.py --against DIR`` compares whole decisions.)"""

from __future__ import annotations

import itertools
from dataclasses import replace

import pytest

from pipeswift_slurm.core.costmodel import CostModel
from pipeswift_slurm.core.estimator import Estimator
from pipeswift_slurm.core.megatron import profile_from_argv
from pipeswift_slurm.core.megatron_rules import (_divisors, _pp_choices, _split_choices, _tp_choices, check_config,
                                                 config_bases, enumerate_configs, interleavings, micro_batch_levels,
                                                 node_shape)
from pipeswift_slurm.core.model import ExecConfig, JobProfile
from pipeswift_slurm.core.planner import Planner
from pipeswift_slurm.policy.common import Option, job_options

BASE = ["--hidden-size", "2048", "--num-attention-heads", "16", "--seq-length", "2048", "--bf16",
        "--train-iters", "1000"]


def _profiles() -> dict[str, JobProfile]:
    """Even and uneven layer splits, the embedding counted as a stage, a user's uneven split,
    a large model where memory prunes, and a job with a minimum micro-batch."""
    def parse(extra: list[str], lo: int, hi: int) -> JobProfile:
        return profile_from_argv(BASE + extra).with_range(lo, hi)

    return {
        "even": parse(["--num-layers", "24", "--global-batch-size", "512"], 1, 48),
        "uneven": parse(["--num-layers", "30", "--global-batch-size", "384"], 1, 40),
        "embedding": parse(["--num-layers", "23", "--global-batch-size", "256",
                            "--account-for-embedding-in-pipeline-split"], 1, 24),
        "user_split": parse(["--num-layers", "30", "--global-batch-size", "256", "--pipeline-model-parallel-size",
                             "4", "--decoder-first-pipeline-num-layers", "6",
                             "--decoder-last-pipeline-num-layers", "6"], 4, 32),
        "large": replace(profile_from_argv(["--num-layers", "48", "--hidden-size", "7168", "--num-attention-heads",
                                            "56", "--seq-length", "2048", "--global-batch-size", "1536", "--bf16",
                                            "--use-distributed-optimizer", "--train-iters", "7"]).with_range(16, 72)),
        "min_mbs": replace(parse(["--num-layers", "24", "--global-batch-size", "512"], 2, 24), min_micro_batch_size=2),
    }


PROFILES = _profiles()


@pytest.mark.parametrize("name", sorted(PROFILES))
def test_pruned_best_is_the_rankings_first(name: str, cost: CostModel) -> None:
    profile = PROFILES[name]
    lo, hi = profile.gpu_range
    pruned, ranking = Planner(cost, 8), Planner(CostModel(cost.gpu), 8)
    found = 0
    for gpus in range(lo, hi + 1):
        ranked = ranking.ranked(profile, gpus)
        assert pruned.best(profile, gpus) == (ranked[0] if ranked else None), gpus
        found += bool(ranked)
    assert found > 3


@pytest.mark.parametrize("name", sorted(PROFILES))
def test_shared_search_is_option_count_by_count(name: str, cost: CostModel) -> None:
    profile = replace(PROFILES[name], job_class="gpt-x", run_time_factor=1.3)
    bias = {"gpt-x": 1.1}
    shared, plain = Estimator(cost, 8, bias), Estimator(CostModel(cost.gpu), 8, bias)
    lo, hi = profile.gpu_range
    table = shared.option_run_times_s(profile, lo, hi)
    expected = [(gpus, *best) for gpus in range(lo, hi + 1)
                if (best := plain.option(profile, gpus)) is not None]
    assert table == expected and table
    # a job of the same shape, another length, shares the search but not the run times
    longer = replace(profile, plan=replace(profile.plan, train_iters=3000))
    assert [(g, c) for g, c, _ in shared.option_run_times_s(longer, lo, hi)] == [(g, c) for g, c, _ in table]
    assert [r for _, _, r in shared.option_run_times_s(longer, lo, hi)] == \
        [plain.option(longer, g)[1] for g, _, _ in table]  # type: ignore[index]


def test_job_options_are_the_per_count_options(cost: CostModel) -> None:
    profile = PROFILES["uneven"]
    est = Estimator(cost, 8)
    options = job_options(profile, est, 24, 2)
    plain = Estimator(CostModel(cost.gpu), 8)
    expected = []
    for gpus in range(1, 25):
        best = plain.option(profile, gpus)
        if best is not None and best[0].num_nodes <= 2:
            expected.append(Option(gpus, best[0], best[1]))
    assert list(options) == expected
    requeued = job_options(profile, est, 24, 2, iterations=400)
    assert [(o.gpus, o.config, o.full_run_s) for o in requeued] == [(o.gpus, o.config, o.run_s) for o in expected]
    assert [o.run_s for o in requeued] == [plain.run_time_s(profile, o.config, 400) for o in expected]


def _every_valid(profile: JobProfile, gpus: int, gpus_per_node: int) -> set[ExecConfig]:
    """Every tp x pp x split x micro-batch x interleaving the enumeration looks at, with
    check_config alone deciding (no pre-checks)."""
    user, gbs = profile.requested, profile.plan.global_batch_size
    nodes, gpn = node_shape(gpus, gpus_per_node)
    out = set()
    for tp, pp in itertools.product(_tp_choices(profile, gpn), _pp_choices(profile, gpus)):
        if gpus % (tp * pp * user.cp):
            continue
        dp = gpus // (tp * pp * user.cp)
        for (first, last), mbs, vp in itertools.product(_split_choices(profile, pp), _divisors(max(1, gbs // dp)),
                                                         range(1, 5)):
            cfg = ExecConfig(tp, pp, dp, mbs, max(1, gbs // (mbs * dp)), user.cp, vp, nodes, gpn, first, last)
            if not check_config(profile, cfg, gpus_per_node):
                out.add(cfg)
    return out


@pytest.mark.parametrize("name", sorted(PROFILES))
def test_pre_checks_drop_no_valid_config(name: str) -> None:
    profile = PROFILES[name]
    lo, hi = profile.gpu_range
    for gpus in range(lo, min(hi, 40) + 1):
        assert set(enumerate_configs(profile, gpus, 8)) == _every_valid(profile, gpus, 8), gpus


def test_jobs_of_one_shape_share_searches_across_ranges(cost: CostModel) -> None:
    """Searches are shared by jobs that differ only in GPU range, length or checkpoint
    interval; each job still gets exactly what a planner of its own would choose."""
    base, pipelined = PROFILES["uneven"], PROFILES["user_split"]  # the second's layout needs 4k GPUs
    jobs = [base.with_range(1, 8), base.with_range(4, 24), base.with_range(6, 6),
            replace(base.with_range(2, 16), plan=replace(base.plan, train_iters=77, save_interval=5)),
            pipelined.with_range(4, 24), pipelined.with_range(9, 24), pipelined.with_range(13, 24)]
    shared = Planner(cost, 8)
    for job in jobs:
        for lo, hi in ((1, 24), job.gpu_range, (3, 12)):
            own = Planner(CostModel(cost.gpu), 8)
            expected = tuple((g, est) for g in range(lo, hi + 1) if (est := own.offer(job, g)) is not None)
            assert shared.offers(job, lo, hi) == expected, (job.gpu_range, lo, hi)
        assert shared.ranked(job, 3) == Planner(CostModel(cost.gpu), 8).ranked(job, 3)


def test_one_ticks_shared_options_are_each_jobs_own(cost: CostModel) -> None:
    """Jobs of one shape share their options within a tick only when their lengths, classes
    and run-time factors (and so their run times) agree."""
    base = PROFILES["uneven"]
    jobs = [base.with_range(2, 16), base.with_range(2, 16), base.with_range(4, 16),
            replace(base.with_range(2, 16), plan=replace(base.plan, train_iters=5)),
            replace(base.with_range(2, 16), run_time_factor=1.5), replace(base.with_range(2, 16), job_class="other")]
    est, shared = Estimator(cost, 8, {"other": 0.8}), {}
    got = [job_options(job, est, 24, 2, shared=shared) for job in jobs]
    assert [job_options(job, Estimator(CostModel(cost.gpu), 8, {"other": 0.8}), 24, 2) for job in jobs] == got
    assert got[0] is got[1] and len({id(options) for options in got}) == 5


@pytest.mark.parametrize("name", sorted(PROFILES))
def test_pipeline_floor_is_below_every_config_of_its_layout(name: str, cost: CostModel) -> None:
    profile = PROFILES[name]
    lo, hi = profile.gpu_range
    checked = 0
    for gpus in range(lo, min(hi, 40) + 1):
        for base, vps in config_bases(profile, gpus, 8):
            levels = micro_batch_levels(profile, base)
            floor = cost.pipeline_floor_s(profile, base, levels, vps[-1])
            configs = [cfg for mbs, m in levels for cfg in interleavings(base, mbs, m, vps)]
            assert all(floor <= cost.pipeline_s(profile, cfg)[0] for cfg in configs), (gpus, base)
            assert floor >= 0.3 * min(cost.pipeline_s(profile, cfg)[0] for cfg in configs)  # not a trivial bound
            checked += len(configs)
    assert checked > 50
