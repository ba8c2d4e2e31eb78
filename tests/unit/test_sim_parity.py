"""Sim parity (STYLE): the controller tick decides the same on the simulator's backend as
on the Slurm-command backend reading the same cluster state.

States are taken from a running simulation (so they hold running jobs, fragments, pending
jobs with decision tokens and SiteFactors); each is rendered as the recorded Slurm 22.05
dialect (``squeue --json`` openapi v0.0.38, ``scontrol -d -o show node``, ``sprio -h -o
'%i|%Y|%S'``, see tests/data/slurm/) and fed to ``SlurmCliBackend`` through a fake runner.
Slurm reports whole seconds, so the copied state's times are truncated to whole seconds
first (on both sides).
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest

from pipeswift_slurm.core import hardware
from pipeswift_slurm.slurm.backends import slurm_cli
from pipeswift_slurm.slurm.backends.site_limits import ASSOC_ARGV, PARTITIONS_ARGV, QOS_ARGV
from pipeswift_slurm.slurm.backends.sim import SimBackend
from pipeswift_slurm.slurm.backends.slurm_cli import SlurmCliBackend
from pipeswift_slurm.slurm.controller import Controller, ControllerSettings
from pipeswift_slurm.core.costmodel import CostModel
from pipeswift_slurm.core.estimator import Estimator
from pipeswift_slurm.policy import get_policy
from pipeswift_slurm.sim.engine import SimSettings, Simulation
from pipeswift_slurm.sim.workload import Conversion, build_workload, synthetic_trace

DATA = Path(__file__).resolve().parents[1] / "data"
GPU = hardware.get_gpu_type("A100-80GB")
NODES, GPN = 2, 8
META = json.loads((DATA / "slurm" / "squeue-22.05.json").read_text())["meta"]


def _whole_seconds(backend: SimBackend, now: float) -> None:
    backend.now = float(int(now))
    for job in backend.jobs.values():
        job.submit_s = float(int(job.submit_s))
        if job.start_s is not None:
            job.start_s = float(int(job.start_s))
        job.version += 1  # drop the cached Job view


def _hostlist(names: list[str]) -> str:
    if len(names) == 2:  # exercise the bracket form too
        return "node[%s,%s]" % (names[0][4:], names[1][4:])
    return ",".join(names)


def render_squeue(backend: SimBackend) -> str:
    jobs = []
    for job in (*backend.running.values(), *backend.pending.values()):
        running = job.state == "RUNNING"
        assert job.time_limit_s % 60 == 0
        names = ["node%d" % (n + 1) for n in job.placement]
        jobs.append({
            "account": "", "job_id": job.job_id, "job_state": job.state, "name": job.name,
            "user_name": job.user, "partition": "gpu", "node_count": job.num_nodes, "tasks": job.num_nodes,
            "tres_per_node": "gres:gpu:%d" % job.gpus_per_node, "tres_per_job": "", "tres_per_task": "",
            "tres_per_socket": "",
            "gres_detail": ["gpu:%d(IDX:0-%d)" % (job.gpus_per_node, job.gpus_per_node - 1)] * len(names)
            if running else [],
            "tres_alloc_str": "cpu=%d,mem=%dG,node=%d,billing=%d" % ((8 * job.gpus,) * 2 + (job.num_nodes,)
                                                                     + (8 * job.gpus,)) if running else "",
            "array_job_id": 0, "array_task_id": None, "array_task_string": "",
            "comment": job.comment, "admin_comment": job.admin_comment,
            "time_limit": job.time_limit_s // 60, "submit_time": int(job.submit_s),
            "eligible_time": int(job.submit_s), "start_time": int(job.start_s) if running else 0,
            "end_time": int(job.start_s) + job.time_limit_s if running else 0,
            # a held job shows as Slurm shows it: JobHeldAdmin, priority 0 (the short-job lane holds)
            "priority": 0 if job.held else job.site_factor,
            "state_reason": "None" if running else "JobHeldAdmin" if job.held else "Priority",
            "nodes": _hostlist(names) if running else "", "restart_cnt": job.restarts,
        })
    return json.dumps({"meta": META, "errors": [], "jobs": jobs}, indent=2)


def render_nodes(backend: SimBackend) -> str:
    lines = []
    for i, free in enumerate(backend.free):
        used = backend.gpus_per_node - free
        idx = "IDX:0-%d" % (used - 1) if used > 1 else ("IDX:0" if used == 1 else "IDX:N/A")
        state = "IDLE" if used == 0 else ("ALLOCATED" if free == 0 else "MIXED")
        lines.append(
            "NodeName=node%d Arch=x86_64 CoresPerSocket=32  CPUAlloc=%d CPUEfctv=64 CPUTot=64 CPULoad=0.30 "
            "AvailableFeatures=(null) ActiveFeatures=(null) Gres=gpu:%s:%d GresDrain=N/A GresUsed=gpu:%s:%d(%s) "
            "NodeAddr=127.0.0.1 NodeHostName=vm Port=%d Version=22.05.8 OS=Linux 6.1.0 #1 SMP PREEMPT_DYNAMIC @0  "
            "RealMemory=512000 AllocMem=0 FreeMem=23428 Sockets=2 Boards=1 State=%s ThreadsPerCore=1 TmpDisk=0 "
            "Weight=1 Owner=N/A MCS_label=N/A Partitions=gpu  BootTime=2026-11-29T08:27:05 "
            "CfgTRES=cpu=64,mem=500G,billing=64,gres/gpu=%d AllocTRES=cpu=%d CapWatts=n/a CurrentWatts=0"
            % (i + 1, 8 * used, backend.gpu_type, backend.gpus_per_node, backend.gpu_type, used, idx, 17001 + i,
               state, backend.gpus_per_node, 8 * used))
    return "\n".join(lines) + "\n"


def render_sprio(backend: SimBackend) -> str:
    return "".join("%d|%d|%d\n" % (j.job_id, j.site_factor, j.site_factor) for j in backend.pending.values())


def fake_runner(backend: SimBackend) -> Any:
    outputs = {tuple(slurm_cli.SQUEUE_JSON_ARGV): render_squeue(backend),
               tuple(slurm_cli.NODES_ARGV): render_nodes(backend),
               tuple(slurm_cli.SPRIO_ARGV): render_sprio(backend),
               # the simulated site has no partition, QOS or association limits
               **{tuple(argv): "" for argv in (PARTITIONS_ARGV, QOS_ARGV, ASSOC_ARGV)}}
    calls: list[list[str]] = []

    def run(argv: list[str]) -> str:
        calls.append(list(argv))
        if tuple(argv) not in outputs:
            raise AssertionError("unexpected Slurm command in a dry run: %s" % argv)
        return outputs[tuple(argv)]

    run.calls = calls  # type: ignore[attr-defined]
    return run


def _states_of(policy: str, limit: int) -> list[SimBackend]:
    truth = CostModel(GPU)
    rows = synthetic_trace(40, NODES * GPN, 1.5, 21)
    jobs = build_workload(rows, Conversion(truth, NODES * GPN, GPN, flex=0.7, seed=21))
    estimator = Estimator(CostModel(GPU), GPN)
    taken: list[SimBackend] = []
    sim = Simulation(jobs, get_policy(policy), estimator, truth, SimSettings(NODES, GPN))

    def grab(now: float, report: Any) -> None:
        be = sim.backend
        fragment = any(0 < f < GPN for f in be.free)
        if len(taken) < limit and len(be.pending) >= 2 and be.running and (report.decisions or fragment) and (
                fragment or len(taken) < limit // 2):
            state = copy.deepcopy(be)
            state._finished = []
            _whole_seconds(state, now + 1)  # the next tick's clock
            taken.append(state)

    sim.on_tick = grab
    sim.run()
    return taken


@pytest.fixture(scope="module")
def states() -> list[SimBackend]:
    """Copies of the sim backend at ticks with pending jobs (whole seconds): from a slurm
    run (no lever moved yet: every policy has decisions to make) and from a pipeswift run
    (decision tokens, resized jobs, SiteFactors already set)."""
    taken = _states_of("slurm", 4) + _states_of("pipeswift", 4)
    assert len(taken) >= 6
    assert any(j.config is not None for s in taken for j in s.jobs.values())  # decision tokens present
    assert any(0 < f < GPN for s in taken for f in s.free)  # fragments present
    return taken


def _key(job: Any) -> tuple[Any, ...]:
    # sprio lists pending jobs only: a running job's SiteFactor reads as 0 through the
    # commands (the sim shows the last one); no policy reads it.
    return (job.job_id, job.state, job.submit_time, job.num_nodes, job.gpus, job.start_time, job.time_limit_s,
            job.site_factor if job.pending else None, job.config, job.node_list, job.comment, job.admin_comment, job.opted_in,
            job.wait_s(0.0), job.restarts)


def test_rendered_snapshot_reads_back_as_the_sim_view(states: list[SimBackend]) -> None:
    for state in states:
        cli = SlurmCliBackend(run=fake_runner(state), clock=lambda s=state: s.now)
        cli_view = cli.snapshot()
        sim_view = copy.deepcopy(state).snapshot()
        assert cli_view.now == sim_view.now
        assert [(n.name, n.gpus, n.gpus_free, n.usable) for n in cli_view.nodes] == \
               [(n.name, n.gpus, n.gpus_free, n.usable) for n in sim_view.nodes]
        assert sorted(_key(j) for j in cli_view.jobs) == sorted(_key(j) for j in sim_view.jobs)


@pytest.mark.parametrize("policy", ["sjf", "tiresias", "pipeswift"])
def test_tick_decides_the_same_on_both_backends(states: list[SimBackend], policy: str) -> None:
    estimator = Estimator(CostModel(GPU), GPN)
    dry = ControllerSettings(dry_run=True, allow_requeue=True)
    compared = decided = 0
    for state in states:
        if any(j.restarts or j.attained_gpu_s for j in (*state.running.values(), *state.pending.values())):
            continue  # squeue shows no attained service: requeued jobs differ by design
        run = fake_runner(state)
        cli = SlurmCliBackend(run=run, clock=lambda s=state: s.now)
        cli_report = Controller(cli, get_policy(policy), estimator, None, dry).tick()
        sim_report = Controller(copy.deepcopy(state), get_policy(policy), estimator, None, dry).tick()
        assert cli_report.decisions == sim_report.decisions
        assert cli_report.skipped == sim_report.skipped
        assert cli_report.applied == sim_report.applied == []
        assert all(argv[0] in ("squeue", "scontrol", "sprio", "sacctmgr") and "update" not in argv for argv in run.calls)
        compared += 1
        decided += bool(sim_report.decisions)
    assert compared >= 3 and decided >= 1
