"""A cluster kept in a JSON file, for controller ticks run as separate processes
(``test_controller_guard.py``): every process sees what the others applied, as with
Slurm. ``GUARD_SNAPSHOT_SLEEP_S`` slows ``snapshot`` (so two ticks overlap);
``GUARD_KILL_AFTER_APPLY=1`` kills the process with SIGKILL right after the first change
is applied (between Slurm's update and the database write). Every applied change is
appended to ``<state>.applied`` as ``<pid> <job_id> <what>``.

Run as a script, it is one ``pipeswift controller tick`` (``run_one_tick``) over that
cluster: ``python guard_backend.py STATE CONFIG``.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from pipeswift_slurm.core import token
from pipeswift_slurm.core.model import ClusterView, Decision, GpuRequest, Job, Node

NOW = 1_700_000_000.0
ARGV = ("--num-layers", "24", "--hidden-size", "1024", "--num-attention-heads", "16", "--seq-length", "1024",
        "--max-position-embeddings", "1024", "--micro-batch-size", "4", "--global-batch-size", "64",
        "--train-iters", "1000")
PROFILE = token.encode_profile(token.ProfileRequest(ARGV, gpus=(1, 16), world_size=1))  # as psbatch records it


def pending(job_id: int, gpus: int = 1, **kw: Any) -> Job:
    values = dict(job_id=job_id, state="PENDING", submit_time=NOW - 600, num_nodes=1, gpus=gpus, opted_in=True,
                  comment=PROFILE, state_reason="Priority", gpu_request=GpuRequest("tres_per_node", gpus),
                  time_limit_s=3600, partition="gpu")
    values.update(kw)
    return Job(**values)  # type: ignore[arg-type]


def write_state(path: Path, jobs: list[Job]) -> None:
    path.write_text(json.dumps([{"job_id": j.job_id, "gpus": j.gpus, "num_nodes": j.num_nodes,
                                 "admin_comment": j.admin_comment, "state_reason": j.state_reason,
                                 "site_factor": j.site_factor, "time_limit_s": j.time_limit_s,
                                 "opted_in": j.opted_in} for j in jobs]))


def read_state(path: Path) -> list[Job]:
    from pipeswift_slurm.slurm.backends.slurm_parse import decision_config

    jobs = []
    for row in json.loads(path.read_text()):
        job = pending(row["job_id"], row["gpus"], num_nodes=row["num_nodes"], admin_comment=row["admin_comment"],
                      state_reason=row["state_reason"], time_limit_s=row["time_limit_s"], opted_in=row["opted_in"],
                      gpu_request=GpuRequest("tres_per_node", row["gpus"] // max(1, row["num_nodes"])))
        jobs.append(replace(job, config=decision_config(job.admin_comment, job.job_id),
                            site_factor=0 if job.held else row["site_factor"]))
    return jobs


class FileBackend:
    """The cluster in ``state`` (JSON): one node of 16 GPUs, the jobs written there."""

    name = "file"

    def __init__(self, state: Path) -> None:
        self.state = state
        self.applied: list[Decision] = []

    def snapshot(self) -> ClusterView:
        time.sleep(float(os.environ.get("GUARD_SNAPSHOT_SLEEP_S", "0")))
        return ClusterView(now=NOW, nodes=(Node("node1", 16, partitions=("gpu",)),), jobs=tuple(read_state(self.state)))

    def apply(self, decision: Decision, job: Job) -> None:
        jobs = {j.job_id: j for j in read_state(self.state)}
        current = jobs[job.job_id]
        changes: dict[str, Any] = {}
        if decision.config is not None:
            cfg = decision.config
            changes.update(gpus=cfg.gpus, num_nodes=cfg.num_nodes,
                           admin_comment=token.encode_decision(cfg, int(NOW), held=bool(decision.hold)))
        if decision.site_factor is not None:
            changes["site_factor"] = decision.site_factor
        if decision.time_limit_s is not None:
            changes["time_limit_s"] = decision.time_limit_s
        if decision.hold is not None:
            changes["state_reason"] = "JobHeldAdmin" if decision.hold else "Priority"
        jobs[job.job_id] = replace(current, **changes)
        write_state(self.state, list(jobs.values()))
        self.applied.append(decision)
        with open(str(self.state) + ".applied", "a") as log:
            log.write("%d %d %s\n" % (os.getpid(), job.job_id, sorted(changes)))
        if os.environ.get("GUARD_KILL_AFTER_APPLY") == "1":
            os.kill(os.getpid(), signal.SIGKILL)


def main(state: str, config_path: str) -> None:
    """One cron-style tick over the file cluster (the CLI's lock, lease and error lines)."""
    import logging

    from pipeswift_slurm.cli.common import Obj
    from pipeswift_slurm.cli.controller import run_one_tick
    from pipeswift_slurm.slurm import backends
    from pipeswift_slurm.slurm.config import load_config

    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(message)s")
    backend = FileBackend(Path(state))
    backends.get_backend = lambda name, partitions=None: backend  # type: ignore[assignment]
    report = run_one_tick(load_config(config_path), Obj(0, None))
    print("acted" if report is not None else "did not act", len(backend.applied))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
