"""The cron and systemd files under wrappers/: each documented property is checked on the file
itself (cron keeps the tick's exit code and reaches pipeswift; the metrics user is created;
the oneshot service has a start timeout and never pulls in slurmctld), and the tick wrapper
is run with a fake pipeswift and a fake logger."""

from __future__ import annotations

import configparser
import os
import re
import shlex
import stat
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

WRAPPERS = Path(__file__).resolve().parents[2] / "wrappers"
CRON_FILES = ("pipeswift-controller.cron", "pipeswift-metrics.cron")
CRON_DEFAULT_PATH = "/usr/bin:/bin"


@dataclass(frozen=True)
class CronFile:
    env: dict[str, str]
    jobs: list[tuple[str, str]]  # (user, command)
    comments: str


def parse_cron_d(path: Path) -> CronFile:
    """An /etc/cron.d file: NAME=value lines and 'min hour dom mon dow user command' lines."""
    env: dict[str, str] = {}
    jobs, comments = [], []
    for line in path.read_text().splitlines():
        text = line.strip()
        if not text or text.startswith("#"):
            comments.append(text)
            continue
        assignment = re.fullmatch(r"([A-Za-z_][A-Za-z0-9_]*)\s*=\s*(.*)", text)
        if assignment:
            env[assignment[1]] = assignment[2]
            continue
        fields = text.split(None, 6)
        assert len(fields) == 7, f"{path.name}: not a cron.d job line: {text!r}"
        jobs.append((fields[5], fields[6]))
    assert jobs, f"{path.name}: no job line"
    return CronFile(env, jobs, "\n".join(comments))


def _program(command: str) -> str:
    """The executable a cron command runs (after leading VAR=value assignments)."""
    words = shlex.split(command)
    while words and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*=.*", words[0]):
        words.pop(0)
    return words[0]


@pytest.mark.parametrize("name", CRON_FILES)
def test_cron_keeps_the_exit_code(name):
    cron = parse_cron_d(WRAPPERS / name)
    shell = cron.env.get("SHELL", "/bin/sh")
    for _user, command in cron.jobs:
        # A pipe's status is its last command's: the tick's code would be lost (no pipefail in sh).
        assert "|" not in command or ("pipefail" in command and shell.endswith("bash")), command


@pytest.mark.parametrize("name", CRON_FILES)
def test_cron_reaches_pipeswift(name):
    cron = parse_cron_d(WRAPPERS / name)
    path = cron.env.get("PATH", CRON_DEFAULT_PATH).split(":")
    for _user, command in cron.jobs:
        program = _program(command)
        # pip installs pipeswift in /usr/local/bin, which cron's default PATH lacks.
        assert program.startswith("/") or "/usr/local/bin" in path, f"{program!r} is not on cron's PATH"


@pytest.mark.parametrize("name", CRON_FILES)
def test_cron_user_is_root_or_documented(name):
    cron = parse_cron_d(WRAPPERS / name)
    for user, _command in cron.jobs:
        if user != "root":
            assert re.search(rf"useradd\b[^\n]*\s{re.escape(user)}\s*$", cron.comments, re.MULTILINE), (
                f"{name}: cron user {user!r} is neither root nor created by a documented useradd")


def test_controller_cron_runs_the_tick_wrapper():
    cron = parse_cron_d(WRAPPERS / "pipeswift-controller.cron")
    [(user, command)] = cron.jobs
    assert user == "root" and "PIPESWIFT_CONFIG=/etc/pipeswift/config.toml" in command
    program = _program(command)
    wrapper = WRAPPERS / Path(program).name
    assert wrapper.exists() and wrapper.stat().st_mode & stat.S_IXUSR
    assert f"install -m 755 wrappers/{wrapper.name} {program}" in cron.comments


def _fake_bin(tmp_path: Path, tick_rc: int) -> tuple[dict[str, str], Path]:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    log = tmp_path / "syslog"
    # The fake logger records its arguments, and stdin when no message is given (4 args: -t X -p Y).
    (bin_dir / "logger").write_text(f'#!/bin/sh\n{{ echo "logger $*"; [ $# -le 4 ] && cat; }} >> {log}\n')
    (bin_dir / "pipeswift").write_text(f'#!/bin/sh\necho "argv: $*"\necho "to stderr" >&2\nexit {tick_rc}\n')
    for tool in bin_dir.iterdir():
        tool.chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}:/usr/bin:/bin", "PIPESWIFT": str(bin_dir / "pipeswift")}
    return env, log


@pytest.mark.parametrize("tick_rc", [0, 1, 2])
def test_tick_wrapper_logs_and_keeps_the_exit_code(tmp_path, tick_rc):
    env, log = _fake_bin(tmp_path, tick_rc)
    done = subprocess.run([str(WRAPPERS / "pipeswift-tick"), "--dry-run"], env=env, timeout=30,
                          capture_output=True, text=True, check=False)
    assert done.returncode == tick_rc
    logged = log.read_text()
    assert "argv: controller tick --dry-run" in logged and "to stderr" in logged
    assert (f"exited {tick_rc}" in logged) == (tick_rc != 0)


def _unit(name: str) -> configparser.ConfigParser:
    parser = configparser.ConfigParser(strict=False, interpolation=None, delimiters=("=",))
    parser.optionxform = str  # type: ignore[assignment,method-assign]
    parser.read_string((WRAPPERS / name).read_text())
    return parser


def _seconds(value: str) -> float:
    """systemd time span ("300", "5min", "1min 30s") in seconds; infinity -> inf."""
    units = {"": 1, "s": 1, "sec": 1, "m": 60, "min": 60, "h": 3600, "hr": 3600}
    if value.strip() == "infinity":
        return float("inf")
    parts = re.findall(r"(\d+(?:\.\d+)?)\s*([a-z]*)", value)
    assert parts, value
    return sum(float(n) * units[u] for n, u in parts)


def test_service_oneshot_has_a_start_timeout():
    unit = _unit("pipeswift-controller.service")
    assert unit["Service"]["Type"] == "oneshot"
    timeout_s = _seconds(unit["Service"].get("TimeoutStartSec", "infinity"))
    assert 0 < timeout_s <= 3600, "a oneshot tick without TimeoutStartSec can hang forever"
    assert unit["Service"]["ExecStart"].startswith("/")


def test_service_never_starts_slurmctld():
    unit = _unit("pipeswift-controller.service")["Unit"]
    for key in ("Wants", "Requires", "BindsTo", "Requisite"):
        assert "slurmctld" not in unit.get(key, ""), f"{key}= could start slurmctld on another host"
    assert "slurmctld.service" in unit["After"].split()


def test_timer_triggers_the_service():
    timer = _unit("pipeswift-controller.timer")
    assert timer["Timer"].get("Unit", "pipeswift-controller.service") == "pipeswift-controller.service"
    assert (WRAPPERS / "pipeswift-controller.service").exists()
