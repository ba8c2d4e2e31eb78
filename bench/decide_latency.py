#!/usr/bin/env python3
"""decide() latency of every policy, cold and warm, at 100 to 10,000 pending jobs.

For 100 / 1,000 / 10,000 pending jobs on 64 / 1,024 / 8,192 GPUs it prints JSON: per
(policy, pending, gpus) the cold first call (empty caches)
and the median and max of the next ``--repeat`` calls on views that change a little
between calls (time advances, one job arrives), as the controller sees them.

Each measurement runs in a fresh Python process, as a cron tick does (``--runs`` of them
per case: the cold figure is their median, with the smallest and largest beside it, and
the median CPU time of the cold call, less sensitive to other load on a shared machine).
``--against DIR`` measures another checkout's code too (e.g. ``git worktree add /tmp/before
main``), alternating with this one run by run, and compares the decisions of every call
(a digest of the decision lists): it exits 1 when they differ anywhere.

Usage: python bench/decide_latency.py [--repeat 5] [--runs 3] [--policies pipeswift,sjf,...]
       [--quick] [--against DIR]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import random
import statistics
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parents[1]  # this checkout's code, not an installed one
CASES = ((100, 64), (1000, 1024), (10000, 8192))


def build_view(pending: int, gpus: int, seed: int, cost: Any) -> tuple[Any, dict]:
    """A cluster ~90 % busy with running jobs and ``pending`` queued flexible jobs."""
    from pipeswift_slurm.core.model import PENDING, RUNNING, ClusterView, Job, Node
    from pipeswift_slurm.sim.workload import Conversion, TraceRow, to_megatron_job

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


def digest(decisions: list) -> str:
    """A short digest of a decision list (every field, floats by repr)."""
    return hashlib.sha256(repr(decisions).encode()).hexdigest()[:16]


def measure(policy_name: str, pending: int, gpus: int, repeat: int) -> dict:
    """One case in this process: the cold first call, then ``repeat`` warm ones."""
    from pipeswift_slurm.core.costmodel import CostModel
    from pipeswift_slurm.core.estimator import Estimator
    from pipeswift_slurm.core.hardware import get_gpu_type
    from pipeswift_slurm.policy import get_policy

    cost = CostModel(get_gpu_type("A100-80GB"))
    view, profiles = build_view(pending, gpus, 7, cost)
    estimator = Estimator(cost, 8)
    policy = get_policy(policy_name)
    t0, cpu0 = time.perf_counter(), time.process_time()
    decisions = policy.decide(view, profiles, estimator)
    cold_s, cold_cpu_s = time.perf_counter() - t0, time.process_time() - cpu0
    digests, warm = [digest(decisions)], []
    for k in range(repeat):
        view = replace(view, now=view.now + 60.0 * (k + 1))
        t0 = time.perf_counter()
        decisions = policy.decide(view, profiles, estimator)
        warm.append(time.perf_counter() - t0)
        digests.append(digest(decisions))
    return {"policy": policy_name, "pending": pending, "gpus": gpus, "cold_ms": round(1000 * cold_s, 2),
            "cold_cpu_ms": round(1000 * cold_cpu_s, 2),
            "median_ms": round(1000 * statistics.median(warm), 2) if warm else None,
            "max_ms": round(1000 * max(warm), 2) if warm else None, "decisions": digests}


def run_one(code: Path, policy: str, pending: int, gpus: int, repeat: int) -> dict:
    """``measure`` in a fresh process on ``code``'s package."""
    out = subprocess.run([sys.executable, __file__, "--one", str(code), policy, str(pending), str(gpus), str(repeat)],
                         capture_output=True, text=True, check=True)
    return json.loads(out.stdout)


def summary(rows: list[dict]) -> dict:
    cold = [r["cold_ms"] for r in rows]
    warm = [r["median_ms"] for r in rows if r["median_ms"] is not None]
    return {"cold_ms": round(statistics.median(cold), 1), "cold_min_ms": min(cold), "cold_max_ms": max(cold),
            "cold_cpu_ms": round(statistics.median(r["cold_cpu_ms"] for r in rows), 1),
            "median_ms": round(statistics.median(warm), 1) if warm else None, "runs": len(rows)}


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] == "--one":
        code, policy, pending, gpus, repeat = sys.argv[2:7]
        sys.path.insert(0, code)
        json.dump(measure(policy, int(pending), int(gpus), int(repeat)), sys.stdout)
        return 0
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--runs", type=int, default=3, help="fresh processes per case")
    parser.add_argument("--policies", default="pipeswift,sjf,tiresias")
    parser.add_argument("--quick", action="store_true", help="only the two smaller cases")
    parser.add_argument("--against", type=Path, help="another checkout to measure alternately and compare with")
    args = parser.parse_args()
    cases = CASES[:2] if args.quick else CASES
    codes = {"this": HERE} if args.against is None else {"this": HERE, "against": args.against.resolve()}
    results, differ = [], []
    for policy in args.policies.split(","):
        for pending, gpus in cases:
            rows: dict[str, list[dict]] = {name: [] for name in codes}
            for _ in range(args.runs):
                for name, code in codes.items():
                    rows[name].append(run_one(code, policy, pending, gpus, args.repeat))
            entry: dict[str, Any] = {"policy": policy, "pending": pending, "gpus": gpus}
            entry.update({name: summary(found) for name, found in rows.items()})
            if args.against is not None:
                same = all(r["decisions"] == rows["this"][0]["decisions"] for found in rows.values() for r in found)
                entry["same_decisions"] = same
                if not same:
                    differ.append("%s %d@%d" % (policy, pending, gpus))
            results.append(entry)
    goals = {"1000@1024_cold_ms": 100, "10000@8192_cold_ms": 1000}
    json.dump({"goals": goals, "results": results, "decisions_differ": differ}, sys.stdout, indent=2)
    print()
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())
