"""The Slurm test cluster's environment as tests and benches use it: this process's
environment plus the plain ``KEY=value`` lines (``export`` optional) of
``$SLURM_TESTBED_DIR/env.sh`` (default /tmp/pipeswift-testbed), which
``tests/slurm/testbed.sh up`` writes. Read, never executed; lines that expand ``$`` are
left out (the caller sets PATH itself)."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Iterator, Optional

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


TESTBED = Path(__file__).resolve().parent / "testbed.sh"


class ClusterDown(Exception):
    """Why a test cluster of a test's own did not come up (the caller skips with it)."""


@contextlib.contextmanager
def own_cluster(prefix: str, what: str, **settings: str) -> Iterator[dict[str, str]]:
    """A fresh test cluster in a new folder under /tmp with testbed.sh's ``settings``
    (``NODES``, ``GPUS``, ``GPU_PARTITIONS``, ``CTLD_PORT``, ``SLURMD_PORT_BASE``, ...);
    yields its environment, takes it down after.

    Raises:
        ClusterDown: ``testbed.sh up`` failed (the message: "cannot bring up ``what``: " and
            the last line it wrote on stderr).
    """
    folder = tempfile.mkdtemp(prefix=prefix, dir="/tmp")
    env = dict(os.environ, SLURM_TESTBED_DIR=folder, FRESH="1", **settings)
    env.pop("SLURM_CONF", None)
    try:
        up = subprocess.run(["bash", str(TESTBED), "up"], env=env, capture_output=True, text=True, timeout=180)
        if up.returncode != 0:
            raise ClusterDown("cannot bring up %s: %s" % (what, (up.stderr.strip().splitlines() or ["?"])[-1]))
        yield cluster_env(env)
    finally:
        subprocess.run(["bash", str(TESTBED), "down"], env=env, capture_output=True, timeout=120)
        shutil.rmtree(folder, ignore_errors=True)


class NoAccounting(Exception):
    """Why a cluster with accounting cannot come up here (the caller skips with it)."""


@contextlib.contextmanager
def dbd_cluster(prefix: str, ctld_port: str, slurmd_port_base: str, dbd_port: str, nodes: int = 2,
                gpus: int = 8) -> Iterator[dict[str, str]]:
    """A fresh test cluster with MariaDB + slurmdbd (``ACCOUNTING=dbd``) in a new folder
    under /tmp, on the given ports (its accounting database is its own:
    ``slurm_acct_db_<dbd_port>``); yields its environment, takes it down after.

    Raises:
        NoAccounting: slurmdbd or MariaDB is not installed, or the cluster did not come up
            (the last line of testbed.sh's output says why).
    """
    missing = [p for p in ("/usr/sbin/slurmdbd", "/usr/sbin/mariadbd") if not os.path.exists(p)]
    if missing:
        raise NoAccounting("no accounting here: %s not installed (apt-get install slurmdbd mariadb-server"
                           " slurm-wlm-mysql-plugin; tests/run-all.sh does, and tests/slurm/other-debian.sh"
                           " in its chroot)" % ", ".join(missing))
    folder = tempfile.mkdtemp(prefix=prefix, dir="/tmp")
    os.chmod(folder, 0o755)  # mariadbd runs as mysql and keeps its log under it (mkdtemp: 0700)
    env = dict(os.environ, SLURM_TESTBED_DIR=folder, NODES=str(nodes), GPUS=str(gpus), FRESH="1",
               ACCOUNTING="dbd", CTLD_PORT=ctld_port, SLURMD_PORT_BASE=slurmd_port_base, DBD_PORT=dbd_port)
    env.pop("SLURM_CONF", None)
    try:
        try:
            up = subprocess.run(["bash", str(TESTBED), "up"], env=env, capture_output=True, text=True, timeout=240)
        except subprocess.TimeoutExpired as exc:
            up = subprocess.CompletedProcess(exc.cmd, 124, "", "testbed.sh up took over 240 s")
        if up.returncode != 0:
            why = ((up.stderr or up.stdout).strip().splitlines() or ["?"])[-1]
            raise NoAccounting("cannot bring up a test cluster with accounting (MariaDB + slurmdbd): %s" % why)
        yield cluster_env(env)
    finally:
        subprocess.run(["bash", str(TESTBED), "down"], env=env, capture_output=True, timeout=120)
        shutil.rmtree(folder, ignore_errors=True)
