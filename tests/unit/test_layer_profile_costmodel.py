"""A measured layer profile (pipeswift profile) replaces the table's layer time, and only for
the GPU type, precision and layer shape it measured: any other is refused with one line."""

import json
import os
from dataclasses import replace

import pytest
from click.testing import CliRunner

from pipeswift_slurm.cli.main import pipeswift
from pipeswift_slurm.core.costmodel import CostModel
from pipeswift_slurm.core.layer_profile import LayerProfileMismatch
from pipeswift_slurm.core.profile_file import LayerProfile, MicroBatchTiming, write_profile_toml


def _layer_profile(shape, ms_at_1=30.0, **changes):
    lp = LayerProfile("A100-80GB", "cuda:0 (NVIDIA A100-SXM4-80GB)", "torch", "sdpa", "bf16", shape.hidden_size,
                      shape.seq_length, shape.num_attention_heads, shape.num_query_groups, shape.kv_channels,
                      shape.ffn_hidden_size, shape.swiglu,
                      (MicroBatchTiming(1, ms_at_1, 1.0), MicroBatchTiming(2, 2 * ms_at_1, 1.0)))
    return replace(lp, **changes)


def test_measured_layer_time_is_used_for_a_matching_shape(a100, profile):
    table = CostModel(a100)
    measured = CostModel(a100, layer_profile=_layer_profile(profile.shape))
    cfg = replace(profile.requested, micro_batch_size=1, num_micro_batches=profile.plan.global_batch_size
                  // profile.requested.dp)
    fwd, bwd = measured.layer_times_s(profile, cfg)
    assert abs(fwd - 0.010) < 1e-9 and abs(bwd - 0.020) < 1e-9  # 30 ms fwd+bwd = 10 + 20
    assert measured.iter_time_s(profile, cfg) > table.iter_time_s(profile, cfg)
    measured.check_layer_profile(profile)  # it describes this job: no error


@pytest.mark.parametrize("changes", [
    {"gpu_type": "H200-141GB"},                                      # another GPU type
    {"gpu_type": "cpu", "device": "cpu (2 threads)", "dtype": "fp32"},  # a CPU run
    {"device": "cpu (2 threads)", "dtype": "fp32"},                  # a CPU run labelled A100 (old files)
])
def test_profile_of_another_device_is_refused_by_the_cost_model(a100, profile, changes):
    with pytest.raises(LayerProfileMismatch, match="measured on .*not on GPU type A100-80GB"):
        CostModel(a100, layer_profile=_layer_profile(profile.shape, **changes))


@pytest.mark.parametrize("changes, what", [
    ({"dtype": "fp32"}, "measured in fp32; the job trains in bf16"),
    ({"hidden_size": 4096}, "hidden_size 4096 \\(job: 2048\\)"),
    ({"kv_channels": 64}, "kv_channels 64 \\(job: 128\\)"),
])
def test_profile_of_another_precision_or_shape_is_refused_for_the_job(a100, profile, changes, what):
    cost = CostModel(a100, layer_profile=_layer_profile(profile.shape, **changes))
    with pytest.raises(LayerProfileMismatch, match=what):
        cost.check_layer_profile(profile)
    # A site-wide profile (the controller's) covers only the jobs it measured: the rest use the table.
    cfg = profile.requested
    assert cost.iter_time_s(profile, cfg) == CostModel(a100).iter_time_s(profile, cfg)


def _estimate(args, gpt_argv):
    return CliRunner().invoke(pipeswift, ["estimate", "--json", *args, "--", *gpt_argv])


def test_estimate_cli_reads_the_profile_file(tmp_path, profile, gpt_argv):
    path = tmp_path / "layer.toml"
    write_profile_toml(_layer_profile(profile.shape, ms_at_1=300.0), path)
    slow, fast = _estimate(["--layer-profile", str(path)], gpt_argv), _estimate([], gpt_argv)
    assert slow.exit_code == 0 and fast.exit_code == 0
    assert json.loads(slow.output)["iter_time_s"] > 5 * json.loads(fast.output)["iter_time_s"]
    bad = _estimate(["--layer-profile", str(tmp_path / "missing.toml")], gpt_argv)
    assert bad.exit_code == 2


@pytest.mark.parametrize("changes, args, what", [
    # the case: a CPU fp32 run filed as H200, applied to an A100-80GB job
    ({"gpu_type": "H200", "device": "cpu (2 threads)", "dtype": "fp32"}, [], "measured on cpu"),
    ({"gpu_type": "cpu", "device": "cpu (2 threads)", "dtype": "fp32"}, [], "measured on cpu"),
    ({}, ["--gpu-type", "H100-80GB"], "not on GPU type H100-80GB"),
    ({"dtype": "fp16"}, [], "measured in fp16; the job trains in bf16"),
    ({"seq_length": 4096}, [], "seq_length 4096"),
])
@pytest.mark.parametrize("command", ["estimate", "plan"])
def test_cli_refuses_a_profile_it_cannot_apply(tmp_path, profile, gpt_argv, changes, args, what, command):
    path = tmp_path / "layer.toml"
    write_profile_toml(_layer_profile(profile.shape, **changes), path)
    extra = ["--gpus", "8"] if command == "plan" else []
    result = CliRunner().invoke(pipeswift, [command, *extra, *args, "--layer-profile", str(path), "--", *gpt_argv])
    assert result.exit_code == 2, result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in result.output
    assert str(path) in lines[0] and what in lines[0] and "pipeswift profile" in lines[0]


def test_cpu_profile_cannot_be_filed_as_a_gpu(tmp_path, gpt_argv):
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    out = tmp_path / "layer.toml"
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}
    result = CliRunner(env=env).invoke(pipeswift, ["profile", "--gpu-type", "H200-141GB", "--out", str(out),
                                                   "--", *gpt_argv])
    assert result.exit_code == 2 and "no GPU" in result.output and "H200-141GB" in result.output
    assert not out.exists()


@pytest.mark.parametrize("spec, device, noted", [("local", "cuda:0 (NVIDIA H200)", True),
                                                 ("sdpa", "cuda:0 (NVIDIA H200)", False),
                                                 ("local", "cpu (2 threads)", False)])
def test_profile_says_when_it_measured_unfused_attention_on_a_gpu(monkeypatch, gpt_argv, spec, device, noted):
    """On the H200, megatron-core's local spec (no Transformer Engine) ran 1.2-3.9 x slower
    than a flash-attention layer (docs/benchmarks.md): the CLI says so when it measured one
    on a GPU, and only then. The measuring itself is replaced (it needs a GPU)."""
    pytest.importorskip("torch")
    from pipeswift_slurm.measure import profiler

    def measured(shape, sizes, gpu_type, out_path, dtype=None):
        return replace(_layer_profile(shape), layer_spec=spec, device=device,
                       timings=(MicroBatchTiming(1, 10.0, 100.0),))

    monkeypatch.setattr(profiler, "main_profile", measured)
    result = CliRunner().invoke(pipeswift, ["profile", "--micro-batch-sizes", "1", "--", *gpt_argv])
    assert result.exit_code == 0, result.output
    assert ("unfused" in result.output) == noted
