"""The GPUs a job really got, read from Slurm's environment inside the allocation (for
``pipeswift-launch``, ``submit/launcher.py``).

In this order (first that answers wins):
  nodes:          SLURM_JOB_NUM_NODES, SLURM_NNODES, else 1;
  GPUs per node:  SLURM_GPUS_ON_NODE (slurmd's count on this node), SLURM_JOB_GPUS (index
                  list), CUDA_VISIBLE_DEVICES (list), SLURM_GPUS_PER_NODE ("[type:]N"),
                  SLURM_GPUS ("[type:]N" per job) / nodes, SLURM_TRES_PER_TASK
                  ("gres/gpu:N") x SLURM_NTASKS_PER_NODE (default 1).
Nodes are assumed to hold the same number of GPUs (Megatron needs that too). Pure: reads
only the mapping it is given.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Optional


class LaunchError(Exception):
    """The launcher cannot run the command (bad usage or no allocation)."""


@dataclass(frozen=True)
class Allocation:
    """The GPUs this job really got. ``source`` names the variable the count came from."""

    num_nodes: int
    gpus_per_node: int
    job_id: Optional[int] = None
    source: str = ""

    @property
    def gpus(self) -> int:
        return self.num_nodes * self.gpus_per_node


# Slurm's counts and ids have at most a dozen digits; a longer run of digits in what the
# environment says is no count (and 5,000 of them are past what int() converts)
MAX_ENV_DIGITS = 12


def _int(text: Optional[str]) -> Optional[int]:
    """A count or id as Slurm writes one (digits only); anything else is no count."""
    m = re.fullmatch(r"\s*(\d{1,%d})\s*" % MAX_ENV_DIGITS, text or "")
    return int(m.group(1)) if m else None


def _typed_int(text: Optional[str]) -> Optional[int]:
    """A "[type:]N" count (``SLURM_GPUS_PER_NODE``, ``SLURM_GPUS``)."""
    m = re.fullmatch(r"\s*(?:[A-Za-z0-9_.-]+:)?(\d{1,%d})\s*" % MAX_ENV_DIGITS, text or "")
    return int(m.group(1)) if m else None


def _list_len(text: Optional[str]) -> Optional[int]:
    if text is None or not text.strip() or text.strip() in ("NoDevFiles", "N/A"):
        return None
    return len([x for x in text.split(",") if x.strip()])


def allocation_from_env(env: dict[str, str]) -> Allocation:
    """Read the allocation from Slurm's environment (order in the module docstring).

    Raises:
        LaunchError: no GPU count can be found.
    """
    nodes = _int(env.get("SLURM_JOB_NUM_NODES")) or _int(env.get("SLURM_NNODES")) or 1
    job_id = _int(env.get("SLURM_JOB_ID")) or _int(env.get("SLURM_JOBID"))
    candidates = (
        ("SLURM_GPUS_ON_NODE", _int(env.get("SLURM_GPUS_ON_NODE"))),
        ("SLURM_JOB_GPUS", _list_len(env.get("SLURM_JOB_GPUS"))),
        ("CUDA_VISIBLE_DEVICES", _list_len(env.get("CUDA_VISIBLE_DEVICES"))),
        ("SLURM_GPUS_PER_NODE", _typed_int(env.get("SLURM_GPUS_PER_NODE"))),
        ("SLURM_GPUS", (_typed_int(env.get("SLURM_GPUS")) or 0) // nodes or None),
        ("SLURM_TRES_PER_TASK", _tres_gpus(env.get("SLURM_TRES_PER_TASK"))
         and _tres_gpus(env.get("SLURM_TRES_PER_TASK"), _int(env.get("SLURM_NTASKS_PER_NODE")) or 1)),
    )
    for name, count in candidates:
        if count:
            return Allocation(nodes, count, job_id, name)
    raise LaunchError("no GPU count in this allocation (none of SLURM_GPUS_ON_NODE, SLURM_JOB_GPUS,"
                      " CUDA_VISIBLE_DEVICES, SLURM_GPUS_PER_NODE, SLURM_GPUS, SLURM_TRES_PER_TASK gives one;"
                      " --local-gpus N sets it outside Slurm)")


def _tres_gpus(text: Optional[str], tasks: int = 1) -> Optional[int]:
    m = re.search(r"gres[:/]gpu(?::[^:,]+)?:(\d{1,%d})(?!\d)" % MAX_ENV_DIGITS, text or "")
    return int(m.group(1)) * tasks if m else None
