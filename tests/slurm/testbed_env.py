"""The Slurm test cluster's environment as tests and benches use it: this process's
environment plus the plain ``KEY=value`` lines (``export`` optional) of
``$SLURM_TESTBED_DIR/env.sh`` (default /tmp/pipeswift-testbed), which
``tests/slurm/testbed.sh up`` writes. Read, never executed; lines that expand ``$`` are
left out (the caller sets PATH itself)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Optional

from pipeswift_slurm.slurm.backends.scontrol_argv import gres_value
from pipeswift_slurm.core.model import GpuRequest

DEFAULT_TESTBED = "/tmp/pipeswift-testbed"


def env_file_vars(path: Path) -> dict[str, str]:
    """``KEY=value`` pairs of a shell env file, quotes stripped."""
    found = {}
    for line in path.read_text().splitlines():
        key, sep, value = line.removeprefix("export ").partition("=")
        if sep and key.isidentifier() and "$" not in value:
            found[key] = value.strip().strip("'\"")
    return found


def cluster_env(base: Optional[dict[str, str]] = None) -> dict[str, str]:
    """``base`` (default: os.environ) overlaid with the test cluster's env.sh, if any."""
    env = dict(os.environ if base is None else base)
    env_sh = Path(env.get("SLURM_TESTBED_DIR", DEFAULT_TESTBED)) / "env.sh"
    if env_sh.is_file():
        env.update(env_file_vars(env_sh))
    return env


def gpus_per_node_tres(count: int) -> tuple[str, str]:
    """What ``TresPerNode`` shows for ``count`` GPUs per node: ``gres:gpu:N`` on Slurm
    22.05, ``gres/gpu:N`` on 24.11 (the test cluster may run either)."""
    return gres_value(GpuRequest(slash=False), count), gres_value(GpuRequest(slash=True), count)
