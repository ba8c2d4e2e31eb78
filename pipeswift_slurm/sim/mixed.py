"""Mixed clusters in the simulator: partitions of different GPU types, and the partition
each job of a workload is submitted to and allows.

A partition is written ``NAME=GPU_TYPE:NODESxGPUS`` (``simulate --partition``, e.g.
``a100=A100-80GB:4x8``). Each job is submitted to one partition it fits in (enough GPUs,
and nodes big enough for its layout), drawn with probability proportional to the
partitions' GPUs (users spread over what the site has), seeded per job so every policy of
a run sees the same draw. A share ``flex`` of the jobs (also drawn per job) allow every
partition they fit in, as ``-p a,b`` or ``psbatch --pipeswift-partitions`` would say; the
rest allow only their own. A job that fits in no partition is dropped (counted). The
truth of a job is the truth of the GPU type it runs on.
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass, replace
from typing import Optional, Sequence

from pipeswift_slurm.core.hardware import GpuType, HardwareError, get_gpu_type
from pipeswift_slurm.sim.workload import WorkloadError, WorkloadJob

_SPEC = re.compile(r"^([A-Za-z0-9_.-]{1,64})=([A-Za-z0-9_.-]{1,64}):([0-9]{1,5})x([0-9]{1,3})$")


@dataclass(frozen=True)
class SimPartition:
    """One partition of a simulated mixed cluster."""

    name: str
    gpu: GpuType
    num_nodes: int
    gpus_per_node: int

    @property
    def gpus(self) -> int:
        return self.num_nodes * self.gpus_per_node

    def text(self) -> str:
        return "%s=%s:%dx%d" % (self.name, self.gpu.name, self.num_nodes, self.gpus_per_node)


def parse_partition(text: str, hardware: Optional[str] = None) -> SimPartition:
    """``NAME=GPU_TYPE:NODESxGPUS`` as a SimPartition.

    Raises:
        WorkloadError: not in that form, zero nodes or GPUs, or an unknown GPU type.
    """
    match = _SPEC.match(text.strip())
    if not match:
        raise WorkloadError("%r: write NAME=GPU_TYPE:NODESxGPUS, e.g. a100=A100-80GB:4x8" % text[:80])
    name, kind, nodes, gpn = match.group(1), match.group(2), int(match.group(3)), int(match.group(4))
    if not nodes or not gpn:
        raise WorkloadError("%r: needs at least one node and one GPU per node" % text[:80])
    try:
        gpu = get_gpu_type(kind, hardware)
    except HardwareError as exc:
        raise WorkloadError("%r: %s" % (text[:80], exc)) from None
    return SimPartition(name, gpu, nodes, gpn)


def check_partitions(partitions: Sequence[SimPartition]) -> None:
    """Raises WorkloadError when two partitions share a name."""
    names = [p.name for p in partitions]
    if len(set(names)) != len(names):
        raise WorkloadError("%s: each partition name once" % ", ".join(names))


def _fits(job: WorkloadJob, part: SimPartition) -> bool:
    if job.profile is None:
        return job.gpus <= part.gpus and job.as_ran_gpus_per_node <= part.gpus_per_node
    return job.gpus <= part.gpus and job.profile.requested.gpus_per_node <= part.gpus_per_node


def assign_partitions(jobs: Sequence[WorkloadJob], partitions: Sequence[SimPartition], flex: float,
                      seed: int) -> tuple[list[WorkloadJob], int]:
    """The jobs with the partition each is submitted to and those it allows (module
    docstring), and how many fit in none (dropped)."""
    out: list[WorkloadJob] = []
    dropped = 0
    for job in jobs:
        fits = [p for p in partitions if _fits(job, p)]
        if not fits:
            dropped += 1
            continue
        rng = random.Random(seed * 1_000_003 + job.job_id)
        asked = rng.choices(fits, weights=[p.gpus for p in fits])[0]
        allows = tuple(p.name for p in fits) if len(fits) > 1 and rng.random() < flex else ()
        out.append(replace(job, partition=asked.name, partitions=allows))
    return out, dropped
