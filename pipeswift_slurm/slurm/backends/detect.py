"""Choose the Slurm backend for ``get_backend("auto")``: pyslurm when it is installed, its
major.minor equals the running Slurm's and a slurm.conf is reachable; else the Slurm commands.

Never imports pyslurm in this process: without a reachable slurm.conf ``import pyslurm`` kills
the interpreter (a C-level fatal), so its version comes from package metadata and the trial
import runs in a child process. Imports nothing from the rest of the package but the errors.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import logging
import os
import re
import shutil
import subprocess
import sys
from typing import Callable, Optional

from pipeswift_slurm.slurm.backends import BackendError

log = logging.getLogger(__name__)

_CONF_PATHS = ("/etc/slurm/slurm.conf", "/etc/slurm-llnl/slurm.conf", "/usr/local/etc/slurm.conf")


def major_minor(version: str) -> Optional[str]:
    """``"slurm 22.05.8"`` / ``"25.11.2"`` -> ``"22.05"`` (None if no version is found)."""
    match = re.search(r"(\d+)\.(\d+)", version or "")
    return "%s.%02d" % (match.group(1), int(match.group(2))) if match else None


def slurm_conf_reachable(environ: Optional[dict[str, str]] = None) -> bool:
    """True if ``SLURM_CONF`` or a standard slurm.conf path names an existing file."""
    env = os.environ if environ is None else environ
    if env.get("SLURM_CONF"):
        return os.path.isfile(env["SLURM_CONF"])
    return any(os.path.isfile(path) for path in _CONF_PATHS)


def _pyslurm_version() -> Optional[str]:
    if importlib.util.find_spec("pyslurm") is None:
        return None
    try:
        return importlib.metadata.version("pyslurm")
    except importlib.metadata.PackageNotFoundError:
        return None


def _slurm_version() -> Optional[str]:
    try:
        proc = subprocess.run(["scontrol", "-V"], capture_output=True, text=True, timeout=20, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return proc.stdout.strip() if proc.returncode == 0 else None


def _imports_in_child() -> bool:
    try:
        proc = subprocess.run([sys.executable, "-c", "import pyslurm"], capture_output=True,
                              timeout=60, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return proc.returncode == 0


def detect_backend(pyslurm_version: Callable[[], Optional[str]] = _pyslurm_version,
                   slurm_version: Callable[[], Optional[str]] = _slurm_version,
                   conf_reachable: Callable[[], bool] = slurm_conf_reachable,
                   imports_ok: Callable[[], bool] = _imports_in_child,
                   which: Callable[[str], Optional[str]] = shutil.which) -> str:
    """Return "pyslurm" or "cli" (the probes are injectable for tests).

    Raises:
        BackendError: neither pyslurm nor the Slurm client commands are usable.
    """
    have = pyslurm_version()
    if have:
        running = slurm_version()
        if not conf_reachable():
            log.info("pyslurm %s installed but no slurm.conf is reachable; not using it", have)
        elif major_minor(have) != major_minor(running or ""):
            log.info("pyslurm %s does not match Slurm %s; using the Slurm commands", have, running)
        elif imports_ok():
            return "pyslurm"
        else:
            log.warning("pyslurm %s matches Slurm %s but does not import; using the commands", have, running)
    if which("squeue"):
        return "cli"
    raise BackendError("no Slurm found: neither a matching pyslurm nor squeue on PATH; install the Slurm"
                       " client commands on this host (`pipeswift simulate` tries the policies without Slurm)")
