"""How closely the simulated Slurm reproduces a real one: the 30-job emulated workload of
bench/emulated_workload.py run with plain ``sbatch`` on a real Slurm test cluster of its
own (4 nodes x 8 GPUs, ``PriorityWeightJobSize=1000``, ``bf_interval=5``: the settings of
issue 26), then replayed in the simulator under the ``slurm`` policy with the settings
read from that cluster's ``scontrol show config`` (``--slurm-config``'s parser). Goal
(issue 26): the simulated mean JCT within 10 % of the real one.

Two replays, side by side with the real run:
  * ``history``: each job as the history has it (its real start-to-end time), as
    ``simulate --sacct`` replays a site's history: the figure an admin sees
    (``slurm replay vs as it ran``);
  * ``sleep``: each job's planned sleep plus the modelled launcher start
    (``SchedulingSettings.launch_s``): the simulator without any measured run time.
and, for reference, the same history replay under the idealised Slurm of earlier
releases (no latencies, EASY backfill without rounding: ``sched_settings.IDEAL`` with age
and size weights 0).

It brings its own cluster up (tests/slurm/testbed.sh, ports CTLD_PORT / SLURMD_PORT_BASE,
default 7871 / 27401, folder /tmp/pswift-fidelity) and down again; without Slurm's
daemons it prints one line and exits 0. ``--real-json FILE`` skips the real run and
replays a run kept before: the ``phases.json`` this bench writes into its ``--workdir``
(every round), or a bench/emulated_workload.py output (``--only slurm``; its first round);
``--slurm-config`` (e.g. the ``scontrol-show-config.txt`` beside ``phases.json``) gives the
settings. Prints one JSON object; never fails on the gap.

    python bench/slurm_fidelity.py [--rounds 2] [--seed 7]     (about 4 minutes a round)
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
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any, Optional

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
import emulated_workload as emu  # noqa: E402  (bench/emulated_workload.py)

from pipeswift_slurm.core.costmodel import CostModel  # noqa: E402
from pipeswift_slurm.core.estimator import Estimator  # noqa: E402
from pipeswift_slurm.core.hardware import builtin_gpu_types  # noqa: E402
from pipeswift_slurm.policy import get_policy  # noqa: E402
from pipeswift_slurm.sim.engine import SimSettings, Simulation  # noqa: E402
from pipeswift_slurm.sim.replay import replay_fidelity  # noqa: E402
from pipeswift_slurm.sim.workload import WorkloadJob  # noqa: E402
from pipeswift_slurm.slurm.backends.sched_settings import IDEAL, SchedulingSettings, parse_show_config, \
    read_scheduling_settings  # noqa: E402

SITE_CONF = "PriorityWeightJobSize=1000\nSchedulerParameters=bf_interval=5,sched_interval=2"
NODES, GPN = 4, 8
GOAL = 0.10


def _testbed(action: str, env: dict[str, str]) -> None:
    subprocess.run(["bash", str(ROOT / "tests" / "slurm" / "testbed.sh"), action], env=env, check=True,
                   stdout=sys.stderr, stderr=sys.stderr, timeout=180)


def real_runs(rounds: int, seed: int, work: Path) -> tuple[list[dict[str, Any]], str, list[Any]]:
    """Bring up the cluster, run the plain workload ``rounds`` times, take it down: the
    phases, ``scontrol show config`` and the workload."""
    folder = os.environ.get("SLURM_TESTBED_DIR", "/tmp/pswift-fidelity")
    env = dict(os.environ, SLURM_TESTBED_DIR=folder, CTLD_PORT=os.environ.get("CTLD_PORT", "7871"),
               SLURMD_PORT_BASE=os.environ.get("SLURMD_PORT_BASE", "27401"), NODES=str(NODES), GPUS=str(GPN),
               SLURM_CONF_EXTRA=SITE_CONF, FRESH="1")
    _testbed("up", env)
    try:
        env.update(SLURM_CONF=folder + "/etc/slurm.conf",
                   PATH=os.pathsep.join([str(emu.BIN), env.get("PATH", os.defpath)]))
        config = emu.run(["scontrol", "show", "config"], env)
        jobs, _ = emu.build_workload(seed, 200.0, NODES * GPN)
        phases = []
        for k in range(rounds):
            print("[fidelity] real round %d/%d" % (k + 1, rounds), file=sys.stderr, flush=True)
            phases.append(emu.run_phase("slurm", jobs, env, work / ("round%d" % (k + 1)), None, 2.0, 900.0))
        return phases, config, jobs
    finally:
        _testbed("down", env)


def workload(phase: dict[str, Any], specs: list[Any], from_history: bool, launch_s: float) -> list[WorkloadJob]:
    """The real run's jobs as simulator jobs replayed as they ran (no profile)."""
    by_name = {s.name: s for s in specs}
    # on the run's own clock (epoch seconds): Slurm rounds reservations to bf_resolution
    # on the wall clock, so where the run starts within a minute matters
    epoch_s = float(phase.get("start_epoch_s", 0.0))
    jobs = []
    for i, row in enumerate(sorted(phase["rows"], key=lambda r: (r["submit_offset_s"], r["job_id"]))):
        spec = by_name[row["name"]]
        run_s = row["run_s"] if from_history and row["run_s"] is not None else spec.user_run_s + launch_s
        jobs.append(WorkloadJob(job_id=i + 1, name=row["name"], user="u", submit_s=epoch_s + spec.submit_offset_s,
                                argv=(),
                                profile=None, recorded_duration_s=run_s, time_limit_s=spec.time_limit_min * 60,
                                model="(as it ran)", category="", as_ran_nodes=spec.nodes,
                                as_ran_gpus_per_node=spec.gpus_per_node, as_ran_jct_s=row["jct_s"]))
    return jobs


def simulate(jobs: list[WorkloadJob], settings: SchedulingSettings) -> dict[str, Any]:
    gpu = builtin_gpu_types()[emu.BASE_GPU]
    result = Simulation(jobs, get_policy("slurm"), Estimator(CostModel(gpu), GPN), CostModel(gpu),
                        SimSettings(NODES, GPN, tick_interval_s=2.0, slurm=settings)).run()
    recs = result.records
    return {"mean_jct_s": round(statistics.fmean(r.jct_s for r in recs), 2),
            "mean_wait_s": round(statistics.fmean((r.first_start_s or 0.0) - r.submit_s for r in recs), 2),
            "makespan_s": round(result.makespan_s - min(j.submit_s for j in jobs), 1),
            "vs_real": replay_fidelity(jobs, result)}


def main(argv: Optional[list[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("--real-json", help="replay this bench/emulated_workload.py --only slurm output instead")
    p.add_argument("--slurm-config", help="with --real-json: its cluster's scontrol show config or slurm.conf")
    p.add_argument("--workdir")
    args = p.parse_args(argv)
    work = Path(args.workdir or tempfile.mkdtemp(prefix="pswift-fidelity-"))
    if args.real_json:
        data = json.loads(Path(args.real_json).read_text())
        specs = [emu.JobSpec(**{**j, "gpu_range": tuple(j["gpu_range"])}) for j in data["workload"]]
        # this bench's own phases.json (every round), or an emulated_workload output (with
        # --rounds, that holds the first round's rows only)
        phases = data["phases"] if "phases" in data else [data["slurm"]]
        settings = read_scheduling_settings(args.slurm_config) if args.slurm_config else SchedulingSettings()
        seed, config_source = data.get("seed"), args.slurm_config or "Slurm defaults"
    else:
        if not shutil.which("slurmctld"):
            print("slurm_fidelity: skipped: no slurmctld here (install Slurm; tests/slurm/testbed.sh INSTALL=1)")
            return 0
        try:
            phases, config, specs = real_runs(args.rounds, args.seed, work)
        except (subprocess.CalledProcessError, subprocess.TimeoutExpired, RuntimeError) as exc:
            sys.exit("slurm_fidelity: the test cluster run failed (%s); see the testbed log under"
                     " $SLURM_TESTBED_DIR/log" % exc)
        (work / "scontrol-show-config.txt").write_text(config)
        (work / "phases.json").write_text(json.dumps({"seed": args.seed, "workload": [asdict(j) for j in specs],
                                                      "phases": phases}))
        settings, seed, config_source = parse_show_config(config), args.seed, "scontrol show config"
    ideal = replace(IDEAL, weight_age=0, weight_job_size=0)
    rounds = []
    for phase in phases:
        rounds.append({"real": {k: phase[k] for k in ("mean_jct_s", "mean_wait_s", "makespan_s")},
                       "sim_history": simulate(workload(phase, specs, True, settings.launch_s), settings),
                       "sim_sleep": simulate(workload(phase, specs, False, settings.launch_s), settings),
                       "sim_history_idealised": simulate(workload(phase, specs, True, 0.0), ideal)})
    real = statistics.fmean(r["real"]["mean_jct_s"] for r in rounds)
    sim = statistics.fmean(r["sim_history"]["mean_jct_s"] for r in rounds)
    out = {"seed": seed, "cluster": "%d x %d GPUs" % (NODES, GPN), "settings_from": config_source,
           "settings": settings.as_dict(), "rounds": rounds, "real_mean_jct_s": round(real, 2),
           "sim_mean_jct_s": round(sim, 2), "gap": round(sim / real - 1.0, 4),
           "within_goal": abs(sim / real - 1.0) <= GOAL, "workdir": str(work)}
    json.dump(out, sys.stdout, indent=1)
    print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
