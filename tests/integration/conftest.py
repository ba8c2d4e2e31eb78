"""Fixtures for tests against a real Slurm (``tests/slurm/testbed.sh up``).

Every fixture skips (with the reason) unless ``squeue`` answers with ``SLURM_CONF`` set, taken
from ``$SLURM_TESTBED_DIR/env.sh`` (default /tmp/pipeswift-testbed) or the environment.
Jobs submitted through ``submit_job`` are cancelled at teardown.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable, Iterator

import pytest

from pipeswift_slurm.slurm.backends.slurm_cli import SubprocessRunner
from pipeswift_slurm.slurm.backends.slurm_parse import parse_kv_line

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "slurm"))
from testbed_env import cluster_env  # noqa: E402  (tests/slurm/testbed_env.py)


@pytest.fixture(scope="session")
def slurm_env() -> dict[str, str]:
    """The environment for Slurm commands of the test cluster (skips if none answers)."""
    env = cluster_env()
    if not env.get("SLURM_CONF") or not os.path.isfile(env["SLURM_CONF"]):
        pytest.skip("no Slurm test cluster: run tests/slurm/testbed.sh up (no env.sh / SLURM_CONF)")
    if not shutil.which("squeue"):
        pytest.skip("squeue not on PATH")
    try:
        subprocess.run(["squeue", "-h"], env=env, capture_output=True, timeout=15, check=True)
    except (subprocess.SubprocessError, OSError) as exc:
        pytest.skip("Slurm test cluster does not answer (%s)" % exc)
    return env


@pytest.fixture
def slurm(slurm_env: dict[str, str]) -> SubprocessRunner:
    """Runner for Slurm commands against the test cluster."""
    return SubprocessRunner(timeout_s=30, env=slurm_env)


@pytest.fixture
def submit_job(slurm: SubprocessRunner) -> Iterator[Callable[..., int]]:
    """``submit_job("-N1", "--gpus-per-node=1", wrap="sleep 60")`` -> job id; all submitted
    jobs are cancelled at teardown."""
    submitted: list[int] = []

    def submit(*args: str, wrap: str = "sleep 300") -> int:
        out = slurm(["sbatch", "--parsable", "-o", "/dev/null", "-D", "/tmp", *args, "--wrap", wrap])
        job_id = int(out.strip().split(";")[0])
        submitted.append(job_id)
        return job_id

    yield submit
    if submitted:
        subprocess.run(["scancel", *map(str, submitted)], env=slurm.env, capture_output=True, timeout=30)


@pytest.fixture
def job_fields(slurm: SubprocessRunner) -> Callable[..., dict[str, str]]:
    """``job_fields(job_id, detail=False)`` -> ``scontrol -o show job`` as a dict."""

    def fields(job_id: int, detail: bool = False) -> dict[str, str]:
        argv = ["scontrol", "-o", *(["-d"] if detail else []), "show", "job", str(job_id)]
        return parse_kv_line(slurm(argv).splitlines()[0])

    return fields


@pytest.fixture
def wait_state(job_fields: Callable[..., dict[str, str]]) -> Callable[..., dict[str, str]]:
    """``wait_state(job_id, "RUNNING", timeout_s=30)`` -> the job's fields once it is there."""

    def wait(job_id: int, state: str, timeout_s: float = 30.0) -> dict[str, str]:
        deadline = time.monotonic() + timeout_s
        fields = job_fields(job_id)
        while fields.get("JobState") != state:
            if time.monotonic() > deadline:
                raise AssertionError("job %d is %s/%s, not %s after %.0f s" % (
                    job_id, fields.get("JobState"), fields.get("Reason"), state, timeout_s))
            time.sleep(0.3)
            fields = job_fields(job_id)
        return fields

    return wait


@pytest.fixture
def blocker(slurm: SubprocessRunner, submit_job: Callable[..., int],
            wait_state: Callable[..., dict[str, str]]) -> int:
    """A running job holding every node and GPU, so that later jobs pend; returns its id."""
    nodes = int(slurm(["sinfo", "-h", "-o", "%D"]).split()[0])
    job_id = submit_job("-N%d" % nodes, "--exclusive", "--gpus-per-node=8", "-J", "blocker")
    wait_state(job_id, "RUNNING", 30)
    return job_id
