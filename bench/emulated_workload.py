"""The same 30-job mixed Megatron workload on the real Slurm test cluster, twice: once with
plain ``sbatch`` (Slurm's own multifactor priority + backfill, the user's configs) and once
with ``psbatch`` + ``pipeswift controller run`` (the pipeswift policy resizing and ordering
pending jobs), in emulation: no training runs, every job sleeps its predicted run time.

One time model for both runs. The cost model predicts each job's run time on A100-80GB GPUs;
the bench compresses time by ``scale`` (default: chosen so the workload's GPU-seconds fill
the cluster for about ``--target-makespan-s``) through a generated hardware file whose GPU
type ``A100-80GB-emu`` is the A100-80GB with every rate (TFLOP/s, HBM, NVLink, network)
multiplied by 1/scale and every fixed cost (startup, load, latency) by scale. The cost
model is linear in those, so every predicted time is exactly ``scale`` x the A100 time.
  * plain run: each job's script is ``sleep <predicted time of the USER's config>``,
    computed here with the core API (``megatron.profile_from_argv`` + ``Estimator``);
  * pipeswift run: each job's script is the user's Megatron ``torchrun`` command; psbatch
    routes it through ``pipeswift-launch`` which, with ``PIPESWIFT_EMULATE=1``, sleeps the
    predicted time of the config it would run on the allocation it got (the controller's
    decision, else its own best config for that allocation).
Why compress the hardware rather than only ``PIPESWIFT_EMULATE_SCALE``: the controller
predicts when running jobs end (start + predicted run time) on the wall clock. With the
launcher alone scaled, the controller would think every running job ends 1/scale later
than it does, and choose accordingly (``--scale-via launcher`` runs that variant: the
controller then sees unscaled A100 times while jobs sleep scale x them).

JCT = EndTime - SubmitTime from ``scontrol -o show job`` (the testbed keeps finished jobs
for MinJobAge=600 s). Submission times follow one seeded schedule (exponential gaps) in
both runs. Prints one JSON object: both mean JCTs, their ratio (pipeswift / slurm), waits,
run times, makespans, per-job rows, the scale and the seed.

One run of plain Slurm is a noisy figure: whether backfill (every 2 s on the test cluster)
slots the small jobs ahead of the whole-cluster job's reservation depends on sub-second
timing, and the same seed's plain mean JCT has come out anywhere from 72 s to 119 s.
``--rounds K`` runs both sides K times, alternating, and adds each round's means and ratio
(``round_summaries``) and their medians (``median_mean_jct_s_slurm``,
``median_mean_jct_s_pipeswift``, ``median_jct_ratio_pipeswift_over_slurm``); the other keys
are the first round's.

Run (about 2 x 4 minutes per round):
    export SLURM_TESTBED_DIR=/tmp/pswift-e2e10 CTLD_PORT=6957 SLURMD_PORT_BASE=17501
    bash tests/slurm/testbed.sh up && source $SLURM_TESTBED_DIR/env.sh
    python bench/emulated_workload.py --seed 7 [--rounds 3] > /tmp/emulated.json
The cluster must be idle (no jobs in the queue): the bench refuses to start otherwise.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Optional

from pipeswift_slurm.slurm.backends.slurm_parse import parse_kv_line
from pipeswift_slurm.core.costmodel import CostModel
from pipeswift_slurm.core.estimator import Estimator
from pipeswift_slurm.core.hardware import builtin_gpu_types
from pipeswift_slurm.core.megatron import profile_from_argv

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "slurm"))
from testbed_env import cluster_env  # noqa: E402  (tests/slurm/testbed_env.py)

BIN = Path(sys.executable).parent
BASE_GPU = "A100-80GB"
EMU_GPU = "A100-80GB-emu"
GPUS_PER_NODE = 8
ACTIVE = ("PENDING", "CONFIGURING", "RUNNING", "COMPLETING", "SUSPENDED", "REQUEUED")

# (class, model shape flags, global batch, micro batch, [(user GPUs, tp, pp)], unscaled hours range)
_GPT = "--num-layers {L} --hidden-size {h} --num-attention-heads {a} --seq-length 2048 " \
       "--max-position-embeddings 2048 --vocab-size 50257 --bf16 --use-distributed-optimizer"
MODELS = {
    "small": [(dict(L=24, h=1024, a=16), 64, 2, [(1, 1, 1), (2, 1, 2), (2, 1, 1)]),
              (dict(L=24, h=2048, a=16), 128, 1, [(1, 1, 1), (2, 1, 2), (2, 2, 1)])],
    "medium": [(dict(L=32, h=2560, a=32), 256, 1, [(4, 1, 4), (8, 1, 4), (8, 2, 4)]),
               (dict(L=32, h=4096, a=32), 512, 1, [(4, 2, 2), (8, 2, 4), (8, 1, 8)])],
    "large": [(dict(L=40, h=5120, a=40), 1024, 1, [(16, 4, 4), (32, 4, 8), (16, 8, 2)])],
}
HOURS = {"small": (0.4, 1.5), "medium": (1.0, 3.0), "large": (2.5, 5.0)}
MIX = {"small": 20, "medium": 8, "large": 2}
RATIO_KEY = "jct_ratio_pipeswift_over_slurm"


@dataclass
class JobSpec:
    name: str
    size_class: str
    user_gpus: int
    gpu_range: tuple[int, int]
    nodes: int
    gpus_per_node: int
    megatron_args: list[str]
    user_config: str
    user_run_s: float  # predicted run time of the user's config, compressed (= what plain Slurm sleeps)
    time_limit_min: int
    submit_offset_s: float


# ------------------------------------------------------------------ workload


def emu_hardware(path: Path, scale: float) -> None:
    """Write a hardware file with EMU_GPU = BASE_GPU with time compressed by ``scale``."""
    g = builtin_gpu_types()[BASE_GPU]
    rates = ("peak_tflops", "fp32_tflops", "hbm_gbps", "nvlink_gbps", "inter_node_gbps")
    fixed = ("startup_s", "load_s_per_bparam", "latency_s")
    values = {k: getattr(g, k) / scale for k in rates}
    values.update({k: getattr(g, k) * scale for k in fixed})
    values.update(mem_gib=g.mem_gib, reserved_gib=g.reserved_gib, eff_max=g.eff_max,
                  work_half_gflop=g.work_half_gflop)
    lines = ['[gpu."%s"]' % EMU_GPU] + ["%s = %r" % (k, float(v)) for k, v in values.items()]
    path.write_text("\n".join(lines) + "\n")


def build_workload(seed: int, target_makespan_s: float, total_gpus: int) -> tuple[list[JobSpec], float]:
    """The seeded 30-job mix and the time compression ``scale`` (real s per A100 s)."""
    rng = random.Random(seed)
    est = Estimator(CostModel(builtin_gpu_types()[BASE_GPU]), GPUS_PER_NODE)
    drafts = []
    classes = [c for c, n in MIX.items() for _ in range(n)]
    rng.shuffle(classes)
    for i, cls in enumerate(classes):
        shape, gbs, mbs, layouts = rng.choice(MODELS[cls])
        gpus, tp, pp = rng.choice(layouts)
        base = _GPT.format(**shape).split() + [
            "--micro-batch-size", str(mbs), "--global-batch-size", str(gbs),
            "--tensor-model-parallel-size", str(tp), "--pipeline-model-parallel-size", str(pp)]
        probe = profile_from_argv(base + ["--train-iters", "1"], world_size=gpus, gpus_per_node=GPUS_PER_NODE)
        user = probe.requested
        assert est.cost.fits(probe, user), (cls, shape, user.short())
        iter_s = est.run_time_s(probe, user, 1) - est.run_time_s(probe, user, 0)
        target_s = rng.uniform(*HOURS[cls]) * 3600.0
        iters = max(10, round((target_s - est.startup_s(probe)) / iter_s))
        argv = base + ["--train-iters", str(iters)]
        profile = profile_from_argv(argv, world_size=gpus, gpus_per_node=GPUS_PER_NODE)
        lo, hi = max(1, gpus // 2), min(total_gpus, gpus * 2)
        user_s = est.run_time_s(profile, profile.requested)
        drafts.append((cls, gpus, (lo, hi), argv, profile.requested, user_s))
    gpu_s = sum(d[1] * d[5] for d in drafts)
    scale = target_makespan_s * total_gpus / gpu_s
    # arrivals: exponential gaps spread over the first ~40 % of the target makespan
    gaps = [rng.expovariate(1.0) for _ in drafts]
    span = 0.4 * target_makespan_s
    offsets, t = [], 0.0
    for g in gaps:
        offsets.append(t)
        t += g
    offsets = [o * span / t for o in offsets]
    jobs = []
    for i, ((cls, gpus, rng_, argv, user, run_s), off) in enumerate(zip(drafts, offsets)):
        real_s = run_s * scale
        nodes = max(1, gpus // GPUS_PER_NODE)
        jobs.append(JobSpec(name="emu%02d-%s" % (i, cls), size_class=cls, user_gpus=gpus, gpu_range=rng_,
                            nodes=nodes, gpus_per_node=gpus // nodes, megatron_args=argv,
                            user_config=user.short(), user_run_s=round(real_s, 3),
                            time_limit_min=max(2, math.ceil(3 * real_s / 60.0)),
                            submit_offset_s=round(off, 3)))
    return jobs, scale


# ------------------------------------------------------------------ Slurm


def run(argv: list[str], env: dict[str, str], timeout_s: float = 60.0) -> str:
    proc = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=timeout_s, check=False)
    if proc.returncode:
        raise RuntimeError("%s exited %d: %s" % (" ".join(argv[:3]), proc.returncode, proc.stderr.strip()))
    return proc.stdout


def queue_ids(env: dict[str, str]) -> list[str]:
    return run(["squeue", "-h", "-o", "%i"], env).split()


def show_jobs(env: dict[str, str]) -> dict[int, dict[str, str]]:
    out = {}
    for line in run(["scontrol", "-o", "show", "job"], env).splitlines():
        if line.startswith("JobId="):
            fields = parse_kv_line(line)
            out[int(fields["JobId"])] = fields
    return out


def epoch(value: str) -> Optional[float]:
    try:
        return time.mktime(time.strptime(value, "%Y-%m-%dT%H:%M:%S"))
    except (ValueError, TypeError):
        return None


def gpus_of(fields: dict[str, str]) -> int:
    nodes = int(fields.get("NumNodes", "1").split("-")[0] or 1)
    m = re.search(r"gpu(?::[^:,]+)?:(\d+)", fields.get("TresPerNode", ""))
    if m:
        return nodes * int(m.group(1))
    m = re.search(r"gpu(?::[^:,]+)?:(\d+)", fields.get("TresPerJob", ""))
    return int(m.group(1)) if m else 0


def write_script(path: Path, job: JobSpec, body: str, own: str, log_dir: Path) -> None:
    path.write_text("#!/bin/bash\n"
                    "#SBATCH -J %s\n#SBATCH -N %d\n#SBATCH --gpus-per-node=%d\n#SBATCH -t %d\n"
                    "#SBATCH -o %s/%%x-%%j.out\n%s%s\n"
                    % (job.name, job.nodes, job.gpus_per_node, job.time_limit_min, log_dir, own, body))


def run_phase(mode: str, jobs: list[JobSpec], env: dict[str, str], phase: Path,
              controller_cfg: Optional[Path], interval_s: float, timeout_s: float) -> dict:
    """Submit the workload on its schedule, wait for every job to end, read Slurm's times
    (scripts, logs and the controller's output go to the new folder ``phase``)."""
    (phase / "logs").mkdir(parents=True)
    scripts = []
    for job in jobs:
        path = phase / (job.name + ".sbatch")
        if mode == "slurm":
            write_script(path, job, "sleep %.3f" % job.user_run_s, "", phase / "logs")
        else:
            torchrun = ["torchrun", "--nnodes=%d" % job.nodes, "--nproc_per_node=%d" % job.gpus_per_node,
                        "pretrain_gpt.py", *job.megatron_args]
            own = "#PSWIFT gpus=%d-%d\n" % job.gpu_range
            write_script(path, job, " ".join(torchrun), own, phase / "logs")
        scripts.append(path)
    controller, controller_log = None, None
    if controller_cfg is not None:
        controller_log = open(phase / "controller.out", "w")
        controller = subprocess.Popen([str(BIN / "pipeswift"), "controller", "run", "--interval",
                                       str(interval_s), "--config", str(controller_cfg)],
                                      env=env, stdout=controller_log, stderr=subprocess.STDOUT)
    ids: dict[int, JobSpec] = {}
    start = time.time()
    try:
        for job, path in zip(jobs, scripts):
            delay = start + job.submit_offset_s - time.time()
            if delay > 0:
                time.sleep(delay)
            if mode == "slurm":
                argv = ["sbatch", "--parsable", str(path)]
            else:
                argv = [str(BIN / "psbatch"), "--parsable", "--export=ALL,PIPESWIFT_EMULATE=1", str(path)]
            ids[int(run(argv, env).strip().split(";")[0])] = job
        deadline = time.time() + timeout_s
        while set(queue_ids(env)) & {str(i) for i in ids}:
            if time.time() > deadline:
                raise RuntimeError("%s run: jobs still queued after %.0f s" % (mode, timeout_s))
            time.sleep(2.0)
    finally:
        if controller is not None:
            controller.send_signal(signal.SIGTERM)
            try:
                controller.wait(timeout=30)
            except subprocess.TimeoutExpired:
                controller.kill()
                controller.wait()
        if controller_log is not None:
            controller_log.close()
        leftover = [str(i) for i in ids if str(i) in queue_ids(env)]
        if leftover:
            subprocess.run(["scancel", *leftover], env=env, capture_output=True, timeout=30, check=False)
    fields = show_jobs(env)
    rows = []
    for job_id, job in ids.items():
        f = fields.get(job_id, {})
        submit, begin = epoch(f.get("SubmitTime", "")), epoch(f.get("StartTime", ""))
        end = epoch(f.get("EndTime", ""))
        decision = re.search(r"pswift-decision1;\S*", f.get("AdminComment", ""))
        rows.append({"job_id": job_id, "name": job.name, "class": job.size_class, "user_gpus": job.user_gpus,
                     "gpu_range": list(job.gpu_range), "ran_on_gpus": gpus_of(f), "state": f.get("JobState"),
                     "submit_offset_s": job.submit_offset_s, "user_predicted_run_s": job.user_run_s,
                     "wait_s": None if None in (submit, begin) else begin - submit,
                     "run_s": None if None in (begin, end) else end - begin,
                     "jct_s": None if None in (submit, end) else end - submit,
                     "decision": decision.group(0) if decision else None})
    done = [r for r in rows if r["jct_s"] is not None]
    ends = [epoch(fields[r["job_id"]]["EndTime"]) for r in done]
    by_class = {c: round(statistics.mean(r["jct_s"] for r in done if r["class"] == c), 1)
                for c in MIX if any(r["class"] == c for r in done)}
    return {"mode": mode, "start_epoch_s": start, "jobs": len(rows),
            "completed": sum(r["state"] == "COMPLETED" for r in rows),
            "mean_jct_s": round(statistics.mean(r["jct_s"] for r in done), 2) if done else None,
            "p50_jct_s": statistics.median(r["jct_s"] for r in done) if done else None,
            "mean_wait_s": round(statistics.mean(r["wait_s"] for r in done), 2) if done else None,
            "mean_run_s": round(statistics.mean(r["run_s"] for r in done), 2) if done else None,
            "mean_jct_s_by_class": by_class,
            "max_wait_s": max((r["wait_s"] for r in done), default=None),
            "makespan_s": (max(ends) - start) if ends else None,
            "resized_jobs": sum(r["ran_on_gpus"] != r["user_gpus"] for r in rows),
            "rows": sorted(rows, key=lambda r: r["job_id"])}


def slurm_env() -> dict[str, str]:
    env = cluster_env()
    if not env.get("SLURM_CONF"):
        sys.exit("no Slurm test cluster: run tests/slurm/testbed.sh up and set SLURM_TESTBED_DIR")
    env["PATH"] = os.pathsep.join([str(BIN), env.get("PATH", os.defpath)])
    return env


def main(argv: Optional[list[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("--target-makespan-s", type=float, default=200.0,
                   help="picks the scale: workload GPU-seconds / cluster GPUs at this many real seconds")
    p.add_argument("--interval-s", type=float, default=2.0, help="controller tick interval")
    p.add_argument("--timeout-s", type=float, default=900.0, help="per run")
    p.add_argument("--scale-via", choices=("hardware", "launcher"), default="hardware",
                   help="compress time in the GPU type (controller and launcher agree) or only in the"
                        " launcher (PIPESWIFT_EMULATE_SCALE; the controller sees A100 times)")
    p.add_argument("--only", choices=("slurm", "pipeswift"), help="run one side only")
    p.add_argument("--workdir", help="keep scripts, logs and the controller DB here")
    p.add_argument("--rounds", type=int, default=1,
                   help="run both sides this many times, alternating (plain Slurm's backfill makes one"
                        " run's mean JCT vary by tens of seconds); the ratio's median is reported")
    args = p.parse_args(argv)
    if args.rounds < 1:
        p.error("--rounds must be at least 1")

    env = slurm_env()
    if queue_ids(env):
        sys.exit("the test cluster is not idle (squeue lists jobs); the bench needs it to itself")
    node_text = run(["scontrol", "-o", "show", "node"], env)
    nodes = [parse_kv_line(line) for line in node_text.splitlines() if line]
    counts = [re.search(r"gpu(?::[^:,]+)?:(\d+)", n.get("Gres", "")) for n in nodes]
    total_gpus = sum(int(m.group(1)) for m in counts if m)
    jobs, scale = build_workload(args.seed, args.target_makespan_s, total_gpus)
    work = Path(args.workdir or tempfile.mkdtemp(prefix="pswift-emu-"))
    work.mkdir(parents=True, exist_ok=True)
    hardware = work / "hardware.toml"
    emu_hardware(hardware, scale)
    if args.scale_via == "hardware":
        gpu_type, launch_scale = EMU_GPU, 1.0
    else:
        gpu_type, launch_scale = BASE_GPU, scale
    env_ps = dict(env, PIPESWIFT_GPU_TYPE=gpu_type, PIPESWIFT_HARDWARE=str(hardware),
                  PIPESWIFT_EMULATE_SCALE=repr(launch_scale))
    result: dict = {"seed": args.seed, "scale": scale, "scale_via": args.scale_via, "gpu_type": BASE_GPU,
                    "cluster_gpus": total_gpus, "target_makespan_s": args.target_makespan_s,
                    "controller_interval_s": args.interval_s, "workdir": str(work), "rounds": args.rounds,
                    "workload": [asdict(j) for j in jobs]}
    modes = [m for m in ("slurm", "pipeswift") if not args.only or args.only == m]
    per_round: list[dict] = []
    for k in range(args.rounds):
        folder = work if args.rounds == 1 else work / ("round%d" % (k + 1))
        folder.mkdir(parents=True, exist_ok=True)
        cfg = folder / "controller.toml"  # a database per round: no history carried over
        cfg.write_text('[store]\nurl = "%s"\n\n[slurm]\nbackend = "cli"\ngpu_type = "%s"\n'
                       'hardware_file = "%s"\n\n[policy]\nname = "pipeswift"\n\n'
                       '[controller]\nlock_file = "%s"\n'
                       % (folder / "pipeswift.sqlite", gpu_type, hardware, folder / "tick.lock"))
        phases: dict = {}
        for mode in modes:
            while queue_ids(env):
                time.sleep(2.0)
            print("[bench] round %d/%d, %s run: %d jobs, scale %.5f"
                  % (k + 1, args.rounds, mode, len(jobs), scale), file=sys.stderr, flush=True)
            phases[mode] = run_phase(mode, jobs, env if mode == "slurm" else env_ps, folder / mode,
                                     cfg if mode == "pipeswift" else None, args.interval_s, args.timeout_s)
            print("[bench] %s: mean JCT %.1f s, makespan %.0f s" % (mode, phases[mode]["mean_jct_s"] or -1,
                                                                   phases[mode]["makespan_s"] or -1),
                  file=sys.stderr, flush=True)
        if "slurm" in phases and "pipeswift" in phases and phases["slurm"]["mean_jct_s"]:
            phases[RATIO_KEY] = round(phases["pipeswift"]["mean_jct_s"] / phases["slurm"]["mean_jct_s"], 4)
        per_round.append(phases)
    result.update(per_round[0])  # the first round's keys, as a single run has them
    if args.rounds > 1:
        result["round_summaries"] = [
            {**{mode + "_mean_jct_s": r[mode]["mean_jct_s"] for mode in modes},
             **({RATIO_KEY: r[RATIO_KEY]} if RATIO_KEY in r else {})} for r in per_round]
        for mode in modes:
            means = [r[mode]["mean_jct_s"] for r in per_round if r[mode]["mean_jct_s"] is not None]
            result["median_mean_jct_s_" + mode] = statistics.median(means) if means else None
        ratios = [r[RATIO_KEY] for r in per_round if RATIO_KEY in r]
        if ratios:
            result["median_" + RATIO_KEY] = statistics.median(ratios)
    json.dump(result, sys.stdout, indent=1)
    print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
