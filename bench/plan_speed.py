#!/usr/bin/env python3
"""`pipeswift plan` for a 96-layer model over 1-512 GPUs, process start included.

Prints JSON: median and max wall time of ``--repeat`` runs of the real console command
(a fresh Python process each time), and the in-process planning time alone. Goal: under
0.5 s on a 2-core machine, process start included.
"""

import json
import statistics
import subprocess
import sys
import time

ARGS = ["--num-layers", "96", "--hidden-size", "12288", "--num-attention-heads", "96", "--seq-length", "2048",
        "--global-batch-size", "1536", "--micro-batch-size", "1", "--tensor-model-parallel-size", "8",
        "--pipeline-model-parallel-size", "16", "--train-iters", "1000", "--bf16", "--use-distributed-optimizer"]
COMMAND = [sys.executable, "-m", "pipeswift_slurm.cli", "plan", "--gpus", "1-512", "--json", "--top", "5", "--"]


def main() -> int:
    repeat = int(sys.argv[1]) if len(sys.argv) > 1 else 5
    walls = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        out = subprocess.run(COMMAND + ARGS, capture_output=True, text=True, check=True)
        walls.append(time.perf_counter() - t0)
    valid = json.loads(out.stdout)["valid_configs"]
    start = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        subprocess.run([sys.executable, "-c", "import pipeswift_slurm.cli.main"], check=True)
        start.append(time.perf_counter() - t0)
    from pipeswift_slurm.core.costmodel import CostModel
    from pipeswift_slurm.core.hardware import get_gpu_type
    from pipeswift_slurm.core.megatron import profile_from_argv
    from pipeswift_slurm.core.planner import Planner

    profile = profile_from_argv(ARGS, world_size=1024).with_range(1, 512)
    t0 = time.perf_counter()
    Planner(CostModel(get_gpu_type("A100-80GB")), 8).plan(profile, 1, 512)
    inproc = time.perf_counter() - t0
    json.dump({"command": "pipeswift plan --gpus 1-512 (96 layers)", "valid_configs": valid,
               "wall_s_median": round(statistics.median(walls), 3), "wall_s_max": round(max(walls), 3),
               "process_start_s_median": round(statistics.median(start), 3), "planning_in_process_s": round(inproc, 3),
               "goal_s": 0.5, "repeat": repeat}, sys.stdout, indent=2)
    print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
