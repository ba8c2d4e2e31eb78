#!/usr/bin/env python3
"""decide() latency of every policy for 100 / 1,000 / 10,000 pending jobs on 64 / 1,024 /
8,192 GPUs. Prints JSON: per (policy, pending, gpus) the cold first call (empty caches)
and the median and max of the next ``--repeat`` calls on views that change a little
between calls (time advances, one job arrives), as the controller sees them.

Usage: python bench/decide_latency.py [--repeat 5] [--policies pipeswift,sjf,...] [--quick]
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout's code, not an installed one

from pipeswift_slurm.core.costmodel import CostModel  # noqa: E402
from pipeswift_slurm.core.estimator import Estimator  # noqa: E402
from pipeswift_slurm.core.hardware import get_gpu_type  # noqa: E402
from pipeswift_slurm.core.model import PENDING, RUNNING, ClusterView, Job, Node  # noqa: E402
from pipeswift_slurm.policy import get_policy  # noqa: E402
from pipeswift_slurm.sim.workload import Conversion, TraceRow, to_megatron_job  # noqa: E402

CASES = ((100, 64), (1000, 1024), (10000, 8192))


def build_view(pending: int, gpus: int, seed: int, cost: CostModel) -> tuple[ClusterView, dict]:
    """A cluster ~90 % busy with running jobs and ``pending`` queued flexible jobs."""
    rng = random.Random(seed)
    conv = Conversion(cost, gpus, 8, flex=1.0, seed=seed)
    counts = [1, 1, 1, 2, 2, 4, 8, 8, 16, 32, 64]
    nodes = [Node("n%d" % i, 8) for i in range(gpus // 8)]
    jobs, profiles, busy = [], {}, 0
    for i in range(pending + gpus):
        g = min(rng.choice(counts), gpus)
        row = TraceRow("j%d" % i, float(i), rng.choice([600.0, 3600.0, 6 * 3600.0, 48 * 3600.0]), g)
        wjob = to_megatron_job(i, row, conv)
        running = busy + g <= 0.9 * gpus and i >= pending
        if i >= pending and not running:
            continue
        state = RUNNING if running else PENDING
        busy += g if running else 0
        jobs.append(Job(job_id=i + 1, state=state, submit_time=-rng.uniform(0, 86400), num_nodes=1, gpus=g,
                        start_time=-rng.uniform(0, 3600) if running else None, opted_in=True,
                        time_limit_s=wjob.time_limit_s))
        profiles[i + 1] = wjob.profile
    per_node = busy // max(1, len(nodes))
    nodes = [replace(n, gpus_alloc=min(8, per_node)) for n in nodes]
    return ClusterView(now=0.0, nodes=tuple(nodes), jobs=tuple(jobs)), profiles


def measure(policy_name: str, pending: int, gpus: int, repeat: int) -> dict:
    cost = CostModel(get_gpu_type("A100-80GB"))
    view, profiles = build_view(pending, gpus, 7, cost)
    estimator = Estimator(cost, 8)
    policy = get_policy(policy_name)
    t0 = time.perf_counter()
    policy.decide(view, profiles, estimator)
    cold_s = time.perf_counter() - t0
    warm = []
    for k in range(repeat):
        view = replace(view, now=view.now + 60.0 * (k + 1))
        t0 = time.perf_counter()
        policy.decide(view, profiles, estimator)
        warm.append(time.perf_counter() - t0)
    return {"policy": policy_name, "pending": pending, "gpus": gpus, "cold_ms": round(1000 * cold_s, 2),
            "median_ms": round(1000 * statistics.median(warm), 2), "max_ms": round(1000 * max(warm), 2)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--policies", default="pipeswift,sjf,tiresias")
    parser.add_argument("--quick", action="store_true", help="only the two smaller cases")
    args = parser.parse_args()
    cases = CASES[:2] if args.quick else CASES
    rows = [measure(p, n, g, args.repeat) for p in args.policies.split(",") for n, g in cases]
    goals = {"1000@1024_median_ms": 100, "10000@8192_median_ms": 1000}
    json.dump({"goals": goals, "results": rows}, sys.stdout, indent=2)
    print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
