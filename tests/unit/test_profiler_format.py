"""The layer-profile TOML format: round trip, clear errors, FLOPs formula. No torch needed."""

from __future__ import annotations

import subprocess
import sys

import pytest

from pipeswift_slurm.core.model import ModelShape
from pipeswift_slurm.core.profile_file import (
    LayerProfile,
    MicroBatchTiming,
    ProfileFormatError,
    read_profile_toml,
    write_profile_toml,
)
from pipeswift_slurm.measure.profiler import ProfileLabelError, layer_flops_fwd_bwd, profile_label

SHAPE = ModelShape(num_layers=24, hidden_size=2048, num_attention_heads=16, seq_length=2048,
                   ffn_hidden_size=8192, kv_channels=128, num_query_groups=16)


def _profile(**changes) -> LayerProfile:
    fields = {"gpu_type": "H200-141GB", "device": 'cuda:0 (NVIDIA H200 "SXM")', "backend": "megatron-core",
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
    read = read_profile_toml(path)
    assert read == profile and read.source == str(path)
    text = path.read_text()
    assert "format_version = 1" in text and 'gpu_type = "H200-141GB"' in text and 'dtype = "bf16"' in text
    assert "source" not in text  # where it was read from is not part of the file


def test_lookup_and_shape_match():
    profile = _profile()
    assert profile.micro_batch_sizes == (1, 4)
    assert profile.fwd_bwd_ms(4) == 4.0
    with pytest.raises(KeyError):
        profile.fwd_bwd_ms(2)
    assert profile.matches(SHAPE)
    assert not profile.matches(ModelShape(24, 2048, 16, 4096, 8192, 128, 16))


@pytest.mark.parametrize("module", ["measure.profiler", "core.profile_file"])
def test_import_does_not_load_torch(module):
    code = f"import sys, pipeswift_slurm.{module}; assert 'torch' not in sys.modules, 'torch imported'"
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


@pytest.mark.parametrize("old, new, key", [
    ("hidden_size = 2048", 'hidden_size = "2048"', "shape.hidden_size"),
    ("format_version = 1", "format_version = 2", "format_version"),
    ("backend = \"megatron-core\"\n", "", "backend"),
    ("fwd_bwd_ms = 4.0", "fwd_bwd_ms = -4.0", "micro_batch[1].fwd_bwd_ms"),
    ("fwd_bwd_ms = 4.0", "fwd_bwd_ms = inf", "micro_batch[1].fwd_bwd_ms"),  # passed as positive: a 0 division
    ("fwd_bwd_ms = 4.0", "fwd_bwd_ms = 5e-324", "micro_batch[1].fwd_bwd_ms"),
    ("fwd_bwd_ms = 4.0", "fwd_bwd_ms = 1e308", "micro_batch[1].fwd_bwd_ms"),  # an inf job time
    ("swiglu = false", "swiglu = 0", "shape.swiglu"),
    ('dtype = "bf16"', 'dtype = "tf32"', "dtype"),
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


def test_cpu_run_is_labelled_cpu_and_never_a_gpu_type():
    assert profile_label(None, None, 0.0) == "cpu"
    assert profile_label("cpu", None, 0.0) == "cpu"
    with pytest.raises(ProfileLabelError, match="no GPU.*H200-141GB"):
        profile_label("H200-141GB", None, 0.0)


def test_gpu_run_is_labelled_with_its_table_type():
    assert profile_label(None, "NVIDIA H200", 140.0) == "H200-141GB"
    assert profile_label(None, "NVIDIA A100-SXM4-40GB", 39.4) == "A100-40GB"
    assert profile_label(None, "NVIDIA RTX 6000 Ada", 47.0) == "NVIDIA RTX 6000 Ada"  # not in the table
    assert profile_label("site-h200", "NVIDIA H200", 140.0) == "site-h200"  # a hardware-file name
    with pytest.raises(ProfileLabelError, match="A100-80GB"):
        profile_label("A100-80GB", "NVIDIA H200", 140.0)  # another built-in type: a mislabel
