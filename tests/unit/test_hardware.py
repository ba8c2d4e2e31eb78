"""GPU table: built-ins, TOML overrides and new types, and the errors a user sees."""

from __future__ import annotations

import dataclasses
import itertools
import re
from pathlib import Path

import pytest

from pipeswift_slurm.core import hardware
from pipeswift_slurm.core.hardware import HardwareError, get_gpu_type, load_gpu_types

BUILTIN_NAMES = {"V100-32GB", "A100-40GB", "A100-80GB", "H100-80GB", "H200-141GB", "B200-180GB", "GB200-186GB"}


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "hardware.toml"
    path.write_text(text)
    return path


def test_builtins_present() -> None:
    types = load_gpu_types()
    assert set(types) == BUILTIN_NAMES
    assert hardware.DEFAULT_GPU_TYPE in types
    for name, gpu in types.items():
        assert gpu.name == name
        assert gpu.peak_tflops > 0 and gpu.mem_gib > 0 and 0 < gpu.eff_max <= 1


def test_builtin_numbers_are_ordered_sensibly() -> None:
    types = load_gpu_types()
    assert (types["GB200-186GB"].peak_tflops > types["B200-180GB"].peak_tflops > types["H100-80GB"].peak_tflops
            > types["A100-80GB"].peak_tflops > types["V100-32GB"].peak_tflops)
    assert types["A100-80GB"].mem_gib == 2 * types["A100-40GB"].mem_gib
    assert types["B200-180GB"].nvlink_gbps == 2 * types["H100-80GB"].nvlink_gbps  # NVLink 5 vs 4


def test_every_builtin_sets_every_field_and_names_its_source() -> None:
    source = Path(hardware.__file__).read_text()
    for gpu in load_gpu_types().values():
        for field in dataclasses.fields(gpu):
            value = getattr(gpu, field.name)
            assert value if isinstance(value, str) else value > 0, (gpu.name, field.name)
        assert gpu.fp32_tflops < gpu.peak_tflops and gpu.inter_node_gbps < gpu.nvlink_gbps
        # each row is preceded by a comment that names its data sheet or reference design
        row = source.index(f'GpuType("{gpu.name}"')
        comment = source[:row].rstrip().rsplit("\n    GpuType(", 1)[-1]
        assert re.search(r"data sheet|datasheet|nvidia\.com|DGX|HGX", comment), gpu.name


def test_blackwell_types_from_the_data_sheets() -> None:
    b200, gb200 = get_gpu_type("B200-180GB"), get_gpu_type("GB200-186GB")
    assert (b200.peak_tflops, b200.mem_gib, b200.nvlink_gbps, b200.gpus_per_node) == (2250, 167.6, 720, 8)
    assert (gb200.peak_tflops, gb200.mem_gib, gb200.nvlink_gbps, gb200.gpus_per_node) == (2500, 173.2, 720, 4)
    assert all(get_gpu_type(name).gpus_per_node == 8 for name in BUILTIN_NAMES - {"GB200-186GB"})


@pytest.mark.parametrize("device, mem_gib, expected", [
    ("NVIDIA H200", 139.8, "H200-141GB"),
    ("NVIDIA H100 80GB HBM3", 79.1, "H100-80GB"),
    ("NVIDIA A100-SXM4-80GB", 79.2, "A100-80GB"),
    ("NVIDIA A100-SXM4-40GB", 39.4, "A100-40GB"),
    ("Tesla V100-SXM2-32GB", 31.7, "V100-32GB"),
    ("NVIDIA B200", 178.4, "B200-180GB"),
    ("NVIDIA GB200", 184.0, "GB200-186GB"),  # not a B200
    ("NVIDIA GeForce RTX 4090", 23.6, None),
])
def test_device_name_to_builtin_type(device: str, mem_gib: float, expected: str | None) -> None:
    assert hardware.gpu_type_for_device(device, mem_gib) == expected


def test_lookup_is_case_insensitive() -> None:
    assert get_gpu_type("a100-80gb") == get_gpu_type("A100-80GB")


def test_efficiency_rises_with_work_towards_eff_max(a100: hardware.GpuType) -> None:
    effs = [a100.efficiency(w) for w in (1, 15, 100, 10000)]
    assert all(a < b for a, b in itertools.pairwise(effs))
    assert a100.efficiency(a100.work_half_gflop) == pytest.approx(a100.eff_max / 2)
    assert effs[-1] < a100.eff_max


def test_toml_overrides_one_key_and_keeps_the_rest(tmp_path: Path) -> None:
    path = write(tmp_path, '[gpu."A100-80GB"]\nmem_gib = 40\n')
    before = get_gpu_type("A100-80GB")
    after = get_gpu_type("A100-80GB", path)
    assert after.mem_gib == 40
    assert after.peak_tflops == before.peak_tflops and after.nvlink_gbps == before.nvlink_gbps
    assert get_gpu_type("A100-80GB") == before  # the built-in table itself is untouched


def test_toml_adds_a_new_gpu_type(tmp_path: Path) -> None:
    path = write(tmp_path, '[gpu."MI300X"]\npeak_tflops = 1307\nfp32_tflops = 163\nmem_gib = 192\n'
                           'hbm_gbps = 5300\nnvlink_gbps = 448\ninter_node_gbps = 50\nstartup_s = 100\n')
    types = load_gpu_types(path)
    assert set(types) == BUILTIN_NAMES | {"MI300X"}
    new = get_gpu_type("MI300X", path)
    assert (new.peak_tflops, new.mem_gib, new.startup_s) == (1307, 192, 100)
    assert new.eff_max == hardware.GpuType.__dataclass_fields__["eff_max"].default


def test_toml_unknown_key_names_file_and_key(tmp_path: Path) -> None:
    path = write(tmp_path, '[gpu."A100-80GB"]\nmemory_gb = 80\n')
    with pytest.raises(HardwareError) as err:
        load_gpu_types(path)
    assert str(path) in str(err.value)
    assert "memory_gb" in str(err.value)
    assert "mem_gib" in str(err.value)  # the known keys are listed


@pytest.mark.parametrize("text, fragment", [
    ('[gpu."A100-80GB"]\nmem_gib = "lots"\n', "mem_gib"),
    ('[gpu."A100-80GB"]\nmem_gib = -1\n', "mem_gib"),
    ('[gpu."A100-80GB"]\ngpus_per_node = 2.5\n', "gpus_per_node must be a positive integer"),
    # a new type must give the required numbers: named as keys of the file, not Python's arguments
    ('[gpu."NEW"]\nmem_gib = 10\n', "gpu.NEW: a new GPU type needs peak_tflops, fp32_tflops, hbm_gbps, nvlink_gbps,"
                                    " inter_node_gbps (or name a known type"),
    ('[gpu."A100-80GB"\n', "cannot read"),
])
def test_toml_bad_values_are_clear(tmp_path: Path, text: str, fragment: str) -> None:
    path = write(tmp_path, text)
    with pytest.raises(HardwareError) as err:
        load_gpu_types(path)
    assert str(path) in str(err.value) and fragment in str(err.value)


def test_missing_hardware_file_is_a_hardware_error(tmp_path: Path) -> None:
    with pytest.raises(HardwareError, match="cannot read"):
        load_gpu_types(tmp_path / "nope.toml")


def test_unknown_type_lists_known_ones() -> None:
    with pytest.raises(HardwareError) as err:
        get_gpu_type("X100-1TB")
    message = str(err.value)
    assert "X100-1TB" in message
    assert all(name in message for name in BUILTIN_NAMES)


def test_unknown_type_lists_types_from_the_file_too(tmp_path: Path) -> None:
    path = write(tmp_path, '[gpu."L40S"]\npeak_tflops = 362\nfp32_tflops = 91\nmem_gib = 48\n'
                           'hbm_gbps = 864\nnvlink_gbps = 32\ninter_node_gbps = 25\n')
    with pytest.raises(HardwareError, match="L40S"):
        get_gpu_type("X100-1TB", path)


@pytest.mark.parametrize("kind", ["binary", "fifo", "device", "huge"])
def test_a_hardware_file_that_is_no_table_is_one_error_never_a_hang(tmp_path, kind):
    """A job may be pointed at any file (PIPESWIFT_HARDWARE): bytes that are not UTF-8, a
    FIFO nobody writes, /dev/zero or a huge file each give the one error, at once."""
    import os

    path = tmp_path / "hw.toml"
    if kind == "binary":
        path.write_bytes(b"[gpu.X]\n\xd0\xff\xfe\n")
    elif kind == "fifo":
        os.mkfifo(path)
    elif kind == "huge":
        path.write_text("# padding\n" * 200_000)
    target = "/dev/zero" if kind == "device" else path
    with pytest.raises(HardwareError, match="cannot read hardware file"):
        load_gpu_types(target)


@pytest.mark.parametrize("text, needle", [
    ("gpu = 5\n", r'holds \[gpu."NAME"\] tables only \(found gpu = 5\)'),
    ('[gpus."X"]\npeak_tflops = 1\n', r"tables only \(found gpus\)"),  # a misspelt table was ignored
    ('[gpu."A100-80GB"]\npeak_tflops = 0\n', "peak_tflops must be at least 0.001"),  # was a ZeroDivisionError
    ('[gpu."A100-80GB"]\npeak_tflops = 5e-324\n', "peak_tflops must be at least 0.001"),  # nan predictions
    ('[gpu."A100-80GB"]\neff_max = 5e-324\n', "eff_max must be at least 0.01"),  # a ZeroDivisionError in plan
    ('[gpu."A100-80GB"]\nhbm_gbps = 1e300\n', "hbm_gbps must be at most 1e\\+06"),
    ('[gpu."A100-80GB"]\nmem_gib = nan\n', "mem_gib must be a finite non-negative number"),
    ('[gpu."A100-80GB"]\neff_max = 1.5\n', "eff_max is a fraction of peak: at most 1"),
])
def test_a_hardware_value_that_cannot_be_right_is_named(tmp_path, text, needle):
    path = tmp_path / "hw.toml"
    path.write_text(text)
    with pytest.raises(HardwareError, match=needle):
        load_gpu_types(path)
