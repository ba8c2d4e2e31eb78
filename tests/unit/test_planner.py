"""Planner and Estimator: ranked configs are valid, fit and sorted; job limits are honoured;
explain says why configs were left out; the calibration bias scales run times."""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeswift_slurm.core import hardware
from pipeswift_slurm.core.costmodel import CostModel
from pipeswift_slurm.core.estimator import Estimator
from pipeswift_slurm.core.megatron import profile_from_argv
from pipeswift_slurm.core.megatron_rules import check_config, profile_stage_layers, uneven
from pipeswift_slurm.core.model import JobProfile
from pipeswift_slurm.core.planner import Planner, describe_no_layout

# the conftest ``gpt_argv`` shape, for module-scoped fixtures shared across hypothesis examples
GPT_ARGV = ["--num-layers", "24", "--hidden-size", "2048", "--num-attention-heads", "16", "--seq-length", "2048",
            "--global-batch-size", "512", "--bf16", "--train-iters", "1000"]


@pytest.fixture
def planner(cost: CostModel) -> Planner:
    return Planner(cost, gpus_per_node=8)


def test_every_ranked_config_is_valid_fits_and_is_sorted(profile: JobProfile, planner: Planner,
                                                         cost: CostModel) -> None:
    prof = profile.with_range(1, 16)
    result = planner.plan(prof, 1, 16)
    assert len(result.ranked) > 10
    for est in result.ranked:
        assert check_config(prof, est.config) == [], est.config
        assert est.fits and est.mem_gib <= cost.gpu.mem_gib
        assert 1 <= est.config.gpus <= 16
    times = [e.iter_time_s for e in result.ranked]
    assert times == sorted(times)
    assert result.excluded == []  # only with explain


def test_ranked_per_gpu_count_is_sorted_and_exact(profile: JobProfile, planner: Planner) -> None:
    prof = profile.with_range(1, 64)
    ranked = planner.ranked(prof, 8)
    assert ranked and all(e.config.gpus == 8 for e in ranked)
    assert [e.iter_time_s for e in ranked] == sorted(e.iter_time_s for e in ranked)
    assert planner.best(prof, 8) == ranked[0]


def test_allowed_pp_restricts_pipeline_sizes(profile: JobProfile, planner: Planner) -> None:
    prof = replace(profile.with_range(1, 16), allowed_pp=(2,))
    result = planner.plan(prof, 1, 16)
    assert result.ranked
    assert {e.config.pp for e in result.ranked} == {2}


def test_min_micro_batch_is_honoured(profile: JobProfile, planner: Planner) -> None:
    prof = replace(profile.with_range(8, 8), min_micro_batch_size=4)
    ranked = planner.ranked(prof, 8)
    assert ranked and min(e.config.micro_batch_size for e in ranked) == 4


def test_three_gpu_fragment_gets_a_valid_layout(profile: JobProfile, planner: Planner) -> None:
    prof = profile.with_range(1, 16)
    best = planner.best(prof, 3)
    assert best is not None
    cfg = best.config
    assert cfg.gpus == 3 and (cfg.num_nodes, cfg.gpus_per_node) == (1, 3)
    assert cfg.pp == 3 or (cfg.tp * cfg.dp == 3 and cfg.pp == 1)
    assert check_config(prof, cfg) == []
    assert [e.config.pp for e in planner.ranked(prof, 3)] == [3] * len(planner.ranked(prof, 3))


def test_explain_lists_excluded_configs_with_reasons(profile: JobProfile, planner: Planner) -> None:
    prof = profile.with_range(1, 32)
    result = planner.plan(prof, 25, 25, explain=True)
    assert result.ranked == []  # 25 GPUs: pp=5 with dp=5 (512 is not divisible by 5), 25 stages > 24 layers
    assert result.excluded
    assert all(x.reason for x in result.excluded)
    by_pp = {x.config.pp: x.reason for x in result.excluded if x.config is not None and x.config.tp == 1}
    assert "--pipeline-model-parallel-size" in by_pp[5]
    assert "--global-batch-size" in by_pp[1]


def test_explain_reports_memory_exclusions(cost: CostModel) -> None:
    big = profile_from_argv(["--num-layers", "80", "--hidden-size", "8192", "--num-attention-heads", "64",
                             "--seq-length", "2048", "--global-batch-size", "64", "--bf16", "--train-iters", "10"])
    excluded = Planner(cost, 8).explain_exclusions(big.with_range(1, 8), 1)
    assert any(x.config is not None and "GiB" in x.reason and "A100-80GB" in x.reason for x in excluded)


def test_why_none_names_the_rules_that_exclude_every_split(profile: JobProfile, planner: Planner) -> None:
    prof = profile.with_range(1, 16)  # 24 layers, 16 heads, global batch 512
    why = planner.why_none(prof, 5)
    assert why.kind == "rules"
    assert set(why.reasons) == {"global batch 512 not divisible by micro-batch x data-parallel size",
                                "24 layers not divisible by the pipeline size"}
    assert "memory" not in why.text()
    # one layer and a batch of 1: 2 GPUs can only be tp 2, and 3 heads do not split over it
    heads = profile_from_argv(["--num-layers", "1", "--hidden-size", "96", "--num-attention-heads", "3",
                               "--seq-length", "64", "--global-batch-size", "1", "--train-iters", "1"])
    why = planner.why_none(heads.with_range(1, 8), 2)
    assert why.kind == "rules"
    assert set(why.reasons) == {"3 attention heads not divisible by the tensor size",
                                "global batch 1 not divisible by micro-batch x data-parallel size"}


def test_why_none_says_memory_only_when_a_valid_split_does_not_fit(cost: CostModel) -> None:
    big = profile_from_argv(["--num-layers", "80", "--hidden-size", "8192", "--num-attention-heads", "64",
                             "--seq-length", "2048", "--global-batch-size", "64", "--bf16", "--train-iters", "10"])
    planner = Planner(cost, 8)
    why = planner.why_none(big.with_range(1, 8), 2)
    assert why.kind == "memory" and why.least_gib > cost.gpu.mem_gib
    assert planner.why_none(big.with_range(1, 8), 3).kind == "rules"  # 80 layers, batch 64: nothing splits 3
    lines = describe_no_layout(planner, big.with_range(1, 4), [1, 2, 3, 4])
    assert lines[0].startswith("no valid layout on 1, 2, 4 GPUs: memory: the smallest valid layout needs")
    assert lines[1].startswith("no valid layout on 3 GPUs: every tp x pp x dp split breaks a Megatron rule")


def test_explain_out_of_range_gpu_count_says_so(profile: JobProfile, planner: Planner) -> None:
    prof = profile.with_range(4, 8)
    excluded = planner.explain_exclusions(prof, 16)
    assert excluded[0].config is None
    assert "outside" in excluded[0].reason and "4-8" in excluded[0].reason
    assert planner.ranked(prof, 16) == []
    result = planner.plan(prof, 2, 16, explain=True)
    assert all(4 <= e.config.gpus <= 8 for e in result.ranked)
    whole_counts = {x.gpus for x in result.excluded if x.config is None and "outside" in x.reason}
    assert whole_counts == {2, 3} | set(range(9, 17))


def test_estimator_bias_multiplies_run_time(profile: JobProfile, cost: CostModel) -> None:
    cfg = Planner(cost, 8).best(profile.with_range(8, 8), 8).config  # type: ignore[union-attr]
    plain = Estimator(cost, 8)
    biased = plain.with_bias({profile.job_class: 1.5})
    assert plain.run_time_s(profile, cfg) == pytest.approx(cost.job_time_s(profile, cfg))
    assert biased.run_time_s(profile, cfg) == pytest.approx(1.5 * cost.job_time_s(profile, cfg))
    other_class = replace(profile, job_class="something-else")
    assert biased.run_time_s(other_class, cfg) == pytest.approx(cost.job_time_s(other_class, cfg))
    prof8 = profile.with_range(8, 8)
    best_plain, best_biased = plain.best_run_time_s(prof8, 8), biased.best_run_time_s(prof8, 8)
    assert best_plain is not None and best_biased is not None
    assert best_biased[0] == best_plain[0]  # bias changes the time, not the choice
    assert best_biased[1] == pytest.approx(1.5 * best_plain[1])


@pytest.fixture(scope="module")
def shared_planner() -> Planner:
    return Planner(CostModel(hardware.get_gpu_type("A100-80GB")), gpus_per_node=8)


@pytest.fixture(scope="module")
def wide_profile() -> JobProfile:
    return profile_from_argv(GPT_ARGV).with_range(1, 64)


@settings(max_examples=40, deadline=None)
@given(gpus=st.integers(1, 64))
def test_best_config_uses_all_gpus_and_splits_layers_as_megatron_allows(shared_planner: Planner,
                                                                       wide_profile: JobProfile, gpus: int) -> None:
    best = shared_planner.best(wide_profile, gpus)
    if gpus & (gpus - 1) == 0:  # powers of two always have a layout for 512 samples and 16 heads
        assert best is not None
    if best is None:
        return
    cfg = best.config
    assert cfg.world_size == gpus == cfg.num_nodes * cfg.gpus_per_node
    layers = profile_stage_layers(wide_profile, cfg)
    assert layers is not None and sum(layers) == wide_profile.shape.num_layers
    # an uneven first/last split only where pp does not divide the layers
    assert uneven(cfg) == (wide_profile.shape.num_layers % cfg.pp != 0)
    assert check_config(wide_profile, cfg) == []


@pytest.mark.parametrize("gpus", [5, 7])
def test_24_layers_on_an_odd_gpu_count_run_as_that_many_stages(shared_planner: Planner, wide_profile: JobProfile,
                                                               gpus: int) -> None:
    best = shared_planner.best(wide_profile, gpus)
    assert best is not None
    cfg = best.config
    assert (cfg.pp, cfg.gpus) == (gpus, gpus) and uneven(cfg)
    layers = profile_stage_layers(wide_profile, cfg)
    # no stage holds more than ceil(24 / stages) (7 stages: 2, 4 x 5, 2: Megatron's middle stages are equal)
    assert layers is not None and sum(layers) == 24 and max(layers) == -(-24 // gpus)
    assert layers[-1] == min(layers)  # the last stage also computes the logits and the loss
