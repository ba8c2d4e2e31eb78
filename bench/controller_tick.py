"""Controller tick wall time with many pending opted-in jobs on the test cluster, with and
without batched ``scontrol update``s: ``batched`` (BATCH_PROCESSES scontrol processes fed
on stdin side by side), ``batched_1_process`` (one), ``unbatched`` (one process per job).

Needs the test cluster (tests/slurm/testbed.sh up; source its env.sh). Holds every node
with an exclusive blocker, submits N opted-in 1 x 1-GPU jobs (flexible 1-8) behind it,
then per mode and repetition: resets every job to its submitted state (one batched
scontrol), runs a *first* tick on a fresh database (every job gets an update) and a second,
*idempotent* tick (nothing new: ~0 updates), each through the Python API with the time
split into snapshot, decide (policy), act (updates) and record (store transaction), plus
the remainder (ingest, ordering). It also times a cron-style ``pipeswift controller tick``
subprocess (interpreter start included) on the idempotent state. Medians of --repeat runs.
Everything submitted is cancelled at the end. Prints JSON; never passes or fails on time.

    python bench/controller_tick.py [--jobs 500] [--repeat 3]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Optional

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout's code, not an installed one

from pipeswift_slurm.core import token  # noqa: E402
from pipeswift_slurm.slurm.backends.slurm_cli import BATCH_PROCESSES, SlurmCliBackend, SubprocessRunner  # noqa: E402
from pipeswift_slurm.slurm.controller import Controller  # noqa: E402
from pipeswift_slurm.core.costmodel import CostModel  # noqa: E402
from pipeswift_slurm.core.estimator import Estimator  # noqa: E402
from pipeswift_slurm.core.hardware import get_gpu_type  # noqa: E402
from pipeswift_slurm.core.model import ClusterView, Decision, Job  # noqa: E402
from pipeswift_slurm.policy import get_policy  # noqa: E402
from pipeswift_slurm.store.history import Store  # noqa: E402

MEGATRON = ("--num-layers", "24", "--hidden-size", "1024", "--num-attention-heads", "16",
            "--seq-length", "1024", "--max-position-embeddings", "1024", "--micro-batch-size", "4",
            "--global-batch-size", "64", "--train-iters", "1000")
PROFILE = token.encode_profile(token.ProfileRequest(MEGATRON, gpus=(1, 8)))


class TimedBackend:
    """Wraps the CLI backend and adds up the seconds spent observing and acting.
    ``batched=False`` hides ``apply_many`` so the controller applies one job at a time."""

    name = "cli"

    def __init__(self, inner: SlurmCliBackend, batched: bool) -> None:
        self.inner = inner
        self.snapshot_s = self.act_s = 0.0
        if batched:
            self.apply_many = self._apply_many

    def snapshot(self) -> ClusterView:
        t0 = time.perf_counter()
        try:
            return self.inner.snapshot()
        finally:
            self.snapshot_s += time.perf_counter() - t0

    def apply(self, decision: Decision, job: Job) -> None:
        t0 = time.perf_counter()
        try:
            self.inner.apply(decision, job)
        finally:
            self.act_s += time.perf_counter() - t0

    def _apply_many(self, items: list[tuple[Decision, Job]]) -> list[Any]:
        t0 = time.perf_counter()
        try:
            return self.inner.apply_many(items)
        finally:
            self.act_s += time.perf_counter() - t0


def timed_tick(db: Path, batched: bool, processes: int) -> dict[str, float]:
    """One cron-like tick (fresh Controller, as ``pipeswift controller tick`` builds it)."""
    inner = SlurmCliBackend(run=SubprocessRunner(timeout_s=300), batch_processes=processes)
    backend = TimedBackend(inner, batched)
    estimator = Estimator(CostModel(get_gpu_type("A100-80GB")), 8)
    controller = Controller(backend, get_policy("pipeswift"), estimator, Store.from_url(str(db)))
    t0 = time.perf_counter()
    report = controller.tick()
    wall_s = time.perf_counter() - t0
    record_s = wall_s - report.duration_s
    return {"wall_s": wall_s, "snapshot_s": backend.snapshot_s, "decide_s": report.decide_s,
            "act_s": backend.act_s, "record_s": record_s,
            "other_s": report.duration_s - backend.snapshot_s - report.decide_s - backend.act_s,
            "n_pending": len(report.view.pending), "n_decisions": len(report.decisions),
            "n_updates": len(report.applied), "n_skipped": len(report.skipped), "n_errors": len(report.errors)}


def median_of(runs: list[dict[str, float]]) -> dict[str, float]:
    return {k: round(statistics.median(r[k] for r in runs), 4) for k in runs[0]}


def sbatch(*args: str) -> int:
    out = subprocess.run(["sbatch", "--parsable", "-o", "/dev/null", "-D", "/tmp", *args],
                         capture_output=True, text=True, check=True, timeout=60).stdout
    return int(out.strip().split(";")[0])


def submit_jobs(n: int) -> list[int]:
    with ThreadPoolExecutor(max_workers=8) as pool:
        return list(pool.map(lambda _: sbatch("-N1", "--gpus-per-node=1", "--comment", PROFILE,
                                              "-J", "bench", "--wrap", "sleep 600"), range(n)))


def wait_running(job_id: int, timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while "JobState=RUNNING" not in subprocess.run(["scontrol", "-o", "show", "job", str(job_id)],
                                                   capture_output=True, text=True).stdout:
        if time.monotonic() > deadline:
            sys.exit("blocker %d did not start" % job_id)
        time.sleep(0.3)


def reset_jobs(job_ids: list[int]) -> None:
    """Every job back to what it was submitted with (size, no SiteFactor, no decision)."""
    lines = "".join("update JobId=%d NumNodes=1-1 TresPerNode=gres:gpu:1 TimeLimit=60 SiteFactor=0 "
                    "AdminComment=bench-reset\n" % j for j in job_ids)
    done = SubprocessRunner(timeout_s=300).feed(["scontrol"], lines)
    if done.returncode or done.stderr.strip():
        sys.exit("reset failed: %s" % done.stderr.strip()[:500])


def cli_tick_s(config: Path) -> float:
    argv = [sys.executable, "-m", "pipeswift_slurm.cli", "controller", "tick", "--config", str(config)]
    t0 = time.perf_counter()
    done = subprocess.run(argv, capture_output=True, text=True, check=False, timeout=300)
    if done.returncode:
        sys.exit("cli tick failed: %s" % done.stderr.strip())
    return time.perf_counter() - t0


def measure(job_ids: list[int], work: Path, repeat: int, batched: bool, processes: int) -> dict[str, Any]:
    first, second = [], []
    for i in range(repeat):
        reset_jobs(job_ids)
        db = work / ("%s-%d-%d.sqlite" % ("batched" if batched else "unbatched", processes, i))
        first.append(timed_tick(db, batched, processes))
        second.append(timed_tick(db, batched, processes))
    return {"first_tick": median_of(first), "idempotent_tick": median_of(second),
            "first_tick_wall_s_runs": [round(r["wall_s"], 3) for r in first]}


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=500)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args(argv)
    if not os.environ.get("SLURM_CONF") or not shutil.which("sbatch"):
        sys.exit("no test cluster: run tests/slurm/testbed.sh up and source its env.sh")
    nodes = int(subprocess.run(["sinfo", "-h", "-o", "%D"], capture_output=True, text=True, check=True).stdout.split()[0])
    submitted: list[int] = []
    try:
        blocker = sbatch("-N%d" % nodes, "--exclusive", "--gpus-per-node=8", "-J", "bench-blocker", "--wrap", "sleep 3600")
        submitted.append(blocker)
        wait_running(blocker)
        t0 = time.perf_counter()
        job_ids = submit_jobs(args.jobs)
        submitted += job_ids
        submit_s = time.perf_counter() - t0
        with tempfile.TemporaryDirectory(prefix="pswift-bench-") as tmp:
            work = Path(tmp)
            result: dict[str, Any] = {"bench": "controller_tick", "pending_opted_in_jobs": args.jobs,
                                      "nodes": nodes, "repeat": args.repeat, "submit_s": round(submit_s, 2)}
            result["batched"] = measure(job_ids, work, args.repeat, True, BATCH_PROCESSES)
            result["batched_1_process"] = measure(job_ids, work, args.repeat, True, 1)
            result["unbatched"] = measure(job_ids, work, args.repeat, False, 1)
            config = work / "config.toml"
            config.write_text('[store]\nurl = "%s"\n[slurm]\nbackend = "cli"\n[controller]\nlock_file = "%s"\n'
                              % (work / "cli.sqlite", work / "lock"))
            cli_tick_s(config)  # first tick (state as the unbatched runs left it)
            result["cli_idempotent_tick_s"] = round(statistics.median(cli_tick_s(config)
                                                                      for _ in range(args.repeat)), 3)
            b, u = result["batched"], result["unbatched"]
            result["first_tick_speedup"] = round(u["first_tick"]["wall_s"] / b["first_tick"]["wall_s"], 2)
            result["goal_s"] = 2.0
        print(json.dumps(result, indent=2))
    finally:
        if submitted:
            subprocess.run(["scancel", *map(str, submitted)], capture_output=True, check=False)
    return 0


if __name__ == "__main__":
    sys.exit(main())
