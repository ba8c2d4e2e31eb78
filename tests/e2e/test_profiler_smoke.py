"""The per-layer profiler on the local device with a tiny shape: structure only, no speed."""

from __future__ import annotations

import pytest
from tiny_megatron import megatron_missing

from pipeswift_slurm.core.model import ModelShape
from pipeswift_slurm.core.profile_file import read_profile_toml
from pipeswift_slurm.measure.profiler import layer_flops_fwd_bwd, main_profile, profile_layer

pytestmark = [pytest.mark.megatron, pytest.mark.e2e]

_MISSING = megatron_missing()
if _MISSING:
    print(f"skipping profiler smoke tests: {_MISSING}")
    pytest.skip(_MISSING, allow_module_level=True)

TINY = ModelShape(num_layers=2, hidden_size=64, num_attention_heads=4, seq_length=32,
                  ffn_hidden_size=256, kv_channels=16, num_query_groups=4, vocab_size=128)
GQA_SWIGLU = ModelShape(num_layers=2, hidden_size=64, num_attention_heads=4, seq_length=32,
                        ffn_hidden_size=128, kv_channels=16, num_query_groups=2, swiglu=True)


def _check_structure(profile, shape, micro_batch_sizes):
    assert profile.micro_batch_sizes == tuple(micro_batch_sizes)
    for timing in profile.timings:
        assert timing.fwd_bwd_ms > 0
        expected = layer_flops_fwd_bwd(shape, timing.micro_batch_size) / (timing.fwd_bwd_ms * 1e-3) / 1e12
        assert timing.tflops == pytest.approx(expected)
    assert profile.matches(shape)


def test_megatron_layer_profile_written_and_readable(tmp_path):
    out = tmp_path / "tiny.toml"
    profile = main_profile(TINY, [4, 1, 2], None, out)
    assert profile.backend == "megatron-core"
    import torch

    # A CPU run is labelled "cpu" in fp32, never as a GPU type; a GPU run in bf16 (the default).
    if torch.cuda.is_available():
        assert profile.device.startswith("cuda") and profile.gpu_type != "cpu" and profile.dtype == "bf16"
    else:
        assert profile.device.startswith("cpu") and (profile.gpu_type, profile.dtype) == ("cpu", "fp32")
    _check_structure(profile, TINY, [1, 2, 4])
    assert read_profile_toml(out) == profile


@pytest.mark.parametrize("use_megatron, backend", [(False, "torch"), (True, "megatron-core")])
def test_gqa_swiglu_layer_both_backends(use_megatron, backend):
    profile = profile_layer(GQA_SWIGLU, [1, 2], use_megatron=use_megatron, warmup=1, repeats=3)
    assert profile.backend == backend
    _check_structure(profile, GQA_SWIGLU, [1, 2])


def test_profiler_leaves_no_process_state_behind():
    import torch
    import torch.distributed as dist

    profile_layer(TINY, [1], use_megatron=True, warmup=0, repeats=1)
    assert not dist.is_initialized()
    if not torch.cuda.is_available():
        with pytest.raises((AssertionError, RuntimeError)):
            torch.cuda.current_device()


def test_megatron_layer_runs_wholly_in_the_jobs_precision():
    """Megatron casts its model to bf16 (Float16Module); megatron-core 0.16.1's local layer
    keeps its norms in fp32 otherwise, which a CPU tolerates and CUDA refused on the H200
    ("expected scalar type BFloat16 but found Float"): every weight must be bf16."""
    import torch

    from pipeswift_slurm.measure.profiler import _build_megatron_layer, _megatron_runtime

    built = {}
    import megatron.core.transformer.transformer_layer as transformer_layer

    original = transformer_layer.TransformerLayer.to

    def keep(self, *args, **kwargs):
        built["layer"] = original(self, *args, **kwargs)
        return built["layer"]

    with _megatron_runtime(False):
        transformer_layer.TransformerLayer.to = keep
        try:
            _build_megatron_layer(TINY, torch.device("cpu"), torch.bfloat16)
        finally:
            transformer_layer.TransformerLayer.to = original
    assert {p.dtype for p in built["layer"].parameters()} == {torch.bfloat16}


def test_the_gpu_check_script_runs_pipeswift_profile_end_to_end(tmp_path):
    """bench/gpu_profile_check.sh (run on a lent GPU for docs/benchmarks.md) on this machine:
    with SMOKE=1 ALLOW_CPU=1 it runs the `pipeswift profile` CLI on one tiny shape and writes
    its profile; without ALLOW_CPU on a machine with no GPU it refuses (exit 3)."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    import torch

    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "OUT": str(tmp_path), "PYTHON": sys.executable, "MBS": "1", "SMOKE": "1",
           "ALLOW_CPU": "1", "TAG": "ci"}
    done = subprocess.run(["bash", str(root / "bench" / "gpu_profile_check.sh")], env=env, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    profile = read_profile_toml(tmp_path / "profile_smoke_ci.toml")
    assert profile.hidden_size == 256 and [t.micro_batch_size for t in profile.timings] == [1]
    assert "profiles written: 1 of 1" in done.stdout
    if not torch.cuda.is_available():
        env.pop("ALLOW_CPU")
        refused = subprocess.run(["bash", str(root / "bench" / "gpu_profile_check.sh")], env=env,
                                 capture_output=True, text=True, timeout=120)
        assert refused.returncode == 3 and "no CUDA device" in refused.stderr
