"""Cost-model properties a user relies on: Megatron's FLOPs formula, the pipeline bubble,
memory trends (micro-batch, schedule, distributed optimizer, recompute) and time trends."""

from __future__ import annotations

import itertools
from dataclasses import replace
from typing import Any

import pytest

from pipeswift_slurm.core import hardware
from pipeswift_slurm.core.costmodel import CostModel
from pipeswift_slurm.core.flops import flops_per_iteration
from pipeswift_slurm.core.megatron import profile_from_argv
from pipeswift_slurm.core.megatron_rules import check_config, node_shape
from pipeswift_slurm.core.model import ExecConfig, JobProfile


def layout(tp: int = 1, pp: int = 1, dp: int = 1, mbs: int = 1, gbs: int = 512, vp: int = 1) -> ExecConfig:
    nodes, gpn = node_shape(tp * pp * dp, 8)
    return ExecConfig(tp=tp, pp=pp, dp=dp, micro_batch_size=mbs, num_micro_batches=gbs // (mbs * dp), vp=vp,
                      num_nodes=nodes, gpus_per_node=gpn)


def with_plan(profile: JobProfile, **changes: Any) -> JobProfile:
    return replace(profile, plan=replace(profile.plan, **changes))


def valid(profile: JobProfile, cfg: ExecConfig) -> ExecConfig:
    assert check_config(profile, cfg, job_limits=False) == [], cfg
    return cfg


# ---------------------------------------------------------------- FLOPs


@pytest.mark.parametrize("layers, hidden, heads, seq, gbs, vocab", [
    (24, 2048, 16, 2048, 512, 50257),
    (96, 12288, 96, 2048, 1536, 51200),
    (2, 256, 4, 128, 8, 1000),
])
def test_flops_match_megatron_closed_form(layers: int, hidden: int, heads: int, seq: int, gbs: int,
                                          vocab: int) -> None:
    prof = profile_from_argv(["--num-layers", str(layers), "--hidden-size", str(hidden),
                              "--num-attention-heads", str(heads), "--seq-length", str(seq),
                              "--global-batch-size", str(gbs), "--vocab-size", str(vocab), "--train-iters", "1"])
    v_padded = prof.shape.padded_vocab_size(1)
    assert v_padded % 128 == 0 and v_padded >= vocab
    b, s, n, h = gbs, seq, layers, hidden
    closed = 72 * b * s * n * h ** 2 * (1 + s / (12 * h)) + 6 * b * s * h * v_padded
    assert flops_per_iteration(prof.shape, gbs) == pytest.approx(closed, rel=1e-12)


def test_flops_scale_linearly_with_global_batch(profile: JobProfile) -> None:
    assert flops_per_iteration(profile.shape, 1024) == pytest.approx(2 * flops_per_iteration(profile.shape, 512))


def test_tflops_per_gpu_is_model_flops_over_time_and_gpus(profile: JobProfile, cost: CostModel) -> None:
    cfg = valid(profile, layout(tp=2, pp=2, dp=2))
    est = cost.estimate(profile, cfg)
    assert est.tflops_per_gpu == pytest.approx(flops_per_iteration(profile.shape, 512) / (est.iter_time_s * 8) / 1e12)
    assert 0 < est.tflops_per_gpu < cost.gpu.peak_tflops


# ---------------------------------------------------------------- bubble


@pytest.mark.parametrize("pp, vp, m", [(2, 1, 8), (4, 1, 8), (4, 2, 8), (8, 3, 16), (4, 1, 2)])
def test_bubble_fraction_formula_for_uniform_stages(profile: JobProfile, cost: CostModel,
                                                    monkeypatch: pytest.MonkeyPatch, pp: int, vp: int, m: int) -> None:
    monkeypatch.setattr(cost, "stage_times_s", lambda prof, cfg: [0.25] * cfg.pp)
    cfg = replace(layout(pp=pp), vp=vp, num_micro_batches=m)
    total, bubble = cost.pipeline_s(profile, cfg)
    assert bubble == pytest.approx((pp - 1) / (vp * m + pp - 1), rel=1e-12)
    assert total == pytest.approx((m + (pp - 1) / vp) * 0.25, rel=1e-12)


def test_bubble_fraction_close_to_formula_when_logits_and_p2p_are_small(cost: CostModel) -> None:
    # tiny vocabulary and one node: stages are nearly uniform
    prof = profile_from_argv(["--num-layers", "32", "--hidden-size", "4096", "--num-attention-heads", "32",
                              "--seq-length", "2048", "--vocab-size", "128", "--global-batch-size", "64",
                              "--bf16", "--train-iters", "10"])
    for pp, vp in ((4, 1), (8, 1), (4, 2)):
        cfg = valid(prof, layout(pp=pp, gbs=64, vp=vp))
        m = cfg.num_micro_batches
        est = cost.estimate(prof, cfg)
        assert est.bubble_fraction == pytest.approx((pp - 1) / (vp * m + pp - 1), rel=0.02)


def test_bubble_uses_the_models_own_stage_times(profile: JobProfile, cost: CostModel) -> None:
    cfg = valid(profile, layout(tp=2, pp=4, gbs=512))
    times = cost.stage_times_s(profile, cfg)
    t_max, m = max(times), cfg.num_micro_batches
    total, bubble = cost.pipeline_s(profile, cfg)
    assert total == pytest.approx(m * t_max + sum(times) - t_max)
    assert bubble == pytest.approx(1 - m * t_max / total)
    assert times[-1] > times[0]  # the last stage also computes the logits


def test_no_bubble_without_pipeline(profile: JobProfile, cost: CostModel) -> None:
    assert cost.estimate(profile, layout(tp=2)).bubble_fraction == 0


def test_more_micro_batches_shrink_the_bubble(profile: JobProfile, cost: CostModel) -> None:
    fractions = []
    for gbs in (8, 16, 64, 256, 1024):
        prof = with_plan(profile, global_batch_size=gbs)
        fractions.append(cost.estimate(prof, valid(prof, layout(tp=2, pp=4, gbs=gbs))).bubble_fraction)
    assert all(a > b for a, b in itertools.pairwise(fractions)), fractions


def test_interleaving_shrinks_the_bubble(profile: JobProfile, cost: CostModel) -> None:
    plain = cost.estimate(profile, valid(profile, layout(pp=4, gbs=512)))
    inter = cost.estimate(profile, valid(profile, layout(pp=4, gbs=512, vp=2)))
    assert inter.bubble_fraction < plain.bubble_fraction


# ---------------------------------------------------------------- memory


def test_activation_memory_grows_with_micro_batch_size(profile: JobProfile, cost: CostModel) -> None:
    per_layer, total = [], []
    for mbs in (1, 2, 4, 8):
        cfg = valid(profile, layout(tp=2, pp=4, mbs=mbs))
        per_layer.append(cost.activation_bytes_per_layer(profile, cfg))
        total.append(cost.memory_gib(profile, cfg))
    assert all(a < b for a, b in itertools.pairwise(per_layer)), per_layer
    assert per_layer[1] == pytest.approx(2 * per_layer[0])
    assert all(a < b for a, b in itertools.pairwise(total)), total


def test_1f1b_holds_min_m_and_p_minus_rank_gpipe_holds_m(a100: hardware.GpuType) -> None:
    one_f_one_b, gpipe = CostModel(a100), CostModel(a100, schedule="gpipe")
    for pp, m in ((4, 16), (4, 2), (8, 8), (1, 5)):
        cfg = replace(layout(pp=pp), num_micro_batches=m)
        for rank in range(pp):
            assert one_f_one_b.in_flight(cfg, rank) == min(m, pp - rank)
            assert gpipe.in_flight(cfg, rank) == m


def test_gpipe_needs_more_memory_when_m_exceeds_p(profile: JobProfile, a100: hardware.GpuType) -> None:
    cfg = valid(profile, layout(tp=2, pp=4, gbs=512))
    assert cfg.num_micro_batches > cfg.pp
    one_f_one_b, gpipe = CostModel(a100), CostModel(a100, schedule="gpipe")
    assert gpipe.memory_gib(profile, cfg) > one_f_one_b.memory_gib(profile, cfg)
    assert gpipe.iter_time_s(profile, cfg) == pytest.approx(one_f_one_b.iter_time_s(profile, cfg))


def test_unknown_schedule_is_refused(a100: hardware.GpuType) -> None:
    with pytest.raises(ValueError, match="schedule"):
        CostModel(a100, schedule="zero-bubble")


def test_distributed_optimizer_reduces_memory(profile: JobProfile, cost: CostModel) -> None:
    sharded = with_plan(profile, use_distributed_optimizer=True)
    cfg = valid(profile, layout(tp=2, pp=1, dp=4))
    assert cost.memory_gib(sharded, cfg) < cost.memory_gib(profile, cfg)
    single = valid(profile, layout(tp=2))  # dp=1: nothing to shard over (6 + 12/1 = 18 bytes/param)
    assert cost.memory_gib(sharded, single) == pytest.approx(cost.memory_gib(profile, single))


def test_full_recompute_trades_time_for_memory(profile: JobProfile, cost: CostModel) -> None:
    recompute = with_plan(profile, recompute_granularity="full")
    cfg = valid(profile, layout(tp=2, pp=2, mbs=4))
    plain_est, rec_est = cost.estimate(profile, cfg), cost.estimate(recompute, cfg)
    assert rec_est.mem_gib < plain_est.mem_gib
    assert rec_est.iter_time_s > plain_est.iter_time_s
    assert rec_est.tflops_per_gpu < plain_est.tflops_per_gpu  # recompute FLOPs are not counted


def test_more_tensor_parallelism_lowers_memory_per_gpu(profile: JobProfile, cost: CostModel) -> None:
    mem = [cost.memory_gib(profile, valid(profile, layout(tp=tp))) for tp in (1, 2, 4, 8)]
    assert all(a > b for a, b in itertools.pairwise(mem)), mem


def test_a_config_that_cannot_fit_says_so(cost: CostModel) -> None:
    big = profile_from_argv(["--num-layers", "80", "--hidden-size", "8192", "--num-attention-heads", "64",
                             "--seq-length", "2048", "--global-batch-size", "512", "--bf16", "--train-iters", "10"])
    est = cost.estimate(big, big.requested)
    assert est.fits is False
    assert est.mem_gib > cost.gpu.mem_gib
    assert cost.fits(big, big.requested) is False
    split = valid(big, layout(tp=8, pp=8, dp=1))
    assert cost.estimate(big, split).fits is True


# ---------------------------------------------------------------- time


def test_more_gpus_in_the_same_family_shorten_the_iteration(profile: JobProfile, cost: CostModel) -> None:
    times = [cost.iter_time_s(profile, valid(profile, layout(tp=2, pp=4, dp=dp))) for dp in (1, 2, 4, 8)]
    assert all(a > b for a, b in itertools.pairwise(times)), times
    pp_times = [cost.iter_time_s(profile, valid(profile, layout(pp=pp))) for pp in (1, 2, 4, 8)]
    assert all(a > b for a, b in itertools.pairwise(pp_times)), pp_times


def test_job_time_is_startup_plus_iterations_times_iteration(profile: JobProfile, cost: CostModel) -> None:
    cfg = valid(profile, layout(tp=2, pp=2, dp=2))
    iter_s = cost.iter_time_s(profile, cfg)
    assert cost.startup_s(profile) > cost.gpu.startup_s  # checkpoint load adds to the fixed cost
    assert cost.job_time_s(profile, cfg) == pytest.approx(cost.startup_s(profile) + 1000 * iter_s)
    assert cost.job_time_s(profile, cfg, iterations=10) == pytest.approx(cost.startup_s(profile) + 10 * iter_s)
    by_samples = with_plan(profile, train_iters=None, train_samples=512 * 300 + 1)  # rounds up to 301
    assert cost.job_time_s(by_samples, cfg) == pytest.approx(cost.startup_s(profile) + 301 * iter_s)


def test_newer_gpus_are_faster(profile: JobProfile) -> None:
    cfg = valid(profile, layout(tp=2, pp=2, dp=2))
    times = {name: CostModel(hardware.get_gpu_type(name)).iter_time_s(profile, cfg)
             for name in ("H100-80GB", "A100-80GB", "V100-32GB")}
    assert times["H100-80GB"] < times["A100-80GB"] < times["V100-32GB"], times


def test_fp32_is_slower_than_bf16(profile: JobProfile, cost: CostModel) -> None:
    cfg = valid(profile, layout(tp=2, pp=2, dp=2))
    fp32 = with_plan(profile, precision="fp32")
    assert cost.iter_time_s(fp32, cfg) > cost.iter_time_s(profile, cfg)
    assert cost.memory_gib(fp32, cfg) > cost.memory_gib(profile, cfg)


def test_estimate_parts_add_up(profile: JobProfile, cost: CostModel) -> None:
    est = cost.estimate(profile, valid(profile, layout(tp=2, pp=2, dp=4)))
    assert est.iter_time_s == pytest.approx(est.pipeline_s + est.dp_allreduce_s + est.optimizer_s)
    assert est.dp_allreduce_s > 0 and est.optimizer_s > 0
    assert cost.estimate(profile, valid(profile, layout(tp=2, pp=2))).dp_allreduce_s == 0


# ---------------------------------------------------------------- memoised estimates

# Another value for every field of the training plan, and whether it changes an
# iteration's time or memory: whatever the cost model reads must be in its memo's key.
_OTHER_PLAN_VALUES: dict[str, tuple[Any, bool]] = {
    "global_batch_size": (1024, True), "train_iters": (77, False), "train_samples": (5000, False),
    "rampup_batch_size": ((32, 32, 1000), False), "precision": ("fp32", True),
    "use_distributed_optimizer": (True, True), "recompute_granularity": ("full", True),
    "sequence_parallel": (True, True), "save_interval": (10, False),
    # alone, on 24 layers over pp 2: a split Megatron refuses, estimated as the even one
    "embedding_in_pipeline_split": (True, False), "loss_in_pipeline_split": (True, False),
    # alone, without the distributed optimizer: there is no parameter all-gather to hide
    "overlap_grad_reduce": (True, True), "overlap_param_gather": (True, False), "tp_comm_overlap": (True, True),
}


def test_a_memoised_estimate_is_what_a_fresh_model_computes(profile: JobProfile,
                                                           a100: hardware.GpuType) -> None:
    from dataclasses import fields

    from pipeswift_slurm.core.model import TrainingPlan

    assert {f.name for f in fields(TrainingPlan)} == set(_OTHER_PLAN_VALUES), "new field: add it"
    cfg = valid(profile, layout(tp=2, pp=2, dp=2))
    shared = CostModel(a100)
    base = shared.estimate(profile, cfg)
    variants = [(with_plan(profile, **{name: value}), changes)
                for name, (value, changes) in _OTHER_PLAN_VALUES.items()]
    variants += [(replace(profile, shape=replace(profile.shape, **change)), True)
                 for change in ({"hidden_size": profile.shape.hidden_size * 2}, {"seq_length": 4096},
                                {"num_layers": profile.shape.num_layers * 2})]
    for variant, changes in variants:
        got = shared.estimate(variant, cfg)
        assert got == CostModel(a100).estimate(variant, cfg), variant
        assert (got != base) == changes, variant
    assert shared.estimate(profile, cfg) is base


def test_the_memo_tells_apart_a_split_that_counts_the_embedding_and_loss(profile: JobProfile,
                                                                         a100: hardware.GpuType) -> None:
    deep = replace(profile, shape=replace(profile.shape, num_layers=30))
    counted = with_plan(deep, embedding_in_pipeline_split=True, loss_in_pipeline_split=True)
    cfg = layout(tp=2, pp=4, dp=1)
    assert check_config(counted, cfg, job_limits=False) == []  # (30 + 2) / 4 = 8 per rank
    shared = CostModel(a100)
    plain, accounted = shared.estimate(deep, cfg), shared.estimate(counted, cfg)
    assert accounted == CostModel(a100).estimate(counted, cfg)
    # ranks hold 7, 8, 8, 7 layers instead of 8, 8, 7, 7: the first rank holds less
    assert accounted.mem_gib < plain.mem_gib
