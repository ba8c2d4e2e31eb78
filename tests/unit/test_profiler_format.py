"""The layer-profile TOML format: round trip, clear errors, FLOPs formula. No torch needed."""

from __future__ import annotations

import subprocess
import sys

import pytest

from pipeswift_slurm.core.model import ModelShape
from pipeswift_slurm.measure.profiler import (
    LayerProfile,
    MicroBatchTiming,
    ProfileFormatError,
    layer_flops_fwd_bwd,
    read_profile_toml,
    write_profile_toml,
)

SHAPE = ModelShape(num_layers=24, hidden_size=2048, num_attention_heads=16, seq_length=2048,
                   ffn_hidden_size=8192, kv_channels=128, num_query_groups=16)


def _profile(**changes) -> LayerProfile:
    fields = {"gpu_type": "H200", "device": 'cuda:0 (NVIDIA H200 "SXM")', "backend": "megatron-core",
              "layer_spec": "local", "dtype": "bf16", "hidden_size": 2048, "seq_length": 2048,
              "num_attention_heads": 16, "num_query_groups": 16, "kv_channels": 128,
              "ffn_hidden_size": 8192, "swiglu": False, "warmup": 2, "repeats": 5,
              "torch_version": "2.13.0",
              "timings": (MicroBatchTiming(1, 1.25, 400.5), MicroBatchTiming(4, 4.0, 500.0))}
    fields.update(changes)
    return LayerProfile(**fields)


def test_round_trip(tmp_path):
    path = tmp_path / "h200.toml"
    profile = _profile()
    write_profile_toml(profile, path)
    assert read_profile_toml(path) == profile
    assert "format_version = 1" in path.read_text()


def test_lookup_and_shape_match():
    profile = _profile()
    assert profile.micro_batch_sizes == (1, 4)
    assert profile.fwd_bwd_ms(4) == 4.0
    with pytest.raises(KeyError):
        profile.fwd_bwd_ms(2)
    assert profile.matches(SHAPE)
    assert not profile.matches(ModelShape(24, 2048, 16, 4096, 8192, 128, 16))


def test_import_does_not_load_torch():
    code = "import sys, pipeswift_slurm.measure.profiler; assert 'torch' not in sys.modules, 'torch imported'"
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


@pytest.mark.parametrize("old, new, key", [
    ("hidden_size = 2048", 'hidden_size = "2048"', "shape.hidden_size"),
    ("format_version = 1", "format_version = 2", "format_version"),
    ("backend = \"megatron-core\"\n", "", "backend"),
    ("fwd_bwd_ms = 4.0", "fwd_bwd_ms = -4.0", "micro_batch[1].fwd_bwd_ms"),
    ("swiglu = false", "swiglu = 0", "shape.swiglu"),
])
def test_malformed_file_names_file_and_key(tmp_path, old, new, key):
    path = tmp_path / "bad.toml"
    write_profile_toml(_profile(), path)
    text = path.read_text()
    assert old in text
    path.write_text(text.replace(old, new, 1))
    with pytest.raises(ProfileFormatError, match=f"{path}.*'{key}'".replace("[", r"\[").replace("]", r"\]")):
        read_profile_toml(path)


def test_not_toml_names_file(tmp_path):
    path = tmp_path / "garbage.toml"
    path.write_text("this is = = not toml")
    with pytest.raises(ProfileFormatError, match="garbage.toml"):
        read_profile_toml(path)


def test_flops_match_megatron_closed_form():
    # MHA, ffn = 4h, no SwiGLU: 72*b*s*h^2*(1 + s/(12h)) per layer (FACTS 3.3, one layer, B=b).
    b, s, h = 2, SHAPE.seq_length, SHAPE.hidden_size
    assert layer_flops_fwd_bwd(SHAPE, b) == pytest.approx(72 * b * s * h * h * (1 + s / (12 * h)))


def test_flops_swiglu_and_gqa():
    shape = ModelShape(32, 4096, 32, 4096, 11008, 128, 8, swiglu=True)
    h, s, q, kv, ffn = 4096, 4096, 4096, 1024, 11008
    expected = 6 * s * (h * (q + 2 * kv) + q * s + q * h + 3 * h * ffn)
    assert layer_flops_fwd_bwd(shape, 1) == pytest.approx(expected)
