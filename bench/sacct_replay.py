#!/usr/bin/env python3
"""Wall time of ``pipeswift simulate --sacct`` on a generated site history: ``--jobs`` jobs
(default 10,000) over ``--days`` (default 28) in ``sacct --json`` (Slurm 22.05 dialect, the
fields the reader uses), a share ``--megatron`` of them with a psbatch profile token (half
of those allowing half to double their GPUs), on a cluster sized for offered load
``--load``. Prints JSON with the wall times. Goal (issue 26): a 4-week replay of 10,000
jobs in under 5 minutes.

The jobs' shape (GPU counts, run times, users) is the synthetic LLM-cluster mix of
``sim/workload.py``; each job waited an exponential time (mean ``--mean-wait-min``) before
it started, as if on the real cluster. Usage:

    python bench/sacct_replay.py [--jobs 10000] [--days 28] [--load 0.8] [--megatron 0.3]
                                 [--policy fifo,slurm,sjf,tiresias,pipeswift] [--keep FILE]
"""

import argparse
import json
import math
import os
import random
import subprocess
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # this checkout's code, not an installed one

from pipeswift_slurm.core.costmodel import CostModel  # noqa: E402
from pipeswift_slurm.core.hardware import DEFAULT_GPU_TYPE, get_gpu_type  # noqa: E402
from pipeswift_slurm.core.token import ProfileRequest, encode_profile  # noqa: E402
from pipeswift_slurm.sim.workload import Conversion, synthetic_trace, to_megatron_job  # noqa: E402

START_S = 1_790_000_000  # a date in 2026, as a real export's epoch seconds


def generate(jobs: int, days: float, load: float, megatron: float, mean_wait_s: float,
             seed: int) -> tuple[dict, int]:
    """The sacct --json document and the cluster's GPU count (a multiple of 8)."""
    rows = synthetic_trace(jobs, 10 ** 6, 1.0, seed)
    work = sum(r.num_gpus * r.duration_s for r in rows)
    gpus = max(max(r.num_gpus for r in rows), 8 * math.ceil(work / (load * days * 86400.0) / 8))
    span = max(r.submit_s for r in rows) - min(r.submit_s for r in rows)
    stretch = days * 86400.0 / span
    rows = [replace(r, submit_s=START_S + (r.submit_s - rows[0].submit_s) * stretch) for r in rows]
    rng = random.Random(seed)
    conv = Conversion(CostModel(get_gpu_type(DEFAULT_GPU_TYPE)), gpus, 8, flex=0.5, seed=seed)
    out = []
    for i, row in enumerate(rows):
        comment = None
        if rng.random() < megatron:
            job = to_megatron_job(i, row, conv)
            comment = encode_profile(ProfileRequest(job.argv, job.profile.gpu_range if job.profile.flexible
                                                    else None, world_size=row.num_gpus))
        submit = int(row.submit_s)
        start = submit + int(rng.expovariate(1.0 / mean_wait_s))
        end = start + int(row.duration_s)
        nodes = max(1, math.ceil(row.num_gpus / 8))
        out.append({"job_id": 1000 + i, "name": row.name, "user": row.user, "partition": "gpu",
                    "allocation_nodes": nodes, "state": {"current": "COMPLETED", "reason": "None"},
                    "time": {"submission": submit, "eligible": submit, "start": start, "end": end,
                             "elapsed": end - start, "limit": math.ceil(row.duration_s * 1.5 / 60)},
                    "comment": {"administrator": None, "job": comment, "system": None},
                    "tres": {"allocated": [{"type": "cpu", "name": None, "id": 1, "count": nodes},
                                           {"type": "gres", "name": "gpu", "id": 1001, "count": row.num_gpus}]}})
    meta = {"plugin": {"type": "openapi/dbv0.0.38"}, "Slurm": {"version": {"major": 22, "minor": 5, "micro": 8},
                                                               "release": "22.05.8"}}
    return {"meta": meta, "errors": [], "jobs": out}, gpus


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=10000)
    parser.add_argument("--days", type=float, default=28.0)
    parser.add_argument("--load", type=float, default=0.8)
    parser.add_argument("--megatron", type=float, default=0.3)
    parser.add_argument("--mean-wait-min", type=float, default=30.0)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--policy", default="fifo,slurm,sjf,tiresias,pipeswift")
    parser.add_argument("--keep", help="Keep the generated sacct --json file here.")
    args = parser.parse_args()
    t0 = time.perf_counter()
    doc, gpus = generate(args.jobs, args.days, args.load, args.megatron, args.mean_wait_min * 60, args.seed)
    generate_s = time.perf_counter() - t0
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(args.keep or os.path.join(tmp, "sacct.json"))
        path.write_text(json.dumps(doc))
        metrics = Path(tmp) / "m.json"
        t1 = time.perf_counter()
        run = subprocess.run([sys.executable, "-m", "pipeswift_slurm.cli", "simulate", "--sacct", str(path),
                              "--gpus", str(gpus), "--gpus-per-node", "8", "--policy", args.policy,
                              "--json", str(metrics)], cwd=ROOT, env=dict(os.environ, PYTHONPATH=str(ROOT)),
                             capture_output=True, text=True)
        replay_s = time.perf_counter() - t1
        if run.returncode != 0:
            print(run.stderr, file=sys.stderr)
            return run.returncode
        facts = json.loads(metrics.read_text())
    w = facts["workload"]
    json.dump({"jobs": args.jobs, "days": args.days, "gpus": gpus, "megatron_share": args.megatron,
               "replayed_jobs": w["jobs"], "flexible_jobs": w["flexible_jobs"], "replayed_as_ran": w["replayed_as_ran"],
               "offered_load": round(w["offered_load"], 3), "file_mb": round(path.stat().st_size / 1e6, 1)
               if args.keep else None, "generate_s": round(generate_s, 1), "replay_wall_s": round(replay_s, 1),
               "goal_s": 300, "as_ran_mean_jct_s": facts["what_changed"]["as_ran_mean_jct_s"],
               "policies": [{"policy": m["policy"], "sim_wall_s": round(m["wall_s"], 1),
                             "mean_jct_s": m["mean_jct_s"]} for m in facts["policies"]]},
              sys.stdout, indent=2)
    print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
