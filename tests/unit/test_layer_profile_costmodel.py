"""A measured layer profile (pipeswift profile) replaces the table's layer time."""

from dataclasses import replace

from pipeswift_slurm.cli.main import pipeswift
from pipeswift_slurm.core.costmodel import CostModel
from pipeswift_slurm.measure.profiler import LayerProfile, MicroBatchTiming, write_profile_toml


def _layer_profile(shape, ms_at_1=30.0):
    return LayerProfile("A100-80GB", "test", "torch", "sdpa", "bf16", shape.hidden_size, shape.seq_length,
                        shape.num_attention_heads, shape.num_query_groups, shape.kv_channels, shape.ffn_hidden_size,
                        shape.swiglu, (MicroBatchTiming(1, ms_at_1, 1.0), MicroBatchTiming(2, 2 * ms_at_1, 1.0)))


def test_measured_layer_time_is_used_for_a_matching_shape(a100, profile):
    table = CostModel(a100)
    measured = CostModel(a100, layer_profile=_layer_profile(profile.shape))
    cfg = replace(profile.requested, micro_batch_size=1, num_micro_batches=profile.plan.global_batch_size
                  // profile.requested.dp)
    fwd, bwd = measured.layer_times_s(profile, cfg)
    assert abs(fwd - 0.010) < 1e-9 and abs(bwd - 0.020) < 1e-9  # 30 ms fwd+bwd = 10 + 20
    assert measured.iter_time_s(profile, cfg) > table.iter_time_s(profile, cfg)


def test_profile_of_another_shape_is_ignored(a100, profile):
    other = replace(_layer_profile(profile.shape), hidden_size=profile.shape.hidden_size * 2)
    cfg = profile.requested
    assert CostModel(a100, layer_profile=other).iter_time_s(profile, cfg) == CostModel(a100).iter_time_s(profile, cfg)


def test_estimate_cli_reads_the_profile_file(tmp_path, profile, gpt_argv):
    path = tmp_path / "layer.toml"
    write_profile_toml(_layer_profile(profile.shape, ms_at_1=300.0), path)
    from click.testing import CliRunner

    runner = CliRunner()
    slow = runner.invoke(pipeswift, ["estimate", "--json", "--layer-profile", str(path), "--", *gpt_argv])
    fast = runner.invoke(pipeswift, ["estimate", "--json", "--", *gpt_argv])
    assert slow.exit_code == 0 and fast.exit_code == 0
    import json

    assert json.loads(slow.output)["iter_time_s"] > 5 * json.loads(fast.output)["iter_time_s"]
    bad = runner.invoke(pipeswift, ["estimate", "--layer-profile", str(tmp_path / "missing.toml"), "--", *gpt_argv])
    assert bad.exit_code == 2
