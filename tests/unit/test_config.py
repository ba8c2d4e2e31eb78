"""Controller config: the shipped example loads; bad files give one line naming file and key."""

from pathlib import Path

import pytest

from pipeswift_slurm.slurm.config import ConfigError, load_config

EXAMPLE = Path(__file__).resolve().parents[2] / "wrappers" / "config.example.toml"


def test_shipped_example_config_loads():
    cfg = load_config(str(EXAMPLE))
    assert cfg.policy == "pipeswift" and cfg.partitions == ("gpu",) and cfg.dry_run is True
    assert cfg.policy_knobs["wait_bound_s"] == 172800


@pytest.mark.parametrize("text, needle", [
    ("[slurm]\ngpus_per_node = 'eight'\n", "gpus_per_node"),
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
