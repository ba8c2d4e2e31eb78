"""Controller config: the shipped example loads; bad files give one line naming file and key."""

from pathlib import Path

import pytest

from pipeswift_slurm.slurm.config import ConfigError, load_config

EXAMPLE = Path(__file__).resolve().parents[2] / "wrappers" / "config.example.toml"


def test_shipped_example_config_loads():
    cfg = load_config(str(EXAMPLE))
    assert cfg.policy == "pipeswift" and cfg.partitions == ("gpu",) and cfg.dry_run is True
    assert cfg.policy_knobs["wait_bound_s"] == 172800


def test_the_examples_calibration_keys_load_when_uncommented(tmp_path):
    text = EXAMPLE.read_text()
    for key in ("exclude_partitions", "measure_dir", "publish_file", "own_layout_first"):
        assert "# %s = " % key in text
        text = text.replace("# %s = " % key, "%s = " % key)
    path = tmp_path / "c.toml"
    path.write_text(text)
    cfg = load_config(str(path))
    assert cfg.calibration_exclude_partitions == ("debug",)
    assert (cfg.measure_dir, cfg.publish_file) == ("/var/spool/pipeswift/measure", "/shared/pipeswift/site-model.json")
    assert cfg.own_layout_first is True


def test_own_layout_first_without_measure_dir_is_refused(tmp_path):
    path = tmp_path / "c.toml"
    path.write_text("[calibration]\nown_layout_first = true\n")
    with pytest.raises(ConfigError, match=r"\[calibration\] own_layout_first needs measure_dir"):
        load_config(str(path))
    path.write_text("[calibration]\nown_layout_first = 1\n")
    with pytest.raises(ConfigError, match="own_layout_first must be a bool"):
        load_config(str(path))


@pytest.mark.parametrize("text, needle", [
    ("[slurm]\ngpus_per_node = 'eight'\n", "gpus_per_node"),
    ("[slurm]\ngpus_per_node = 99999999999999999999\n", "gpus_per_node"),
    ("[slurm]\nbogus = 1\n", "bogus"),
    ("[nonsense]\nx = 1\n", "nonsense"),
    ("[policy]\nname = 'magic'\n", "magic"),
    ("[controller]\ndry_run = 'yes'\n", "dry_run"),
    ("[policy]\nname = 'sjf'\n[policy.knobs]\npreempt = true\n", "[policy.knobs] sjf has no knob preempt"),
    ("not toml = = =\n", "cannot read"),
])
def test_bad_config_names_the_key(tmp_path, text, needle):
    path = tmp_path / "c.toml"
    path.write_text(text)
    with pytest.raises(ConfigError) as err:
        load_config(str(path))
    assert needle in str(err.value) and str(path) in str(err.value)
    assert "\n" not in str(err.value)


def test_controller_cli_reports_bad_config_in_one_line(tmp_path):
    path = tmp_path / "c.toml"
    path.write_text("[slurm]\nbogus = 1\n")
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-m", "pipeswift_slurm.cli", "controller", "tick", "--config", str(path)],
                         capture_output=True, text=True)
    assert out.returncode == 2
    assert len(out.stderr.strip().splitlines()) == 1 and "bogus" in out.stderr


@pytest.mark.parametrize("knob, value, words", [
    ("wait_bound_s", '"abc"', ["wait_bound_s", "number > 0", "'abc'"]),
    ("wait_bound_s", "-5", ["wait_bound_s", "number > 0", "-5"]),
    ("preempt", '"yes"', ["preempt", "true or false"]),
    ("risk_fraction", "7", ["risk_fraction", "in [0, 1]"]),
    ("aging", "nan", ["aging", "finite number"]),
    ("plan_depth", "-1", ["plan_depth", "integer >= 1"]),
    ("plan_depth", "2.5", ["plan_depth", "integer"]),
    ("site_factor_max", "66666667333", ["site_factor_max", "in [0, 2147483647]"]),
])
def test_bad_knob_values_are_refused_at_load(tmp_path, knob, value, words):
    path = tmp_path / "c.toml"
    path.write_text("[policy]\nname = 'pipeswift'\n[policy.knobs]\n%s = %s\n" % (knob, value))
    with pytest.raises(ConfigError) as err:
        load_config(str(path))
    message = str(err.value)
    assert message.startswith("%s: [policy.knobs] pipeswift " % path) and "\n" not in message
    for word in words:
        assert word in message, (word, message)


def test_good_knobs_load_and_reach_the_policy(tmp_path):
    from pipeswift_slurm.policy import get_policy
    from pipeswift_slurm.slurm.config import policy_knobs

    path = tmp_path / "c.toml"
    path.write_text("[policy]\nname = 'pipeswift'\nsite_factor_max = 5000\n[policy.knobs]\n"
                    "wait_bound_s = 3600\npreempt = true\nrisk_fraction = 0\n")
    cfg = load_config(str(path))
    policy = get_policy(cfg.policy, **policy_knobs(cfg))
    assert (policy.knobs.wait_bound_s, policy.knobs.preempt, policy.knobs.risk_fraction) == (3600.0, True, 0.0)
    assert policy.site_factor_max == 5000 and isinstance(policy.knobs.wait_bound_s, float)


def test_site_factor_max_above_slurms_range_is_refused(tmp_path):
    path = tmp_path / "c.toml"
    path.write_text("[policy]\nsite_factor_max = 66666667333\n")
    with pytest.raises(ConfigError, match=r"\[policy\] site_factor_max must be at most 2147483647"):
        load_config(str(path))


@pytest.mark.parametrize("backend, words", [
    ("foo", ["[slurm] backend 'foo' unknown", "auto, cli, pyslurm"]),
    ("sim", ["[slurm] backend = 'sim'", "simulator", "auto, cli, pyslurm"]),
    ("pyslurm", ["[slurm] backend = 'pyslurm'", "not installed", "backend = 'cli'"]),
])
def test_bad_backend_is_one_line_naming_file_and_key(tmp_path, monkeypatch, backend, words):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "pyslurm" else real(name, *a))
    path = tmp_path / "c.toml"
    path.write_text("[slurm]\nbackend = '%s'\n" % backend)
    with pytest.raises(ConfigError) as err:
        load_config(str(path))
    assert str(err.value).startswith(str(path)) and "\n" not in str(err.value)
    for word in words:
        assert word in str(err.value), (word, str(err.value))


@pytest.mark.parametrize("text, needle", [
    ("[policy.knobs]\nwait_bound_s = 'abc'\n", "wait_bound_s"),
    ("[slurm]\nbackend = 'foo'\n", "backend 'foo'"),
    ("[slurm]\nbackend = 'sim'\n", "backend = 'sim'"),
])
def test_controller_cli_exits_2_on_bad_values(tmp_path, text, needle):
    import subprocess
    import sys

    path = tmp_path / "c.toml"
    path.write_text(text)
    out = subprocess.run([sys.executable, "-m", "pipeswift_slurm.cli", "controller", "tick", "--config", str(path)],
                         capture_output=True, text=True)
    assert out.returncode == 2, out.stderr
    assert len(out.stderr.strip().splitlines()) == 1 and needle in out.stderr and str(path) in out.stderr
    assert "Traceback" not in out.stderr


@pytest.mark.parametrize("text, needle", [
    ("store = 5\n", r"store = 5: store is a section; write \[store\] on a line of its own"),
    ('[slurm]\npartitions = [""]\n', r"\[slurm\] partitions must be a list of names \(strings, none empty\)"),
    ('[calibration]\nexclude_partitions = [" "]\n', r"exclude_partitions must be a list of names"),
    ('[calibration]\nmeasure_dir = "spool"\n', r"measure_dir must be an absolute path \(got 'spool'\)"),
    ('[calibration]\npublish_file = "site.json"\n', r"publish_file must be an absolute path \(got 'site.json'\)"),
    ('[slurm.partition_gpu_types]\n"" = "H100-80GB"\n', r"partition_gpu_types\] a partition name is empty"),
    ('[slurm.partition_gpu_types]\nh100 = ""\n', r"partition_gpu_types\] each value must be a GPU type name"),
])
def test_a_mistake_an_admin_makes_is_named(tmp_path, text, needle):
    """Each was accepted before and then quietly did nothing (an empty partition name
    matched no job; a relative spool is relative to every job's own directory)."""
    path = tmp_path / "c.toml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=needle):
        load_config(str(path))


def test_the_measure_folder_must_be_like_tmp(tmp_path):
    from pipeswift_slurm.slurm.measured import folder_problem

    spool = tmp_path / "spool"
    assert "cannot use the measure folder" in (folder_problem(str(spool)) or "")
    spool.mkdir(mode=0o755)
    spool.chmod(0o755)
    assert "has mode 755, not 1777" in (folder_problem(str(spool)) or "")
    spool.chmod(0o1777)
    assert folder_problem(str(spool)) is None
    (tmp_path / "file").write_text("")
    assert "is not a folder" in (folder_problem(str(tmp_path / "file")) or "")


def test_a_config_that_is_a_fifo_is_one_error_not_a_hang(tmp_path):
    import os

    os.mkfifo(tmp_path / "c.toml")
    with pytest.raises(ConfigError, match="cannot read config: not a plain file"):
        load_config(str(tmp_path / "c.toml"))


def test_a_config_saved_with_a_byte_order_mark_loads(tmp_path):
    """An editor that writes a BOM made the first line "Invalid statement" (found by fuzzing)."""
    path = tmp_path / "c.toml"
    path.write_bytes(b"\xef\xbb\xbf[store]\nurl = '/var/lib/pipeswift/h.sqlite'\n")
    assert load_config(str(path)).db_url == "/var/lib/pipeswift/h.sqlite"
