"""Megatron argv parsing/rendering, the validity rules of check_config, and agreement with
megatron-core's own calculators (tests marked ``megatron``; skipped without megatron-core)."""

from __future__ import annotations

import itertools
import types
import warnings
from dataclasses import replace
from typing import Any

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from pipeswift_slurm.core import megatron, megatron_rules
from pipeswift_slurm.core.megatron import MegatronArgError, parse_argv, profile_from_argv
from pipeswift_slurm.core.megatron_render import render_args
from pipeswift_slurm.core.megatron_rules import (check_config, enumerate_configs, node_shape, profile_stage_layers,
                                                 stage_layers)
from pipeswift_slurm.core.model import ExecConfig, JobProfile

VP_FLAGS = ("--num-layers-per-virtual-pipeline-stage", "--num-virtual-stages-per-pipeline-rank")


def shape_argv(layers: int = 24, hidden: int = 2048, heads: int = 16, seq: int = 2048, gbs: int = 512,
               extra: tuple[str, ...] = ()) -> list[str]:
    return ["--num-layers", str(layers), "--hidden-size", str(hidden), "--num-attention-heads", str(heads),
            "--seq-length", str(seq), "--global-batch-size", str(gbs), "--bf16", "--train-iters", "100",
            *extra]


def cfg_on(gpus_per_node: int = 8, **kw: Any) -> ExecConfig:
    """An ExecConfig placed on the fewest equal nodes; M defaults to 512/(mbs*dp)."""
    kw.setdefault("tp", 1)
    kw.setdefault("pp", 1)
    kw.setdefault("dp", 1)
    kw.setdefault("micro_batch_size", 1)
    kw.setdefault("num_micro_batches", max(1, 512 // (kw["micro_batch_size"] * kw["dp"])))
    cfg = ExecConfig(**kw)
    nodes, gpn = node_shape(cfg.world_size, gpus_per_node)
    return replace(cfg, num_nodes=nodes, gpus_per_node=gpn)


def flags(problems: list[megatron_rules.Problem]) -> list[str]:
    return [p.flag for p in problems]


# ---------------------------------------------------------------- parsing


def test_parse_accepts_space_and_equals_forms_alike() -> None:
    spaced = parse_argv(["--num-layers", "24", "--micro-batch-size", "2", "--bf16"]).values
    inline = parse_argv(["--num-layers=24", "--micro-batch-size=2", "--bf16"]).values
    assert spaced == inline == {"--num-layers": 24, "--micro-batch-size": 2, "--bf16": True}


def test_parse_reads_rampup_triple_and_records_positions() -> None:
    parsed = parse_argv(["--lr", "1e-4", "--rampup-batch-size", "32", "32", "1000", "--seed", "3"])
    assert parsed.values == {"--rampup-batch-size": (32, 32, 1000)}
    assert parsed.positions == {"--rampup-batch-size": 2}


def test_parse_ignores_unknown_flags_and_keeps_last_repeat() -> None:
    argv = ["--lr", "3e-4", "--data-path", "/data/my corpus", "--micro-batch-size", "1",
            "--micro-batch-size", "4", "--tokenizer-type", "GPT2BPETokenizer"]
    assert parse_argv(argv).values == {"--micro-batch-size": 4}


@pytest.mark.parametrize("argv, flag", [
    (["--num-layers", "abc"], "--num-layers"),
    (["--num-layers=abc"], "--num-layers"),
    (["--micro-batch-size"], "--micro-batch-size"),
    (["--micro-batch-size", "--bf16"], "--micro-batch-size"),
    (["--bf16=1"], "--bf16"),
    (["--rampup-batch-size", "32", "32"], "--rampup-batch-size"),
    (["--rampup-batch-size=32"], "--rampup-batch-size"),
])
def test_parse_malformed_flag_names_the_flag(argv: list[str], flag: str) -> None:
    with pytest.raises(MegatronArgError) as err:
        parse_argv(argv)
    assert err.value.flag == flag
    assert str(err.value).startswith(flag)


@pytest.mark.parametrize("drop", megatron.REQUIRED_SHAPE_FLAGS)
def test_profile_missing_shape_flag_names_it(gpt_argv: list[str], drop: str) -> None:
    i = gpt_argv.index(drop)
    argv = gpt_argv[:i] + gpt_argv[i + 2:]
    with pytest.raises(MegatronArgError) as err:
        profile_from_argv(argv)
    assert err.value.flag == drop


def test_profile_applies_megatron_defaults(profile: JobProfile) -> None:
    shape, plan, user = profile.shape, profile.plan, profile.requested
    assert (shape.ffn_hidden_size, shape.kv_channels, shape.num_query_groups) == (4 * 2048, 128, 16)
    assert (plan.global_batch_size, plan.train_iters, plan.precision) == (512, 1000, "bf16")
    assert (user.tp, user.pp, user.dp, user.micro_batch_size, user.num_micro_batches) == (1, 1, 1, 1, 512)


def test_profile_refuses_a_config_megatron_would_refuse(gpt_argv: list[str]) -> None:
    with pytest.raises(MegatronArgError) as err:
        profile_from_argv(gpt_argv + ["--pipeline-model-parallel-size", "5"])
    assert err.value.flag == "--pipeline-model-parallel-size"


# ---------------------------------------------------------------- rendering


def test_render_replaces_in_place_keeping_form_and_order(profile: JobProfile) -> None:
    argv = ["--lr", "1e-4", "--tensor-model-parallel-size", "1", "--seed", "7",
            "--pipeline-model-parallel-size=1", "--data-path", "/d/x", "--micro-batch-size", "1",
            "--global-batch-size", "512"]
    cfg = cfg_on(tp=2, pp=4, dp=1, micro_batch_size=2, num_micro_batches=256)
    out = render_args(argv, cfg, profile)
    assert out == ["--lr", "1e-4", "--tensor-model-parallel-size", "2", "--seed", "7",
                   "--pipeline-model-parallel-size=4", "--data-path", "/d/x", "--micro-batch-size", "2",
                   "--global-batch-size", "512"]


def test_render_appends_missing_flags_and_keeps_global_batch(gpt_argv: list[str], profile: JobProfile) -> None:
    cfg = cfg_on(tp=2, pp=2, dp=2, micro_batch_size=4, num_micro_batches=32)
    out = render_args(gpt_argv, cfg, profile)
    assert out[:len(gpt_argv)] == gpt_argv  # nothing of the user's moved
    values = parse_argv(out).values
    assert values["--tensor-model-parallel-size"] == 2
    assert values["--pipeline-model-parallel-size"] == 2
    assert values["--micro-batch-size"] == 4
    assert values["--global-batch-size"] == 512


def test_render_never_duplicates_and_is_idempotent(profile: JobProfile) -> None:
    argv = ["--micro-batch-size", "1", "--tensor-model-parallel-size", "1", "--micro-batch-size=2",
            "--tensor-model-parallel-size", "4", "--log-interval", "10"]
    cfg = cfg_on(tp=2, pp=2, dp=2, micro_batch_size=4, num_micro_batches=32)
    once = render_args(argv, cfg, profile)
    for flag in megatron.FLAGS:
        assert sum(1 for a in once if a == flag or a.startswith(flag + "=")) <= 1, (flag, once)
    assert render_args(once, cfg, profile) == once
    assert once.index("--log-interval") + 1 == once.index("10")


def test_render_keeps_unrelated_flags_and_their_order(profile: JobProfile) -> None:
    unrelated = ["--lr", "1e-4", "--data-path", "a b.bin", "--save", "/ckpt", "--no-masked-softmax-fusion",
                 "--eval-iters", "10"]
    argv = unrelated[:4] + ["--tensor-model-parallel-size", "1"] + unrelated[4:]
    out = render_args(argv, cfg_on(tp=4, pp=2, dp=1, micro_batch_size=2, num_micro_batches=256), profile)
    assert [a for a in out if a in unrelated] == unrelated


@pytest.mark.parametrize("vp_flag", [["--num-virtual-stages-per-pipeline-rank", "2"],
                                     ["--num-layers-per-virtual-pipeline-stage", "3"]])
def test_render_removes_vp_flags_when_not_interleaved(gpt_argv: list[str], vp_flag: list[str]) -> None:
    argv = gpt_argv + ["--pipeline-model-parallel-size", "4"] + vp_flag
    prof = profile_from_argv(argv, world_size=4)
    assert prof.requested.vp == 2
    out = render_args(argv, cfg_on(pp=4, dp=1), prof)
    assert not any(a.split("=")[0] in VP_FLAGS for a in out)
    assert "2" not in out and "3" not in out  # the values went with their flags


def test_render_keeps_layers_per_virtual_stage_spelling(gpt_argv: list[str]) -> None:
    argv = gpt_argv + ["--pipeline-model-parallel-size", "4", "--num-layers-per-virtual-pipeline-stage", "3"]
    prof = profile_from_argv(argv, world_size=4)
    cfg = cfg_on(pp=2, vp=3, dp=2, num_micro_batches=256)
    out = render_args(argv, cfg, prof)
    values = parse_argv(out).values
    assert values["--num-layers-per-virtual-pipeline-stage"] == 4  # 24 layers / pp 2 / vp 3
    assert "--num-virtual-stages-per-pipeline-rank" not in values
    assert profile_from_argv(out, world_size=4).requested.vp == 3


def test_render_uses_virtual_stages_spelling_by_default(gpt_argv: list[str], profile: JobProfile) -> None:
    out = render_args(gpt_argv, cfg_on(pp=4, vp=2, dp=2, num_micro_batches=256), profile)
    values = parse_argv(out).values
    assert values["--num-virtual-stages-per-pipeline-rank"] == 2
    assert "--num-layers-per-virtual-pipeline-stage" not in values


def test_render_drops_sequence_parallel_when_tp_is_one(gpt_argv: list[str]) -> None:
    argv = gpt_argv + ["--tensor-model-parallel-size", "2", "--sequence-parallel"]
    prof = profile_from_argv(argv)
    out = render_args(argv, cfg_on(tp=1, pp=2, dp=1), prof)
    assert "--sequence-parallel" not in out


def test_render_drops_tp_comm_overlap_when_tp_is_one(gpt_argv: list[str]) -> None:
    # Megatron's validate_args turns sequence parallelism off at tp 1, then asserts that TP
    # overlap has it: the overlap flag must go with it; at tp 2 both stay
    argv = gpt_argv + ["--tensor-model-parallel-size", "2", "--sequence-parallel", "--tp-comm-overlap"]
    prof = profile_from_argv(argv)
    out = render_args(argv, cfg_on(tp=1, pp=2, dp=1), prof)
    assert "--tp-comm-overlap" not in out and "--sequence-parallel" not in out
    kept = render_args(argv, cfg_on(tp=2, pp=1, dp=1), prof)
    assert "--tp-comm-overlap" in kept and "--sequence-parallel" in kept


_shapes = st.tuples(st.sampled_from([4, 6, 8, 12, 16, 24, 32]),  # layers
                    st.sampled_from([8, 16, 32]),  # heads
                    st.sampled_from([512, 1024, 2048]),  # seq
                    st.sampled_from([8, 16, 48, 64, 96, 512]))  # global batch


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(shape=_shapes, gpus=st.integers(1, 32), per_vp_spelling=st.booleans(), data=st.data())
def test_render_then_parse_round_trips_the_layout(shape: tuple[int, int, int, int], gpus: int,
                                                  per_vp_spelling: bool, data: st.DataObject) -> None:
    layers, heads, seq, gbs = shape
    extra: tuple[str, ...] = ("--lr", "1e-4", "--data-path", "/data/corpus a")
    if per_vp_spelling:  # with pp=1 this spelling means vp=1; it must survive into the rendered argv
        extra += ("--num-layers-per-virtual-pipeline-stage", str(layers))
    argv = shape_argv(layers, heads * 64, heads, seq, gbs, extra)
    prof = profile_from_argv(argv).with_range(1, 64)
    configs = list(enumerate_configs(prof, gpus, 8))
    assume(configs)
    cfg = data.draw(st.sampled_from(configs))
    out = render_args(argv, cfg, prof)
    back = profile_from_argv(out, world_size=cfg.gpus, gpus_per_node=8)
    got = back.requested
    assert (got.tp, got.pp, got.dp, got.micro_batch_size, got.vp, got.num_micro_batches) == (
        cfg.tp, cfg.pp, cfg.dp, cfg.micro_batch_size, cfg.vp, cfg.num_micro_batches)
    assert back.plan.global_batch_size == gbs
    assert got == cfg
    if cfg.vp > 1:  # Megatron takes the per-stage spelling only with an even split
        wanted = VP_FLAGS[0] if per_vp_spelling and not megatron_rules.uneven(cfg) else VP_FLAGS[1]
        assert [a for a in out if a in VP_FLAGS] == [wanted]
    assert [a for a in out if a in extra and a.startswith("--") and a not in VP_FLAGS] == [
        "--lr", "--data-path"]


# ---------------------------------------------------------------- validity rules


def test_rule_world_size_matches_nodes_times_gpus(profile: JobProfile) -> None:
    good = cfg_on(tp=2, pp=2, dp=2, num_micro_batches=256)
    assert check_config(profile, good, job_limits=False) == []
    bad = replace(good, num_nodes=2, gpus_per_node=8)  # 16 GPUs placed, world 8
    assert flags(check_config(profile, bad, job_limits=False)) == ["--nodes"]


def test_node_shape_tries_per_node_counts_not_node_counts() -> None:
    """node_shape once tried every node count up to the GPU count: a prime count near the
    131,072-GPU bound cost that many divisions, and ``plan --gpus 1-131072`` ran for hours."""

    class Counted(int):
        divisions = 0

        def __mod__(self, other: Any) -> Any:
            Counted.divisions += 1
            return int(self) % other

    assert node_shape(Counted(131_071), 8) == (131_071, 1) and Counted.divisions <= 8
    assert [node_shape(g, 8) for g in (7, 8, 12, 24, 26, 131_072)] == [(1, 7), (1, 8), (2, 6), (3, 8), (13, 2),
                                                                        (16_384, 8)]


def test_rule_heads_divisible_by_tp(profile: JobProfile) -> None:
    assert check_config(profile, cfg_on(tp=4), job_limits=False) == []
    problems = check_config(profile, cfg_on(tp=3), job_limits=False)
    assert flags(problems) == ["--tensor-model-parallel-size"]
    assert "16 attention heads" in problems[0].message


def test_rule_query_groups_divisible_by_tp() -> None:
    gqa = profile_from_argv(shape_argv(extra=("--group-query-attention", "--num-query-groups", "2")))
    assert gqa.shape.num_query_groups == 2
    assert check_config(gqa, cfg_on(tp=2), job_limits=False) == []
    assert flags(check_config(gqa, cfg_on(tp=4), job_limits=False)) == ["--num-query-groups"]


def test_rule_tensor_parallel_group_stays_inside_a_node() -> None:
    prof = profile_from_argv(shape_argv(heads=32, hidden=4096))
    assert check_config(prof, cfg_on(tp=8, dp=2, num_micro_batches=256), job_limits=False) == []
    too_wide = cfg_on(tp=16, dp=1)  # 2 nodes x 8: the group spans both
    assert flags(check_config(prof, too_wide, job_limits=False)) == ["--tensor-model-parallel-size"]
    straddles = cfg_on(tp=4, dp=3, num_micro_batches=512 // 3)  # 12 GPUs = 2 nodes x 6
    assert (straddles.num_nodes, straddles.gpus_per_node) == (2, 6)
    assert "--tensor-model-parallel-size" in flags(check_config(prof, straddles, job_limits=False))


def test_rule_context_parallel_needs_seq_divisible_by_2cp(profile: JobProfile) -> None:
    assert check_config(profile, cfg_on(cp=2), job_limits=False) == []
    assert flags(check_config(profile, cfg_on(cp=3), job_limits=False)) == ["--context-parallel-size"]


def test_rule_even_split(profile: JobProfile) -> None:
    assert check_config(profile, cfg_on(pp=4), job_limits=False) == []
    assert stage_layers(24, cfg_on(pp=4)) == [6, 6, 6, 6]
    assert flags(check_config(profile, cfg_on(pp=5), job_limits=False)) == ["--pipeline-model-parallel-size"]
    assert stage_layers(24, cfg_on(pp=5)) is None


def test_rule_uneven_first_last_split(profile: JobProfile) -> None:
    ok = cfg_on(pp=5, decoder_first_pipeline_num_layers=6, decoder_last_pipeline_num_layers=6)
    assert stage_layers(24, ok) == [6, 4, 4, 4, 6]
    assert check_config(profile, ok, job_limits=False) == []
    first_only = cfg_on(pp=4, decoder_first_pipeline_num_layers=3)
    assert stage_layers(24, first_only) == [3, 7, 7, 7]
    bad = cfg_on(pp=5, decoder_first_pipeline_num_layers=4, decoder_last_pipeline_num_layers=4)  # 16 over 3
    assert stage_layers(24, bad) is None
    assert flags(check_config(profile, bad, job_limits=False)) == ["--decoder-first-pipeline-num-layers"]
    single = cfg_on(pp=1, decoder_first_pipeline_num_layers=6)
    assert flags(check_config(profile, single, job_limits=False)) == ["--decoder-first-pipeline-num-layers"]


def test_rule_uneven_split_from_argv_matches_facts_example(gpt_argv: list[str]) -> None:
    argv = gpt_argv + ["--pipeline-model-parallel-size", "5", "--decoder-first-pipeline-num-layers", "6",
                       "--decoder-last-pipeline-num-layers", "6"]
    prof = profile_from_argv(argv, world_size=5)
    assert stage_layers(24, prof.requested) == [6, 4, 4, 4, 6]
    with pytest.raises(MegatronArgError) as err:
        profile_from_argv([a if a != "6" else "4" for a in argv], world_size=5)
    assert err.value.flag == "--decoder-first-pipeline-num-layers"


def test_rule_uneven_split_refuses_empty_stages(profile: JobProfile) -> None:
    # megatron-core refuses a middle stage with no layers and a first stage of 0 layers
    # (TransformerConfig: "0 middle layers remaining but 1 middle PP stages available",
    # "num_layers_in_first_pipeline_stage must be larger than 0").
    empty_middle = cfg_on(pp=3, decoder_first_pipeline_num_layers=12, decoder_last_pipeline_num_layers=12)
    assert stage_layers(24, empty_middle) is None
    assert check_config(profile, empty_middle, job_limits=False) != []
    zero_first = cfg_on(pp=4, decoder_first_pipeline_num_layers=0)
    assert check_config(profile, zero_first, job_limits=False) != []


def test_rule_interleaving(profile: JobProfile) -> None:
    assert check_config(profile, cfg_on(pp=4, vp=2, num_micro_batches=512), job_limits=False) == []
    assert "--num-virtual-stages-per-pipeline-rank" in flags(check_config(profile, cfg_on(pp=1, vp=2),
                                                                          job_limits=False))
    problems = check_config(profile, cfg_on(pp=4, vp=4), job_limits=False)  # 6 layers per stage, 4 chunks
    assert flags(problems) == ["--num-virtual-stages-per-pipeline-rank"]


@pytest.mark.parametrize("gbs, dp, ok", [(32, 4, True), (24, 4, False), (24, 8, False)])
def test_rule_interleaving_needs_micro_batches_multiple_of_pp(gbs: int, dp: int, ok: bool) -> None:
    prof = profile_from_argv(shape_argv(gbs=gbs))
    cfg = cfg_on(pp=4, vp=2, dp=dp, num_micro_batches=gbs // dp)  # M = 8, 6, 3
    problems = check_config(prof, cfg, job_limits=False)
    assert (problems == []) is ok
    if not ok:
        assert flags(problems) == ["--micro-batch-size"]
        assert check_config(prof, replace(cfg, vp=1), job_limits=False) == []


def test_rule_global_batch_divisible_by_micro_batch_times_dp(profile: JobProfile) -> None:
    assert check_config(profile, cfg_on(micro_batch_size=4, dp=8, num_micro_batches=16), job_limits=False) == []
    assert flags(check_config(profile, cfg_on(micro_batch_size=3, num_micro_batches=170),
                              job_limits=False)) == ["--global-batch-size"]
    wrong_m = cfg_on(micro_batch_size=4, dp=8, num_micro_batches=8)
    assert flags(check_config(profile, wrong_m, job_limits=False)) == ["--micro-batch-size"]


def test_rule_batch_sizes_must_be_positive(profile: JobProfile) -> None:
    assert check_config(profile, cfg_on(num_micro_batches=0), job_limits=False) != []
    assert check_config(profile, replace(cfg_on(), micro_batch_size=0), job_limits=False) != []


def _ramp_profile(ramp: tuple[int, int, int], gbs: int = 512) -> JobProfile:
    prof = profile_from_argv(shape_argv(gbs=gbs))
    return replace(prof, plan=replace(prof.plan, rampup_batch_size=ramp))


def test_rampup_parsed_from_argv() -> None:
    prof = profile_from_argv(shape_argv(extra=("--rampup-batch-size", "32", "32", "1000")), world_size=8)
    assert prof.plan.rampup_batch_size == (32, 32, 1000)


@pytest.mark.parametrize("ramp, mbs, dp, ok", [
    ((32, 32, 1000), 1, 8, True),       # 32, 64, ..., 512 all divide by 8
    ((32, 100, 1000), 1, 8, False),     # (512 - 32) % 100 != 0
    ((0, 32, 1000), 1, 8, False),       # start must be positive
    ((32, 0, 1000), 1, 8, False),       # increment must be positive
    ((32, 32, -1), 1, 8, False),        # ramp-up samples must be >= 0
    ((16, 16, 1000), 4, 8, False),      # first step 16 is not a multiple of 4*8
    ((1024, 32, 1000), 1, 8, False),    # start above the global batch (Megatron asserts)
])
def test_rule_rampup(ramp: tuple[int, int, int], mbs: int, dp: int, ok: bool) -> None:
    prof = _ramp_profile(ramp)
    cfg = cfg_on(micro_batch_size=mbs, dp=dp, num_micro_batches=512 // (mbs * dp))
    problems = check_config(prof, cfg, job_limits=False)
    assert (problems == []) is ok, problems
    if not ok:
        assert flags(problems) == ["--rampup-batch-size"]


def test_job_limits(profile: JobProfile) -> None:
    prof = replace(profile.with_range(4, 8), min_micro_batch_size=2, allowed_pp=(2, 4))
    good = cfg_on(pp=2, dp=2, micro_batch_size=2, num_micro_batches=128)
    assert check_config(prof, good) == []
    assert flags(check_config(prof, cfg_on(pp=2, dp=8, micro_batch_size=2, num_micro_batches=32))) == [
        "--pipeswift-gpus"]
    small_mbs = cfg_on(pp=2, dp=2, micro_batch_size=1, num_micro_batches=256)
    assert flags(check_config(prof, small_mbs)) == ["--pipeswift-min-micro-batch"]
    assert flags(check_config(prof, cfg_on(pp=3, dp=2, micro_batch_size=2, num_micro_batches=128))) == [
        "--pipeswift-pp"]
    assert check_config(prof, small_mbs, job_limits=False) == []  # limits are the job's, not Megatron's


def test_enumerate_configs_are_all_valid_and_on_exact_gpus(profile: JobProfile) -> None:
    prof = profile.with_range(1, 64)
    for gpus in (1, 2, 3, 8, 12, 16):
        configs = list(enumerate_configs(prof, gpus, 8))
        assert configs, gpus
        for cfg in configs:
            assert cfg.gpus == gpus
            assert check_config(prof, cfg) == []


# ---------------------------------------------------------------- megatron-core cross-checks


@pytest.fixture(scope="module")
def mcore() -> types.SimpleNamespace:
    """megatron-core's helpers, imported once per module (slow: ~5-10 s)."""
    pytest.importorskip("megatron.core", reason="megatron-core is not importable (pip install .[megatron])",
                        exc_type=ImportError)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import torch
        from megatron.core import num_microbatches_calculator as nmc
        from megatron.core.transformer.transformer_block import get_num_layers_to_build
        from megatron.core.transformer.transformer_config import TransformerConfig
        from megatron.core.transformer.transformer_layer import get_transformer_layer_offset
    return types.SimpleNamespace(torch=torch, nmc=nmc, TransformerConfig=TransformerConfig,
                                 get_num_layers_to_build=get_num_layers_to_build,
                                 get_transformer_layer_offset=get_transformer_layer_offset)


def _mcore_m(mcore: types.SimpleNamespace, gbs: int, mbs: int, dp: int) -> int | None:
    try:
        return int(mcore.nmc.ConstantNumMicroBatchesCalculator(gbs, mbs, dp, False, 0).get())
    except AssertionError:
        return None


@pytest.mark.megatron
def test_constant_calculator_agrees_on_accept_and_m(mcore: types.SimpleNamespace) -> None:
    for gbs in (8, 12, 24, 64, 96, 512):
        prof = profile_from_argv(shape_argv(gbs=gbs))
        for mbs, dp in itertools.product((1, 2, 3, 4, 8), (1, 2, 3, 4, 8, 16)):
            want = _mcore_m(mcore, gbs, mbs, dp)
            m = max(1, gbs // (mbs * dp))
            problems = check_config(prof, cfg_on(micro_batch_size=mbs, dp=dp, num_micro_batches=m),
                                    job_limits=False)
            assert (problems == []) is (want is not None), (gbs, mbs, dp, problems)
            if want is not None:
                assert want == m
                ours = {c.micro_batch_size: c.num_micro_batches
                        for c in enumerate_configs(prof.with_range(1, 64), dp, 8, vary_tp=False)
                        if c.dp == dp and c.pp == 1}
                assert ours.get(mbs) == want, (gbs, mbs, dp, ours)


def _mcore_ramp_ok(mcore: types.SimpleNamespace, gbs: int, mbs: int, dp: int,
                   ramp: tuple[int, int, int]) -> tuple[bool, int | None]:
    start, inc, _ = ramp
    samples = 4 * max(1, (gbs - start) // inc)  # 4 samples per ramp step
    try:
        calc = mcore.nmc.RampupBatchsizeNumMicroBatchesCalculator(gbs, mbs, dp, False, 0, start, inc, samples)
        for consumed in range(samples + 2):
            calc.update(consumed, consistency_check=True)
        return True, int(calc.get())
    except AssertionError:
        return False, None


@pytest.mark.megatron
def test_rampup_calculator_agrees_on_accept_and_final_m(mcore: types.SimpleNamespace) -> None:
    gbs = 96
    for start, inc in itertools.product((8, 16, 24, 48, 128), (8, 12, 16, 24)):
        if start == gbs:
            continue  # megatron-core divides by zero increments there
        for mbs, dp in itertools.product((1, 2, 4), (1, 2, 4)):
            ok, m = _mcore_ramp_ok(mcore, gbs, mbs, dp, (start, inc, 0))
            prof = _ramp_profile((start, inc, 1000), gbs=gbs)
            problems = check_config(prof, cfg_on(micro_batch_size=mbs, dp=dp, num_micro_batches=gbs // (mbs * dp)),
                                    job_limits=False)
            theirs = "accepts" if ok else "refuses"
            assert (problems == []) is ok, (f"ramp-up start {start}, increment {inc}, gbs {gbs}, mbs {mbs},"
                                            f" dp {dp}: megatron-core {theirs}, ours {problems or 'accept'}")
            if ok:
                assert m == gbs // (mbs * dp)


def _tconfig(mcore: types.SimpleNamespace, **kw: object) -> object:
    base: dict[str, object] = {"num_layers": 24, "hidden_size": 256, "num_attention_heads": 16, "bf16": True,
                                   "pipeline_dtype": mcore.torch.bfloat16}
    base.update(kw)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return mcore.TransformerConfig(**base)


@pytest.mark.megatron
def test_transformer_config_agrees_on_heads_divisible_by_tp(mcore: types.SimpleNamespace) -> None:
    for heads, tp in itertools.product((8, 12, 16, 24), (1, 2, 3, 4, 8)):
        prof = profile_from_argv(shape_argv(heads=heads, hidden=heads * 64))
        ours = check_config(prof, cfg_on(tp=tp), gpus_per_node=8, job_limits=False)
        ours_heads = [p for p in ours if "attention heads" in p.message]
        try:
            _tconfig(mcore, num_attention_heads=heads, hidden_size=heads * 16, tensor_model_parallel_size=tp)
            theirs_ok = True
        except ValueError:
            theirs_ok = False
        assert (ours_heads == []) is theirs_ok, (heads, tp, ours)


def _uneven_cases() -> list[tuple[int, int | None, int | None]]:
    cases = []
    for pp in range(2, 7):  # pp=1 with first+last: megatron-core 0.16.1 silently builds only `last` layers
        for first, last in itertools.product((None, 0, 1, 2, 4, 6, 8, 12), (None, 1, 4, 6, 12)):
            if first is None and last is None:
                continue  # even split: TransformerConfig does not check it
            if (first or 0) + (last or 0) > 24:
                continue  # megatron-core 0.16.1 builds negative stages there
            cases.append((pp, first, last))
    return cases


@pytest.mark.megatron
def test_transformer_config_agrees_on_uneven_split(mcore: types.SimpleNamespace) -> None:
    mismatches = []
    for pp, first, last in _uneven_cases():
        cfg = cfg_on(pp=pp, decoder_first_pipeline_num_layers=first, decoder_last_pipeline_num_layers=last)
        ours = stage_layers(24, cfg)
        try:
            tc = _tconfig(mcore, pipeline_model_parallel_size=pp, num_layers_in_first_pipeline_stage=first,
                          num_layers_in_last_pipeline_stage=last)
            theirs = [mcore.get_num_layers_to_build(tc, pp_rank=r) for r in range(pp)]
        except (ValueError, AssertionError):
            theirs = None
        if ours != theirs:
            mismatches.append(((pp, first, last), ours, theirs))
    assert mismatches == [], f"(pp, first, last), ours, megatron-core: {mismatches}"


@pytest.mark.megatron
@pytest.mark.parametrize("pp, vp, first, last", [
    (1, 1, None, None), (2, 1, None, None), (3, 1, None, None), (4, 1, None, None), (6, 1, None, None),
    (8, 1, None, None), (24, 1, None, None), (5, 1, 6, 6), (4, 1, 3, None), (4, 1, None, 3), (2, 2, None, None),
    (4, 2, None, None), (4, 3, None, None), (3, 4, None, None), (2, 3, None, None),
])
def test_layer_mapping_agrees_with_megatron_core(mcore: types.SimpleNamespace, pp: int, vp: int,
                                                 first: int | None, last: int | None) -> None:
    cfg = cfg_on(pp=pp, vp=vp, decoder_first_pipeline_num_layers=first, decoder_last_pipeline_num_layers=last)
    ours = stage_layers(24, cfg)
    assert ours is not None
    kw: dict[str, object] = {"pipeline_model_parallel_size": pp, "num_layers_in_first_pipeline_stage": first,
                                 "num_layers_in_last_pipeline_stage": last}
    if vp > 1:
        kw["virtual_pipeline_model_parallel_size"] = vp
    tc = _tconfig(mcore, **kw)
    stages = [None] if vp == 1 else list(range(vp))
    theirs = [sum(mcore.get_num_layers_to_build(tc, vp_stage=v, pp_rank=r) for v in stages) for r in range(pp)]
    assert theirs == ours
    if vp == 1:
        offsets = [mcore.get_transformer_layer_offset(tc, pp_rank=r) for r in range(pp)]
        assert offsets == [sum(ours[:r]) for r in range(pp)]
    else:  # chunk v of rank r starts after v full rounds of pp chunks
        chunk = ours[0] // vp
        offsets = [mcore.get_transformer_layer_offset(tc, vp_stage=v, pp_rank=0) for v in range(vp)]
        assert offsets == [v * pp * chunk for v in range(vp)]


# ------------------------------------------------------------------ checkpoints (preemption)

_BASE = ["--num-layers", "4", "--hidden-size", "64", "--num-attention-heads", "4", "--seq-length", "128",
         "--micro-batch-size", "1", "--global-batch-size", "8", "--train-iters", "10"]


@pytest.mark.parametrize("extra, interval", [
    (["--save", "/ck", "--load", "/ck", "--save-interval", "5"], 5),
    (["--save=/ck", "--load=/ck", "--save-interval=5"], 5),
    (["--save", "/ck", "--save-interval", "5"], None),  # saves but never loads: a requeue starts over
    (["--save", "/ck", "--load", "/ck"], None),  # no interval: Megatron saves only at the end
    ([], None),
])
def test_a_job_resumes_only_when_it_saves_and_loads_checkpoints(extra: list[str], interval: int | None) -> None:
    profile = megatron.profile_from_argv(_BASE + extra, world_size=1)
    assert profile.plan.save_interval == interval


def test_the_profile_token_records_that_checkpoints_exist_but_never_their_paths() -> None:
    from pipeswift_slurm.submit.training import megatron_words

    words = ["pretrain_gpt.py", *_BASE, "--save", "/home/alice/secret", "--load=/home/alice/secret",
             "--save-interval", "5", "--data-path", "/home/alice/data"]
    recorded = megatron_words(words)
    assert not any("alice" in w for w in recorded)
    assert recorded[-5:] == ["--save", "-", "--load=-", "--save-interval", "5"]
    assert megatron.profile_from_argv(recorded, world_size=1).plan.save_interval == 5
    with pytest.raises(megatron.MegatronArgError, match="--save-interval"):
        megatron.profile_from_argv(_BASE + ["--save", "/ck", "--load", "/ck", "--save-interval", "0"], world_size=1)


@pytest.mark.megatron
def test_transformer_config_agrees_on_embedding_and_loss_in_the_split(mcore: types.SimpleNamespace) -> None:
    mismatches = []
    for layers, pp, vp, embedding, loss in itertools.product((6, 7, 22, 24, 30), (1, 2, 3, 4, 8), (1, 2, 4),
                                                              (False, True), (False, True)):
        if not (embedding or loss) or (vp > 1 and pp < 2):
            continue
        prof = profile_from_argv(shape_argv(layers=layers) + ["--pipeline-model-parallel-size", "1"]
                                 + ["--account-for-embedding-in-pipeline-split"] * embedding
                                 + ["--account-for-loss-in-pipeline-split"] * loss, world_size=1)
        cfg = cfg_on(pp=pp, vp=vp, micro_batch_size=1, num_micro_batches=8)
        ours = profile_stage_layers(prof, cfg)
        if any(p.flag == "--num-virtual-stages-per-pipeline-rank" for p in check_config(prof, cfg, job_limits=False)):
            ours = None
        kw: dict[str, object] = {"num_layers": layers, "pipeline_model_parallel_size": pp,
                                 "account_for_embedding_in_pipeline_split": embedding,
                                 "account_for_loss_in_pipeline_split": loss}
        if vp > 1:
            kw["virtual_pipeline_model_parallel_size"] = vp
        stages = [None] if vp == 1 else list(range(vp))
        try:
            tc = _tconfig(mcore, **kw)
            theirs = [sum(mcore.get_num_layers_to_build(tc, vp_stage=v, pp_rank=r) for v in stages) for r in range(pp)]
        except (ValueError, AssertionError):
            theirs = None
        if ours != theirs:
            mismatches.append(((layers, pp, vp, embedding, loss), ours, theirs))
    assert mismatches == [], f"(layers, pp, vp, embedding, loss), ours, megatron-core: {mismatches}"


def test_a_split_counting_the_embedding_and_loss_runs_126_layers_on_8_stages() -> None:
    # Llama 3.1 405B as NeMo runs it (dgxc-benchmarking v25.04): tp8 pp8 vp8, (126 + 2) / 8 = 16 per rank
    argv = shape_argv(layers=126) + ["--pipeline-model-parallel-size", "8", "--num-virtual-stages-per-pipeline-rank",
                                     "8", "--global-batch-size", "64"]
    with pytest.raises(MegatronArgError, match="126 layers cannot be split over 8"):
        profile_from_argv(argv, world_size=8)
    prof = profile_from_argv(argv + ["--account-for-embedding-in-pipeline-split",
                                     "--account-for-loss-in-pipeline-split"], world_size=8)
    assert profile_stage_layers(prof, prof.requested) == [15] + [16] * 6 + [15]
    with pytest.raises(MegatronArgError, match="cannot be combined"):
        profile_from_argv(argv + ["--account-for-loss-in-pipeline-split", "--decoder-last-pipeline-num-layers", "8"],
                          world_size=8)
    per_stage = shape_argv(layers=126) + [
        "--global-batch-size", "64", "--pipeline-model-parallel-size", "8", "--num-layers-per-virtual-pipeline-stage",
        "2", "--account-for-embedding-in-pipeline-split", "--account-for-loss-in-pipeline-split"]
    assert profile_from_argv(per_stage, world_size=8).requested.vp == 8


def test_a_decided_uneven_layout_round_trips_through_the_token_and_renders_its_flags() -> None:
    from pipeswift_slurm.core.costmodel import CostModel
    from pipeswift_slurm.core.hardware import get_gpu_type
    from pipeswift_slurm.core.planner import Planner
    from pipeswift_slurm.core.token import decode_decision, encode_decision

    argv = ["pretrain_gpt.py", *shape_argv(), "--tensor-model-parallel-size", "1", "--lr", "1e-4"]
    prof = profile_from_argv(argv, world_size=8).with_range(1, 8)
    decided = Planner(CostModel(get_gpu_type("A100-80GB")), gpus_per_node=8).best(prof, 5)
    assert decided is not None and decided.config.pp == 5 and megatron_rules.uneven(decided.config)
    cfg, _ = decode_decision(encode_decision(decided.config, 1000))
    assert cfg == decided.config
    ran, why = megatron_rules.config_for_allocation(cfg, prof, 1, 5)
    assert ran == cfg, why
    out = render_args(argv, ran, prof)
    values = parse_argv(out).values
    assert values["--pipeline-model-parallel-size"] == 5
    assert (values.get("--decoder-first-pipeline-num-layers"), values.get("--decoder-last-pipeline-num-layers")) == (
        cfg.decoder_first_pipeline_num_layers, cfg.decoder_last_pipeline_num_layers)
    back = profile_from_argv(out, world_size=5)
    assert back.requested == cfg and stage_layers(24, back.requested) == stage_layers(24, cfg)
    assert out[:1] == ["pretrain_gpt.py"] and "--lr" in out
