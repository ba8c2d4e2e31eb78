"""The simulator (sim/engine.py, sim/workload.py, sim/metrics.py): exact hand-built
schedules (the seed's A/B/C example), invariants over random small clusters and
workloads (hypothesis), that it drives the real controller tick, and how trace rows
become Megatron jobs."""

from __future__ import annotations

import ast
import math
import statistics
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, Phase, given, seed, settings
from hypothesis import strategies as st

from pipeswift_slurm.slurm.backends.sched_settings import IDEAL, SchedulingSettings
from pipeswift_slurm.slurm import controller as controller_mod
from pipeswift_slurm.core import hardware
from pipeswift_slurm.core import megatron, megatron_rules
from pipeswift_slurm.core.costmodel import CostModel
from pipeswift_slurm.core.estimator import Estimator
from pipeswift_slurm.core.model import Decision
from pipeswift_slurm.policy import PRESETS, get_policy
from pipeswift_slurm.sim.engine import JobRecord, SimSettings, Simulation
from pipeswift_slurm.sim.metrics import lower_bound_s, percentile, summarize
from pipeswift_slurm.sim.workload import (
    ZOO,
    Conversion,
    TraceRow,
    WorkloadError,
    WorkloadJob,
    build_workload,
    offered_load,
    read_trace,
    rescale_load,
    select_window,
    synthetic_trace,
    to_megatron_job,
)

REPO = Path(__file__).resolve().parents[2]
HOUR = 3600.0
POLICIES = ("fifo", "slurm", "sjf", "tiresias", "pipeswift", "pipeswift:preempt")
NON_PREEMPTIVE = ("fifo", "slurm", "sjf", "pipeswift")


def make_policy(name: str) -> Any:
    """A registered policy, or a preset of one (``pipeswift:preempt``)."""
    return get_policy(name.split(":")[0], **PRESETS.get(name, {}))

# An A100-80GB whose job time is iterations x iteration time exactly (no startup, no
# checkpoint load), so hand-built jobs run for the hours we ask for.
GPU = replace(hardware.get_gpu_type("A100-80GB"), name="TEST-A100", startup_s=0.0, load_s_per_bparam=0.0)
TRUTH = CostModel(GPU)


class Spy:
    """A policy wrapper that records every ``decide`` call (view, decisions) and delegates."""

    def __init__(self, policy: Any):
        self.inner = policy
        self.calls: list[tuple[Any, list[Any]]] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def decide(self, view: Any, profiles: Any, estimator: Any) -> list[Any]:
        out = self.inner.decide(view, profiles, estimator)
        self.calls.append((view, list(out)))
        return out


def hand_job(job_id: int, name: str, world: int, hours: float, gpu_range: tuple[int, int] | None = None,
             submit_s: float = 0.0, gpus_per_node: int = 8, save_interval: int | None = None,
             global_batch: int = 512) -> WorkloadJob:
    """gpt-1.3b with the user's config tp1 pp1 dp=world, ``hours`` long on it (truth).

    The iteration count comes from the cost model's iteration time; the truth factor
    removes the rounding to whole iterations, so the user's config runs exactly ``hours``
    (a short job on few GPUs needs a smaller ``global_batch`` to keep that rounding small).
    """
    model = ZOO["gpt-1.3b"]

    def argv(iters: int) -> list[str]:
        args = model.argv(world, global_batch, iters)
        args[args.index("--pipeline-model-parallel-size") + 1] = "1"
        if save_interval:
            args += ["--save", "/ckpt", "--load", "/ckpt", "--save-interval", str(save_interval)]
        return args

    probe = megatron.profile_from_argv(argv(1), world_size=world, gpus_per_node=gpus_per_node, gpu_range=gpu_range)
    iters = max(1, round(hours * HOUR / TRUTH.iter_time_s(probe, probe.requested)))
    profile = megatron.profile_from_argv(argv(iters), world_size=world, gpus_per_node=gpus_per_node,
                                         gpu_range=gpu_range)
    factor = hours * HOUR / TRUTH.job_time_s(profile, profile.requested)
    assert abs(factor - 1) < 0.01  # the rounding is small: the estimator stays honest
    limit = int(math.ceil(1.5 * hours * HOUR / 1800) * 1800)
    return WorkloadJob(job_id, name, "u%d" % job_id, submit_s, tuple(argv(iters)), profile, hours * HOUR, limit,
                       "gpt-1.3b", truth_factor=factor)


def simulate(jobs: list[WorkloadJob], policy: Any, nodes: int = 1, gpn: int = 8, **kw: Any) -> Any:
    estimator = Estimator(CostModel(GPU), gpn)
    # the idealised Slurm (no latencies, no rounding): the schedules below are worked out by hand
    return Simulation(jobs, policy, estimator, TRUTH, SimSettings(nodes, gpn, slurm=IDEAL), **kw).run()


def by_name(result: Any) -> dict[str, JobRecord]:
    return {r.name: r for r in result.records}


def mean_jct_h(result: Any) -> float:
    return statistics.fmean(r.jct_s for r in result.records) / HOUR


# ------------------------------------------------------------------ the seed's example

@pytest.fixture(scope="module")
def seed_jobs() -> list[WorkloadJob]:
    """8 GPUs; A 8 GPUs x 4 h (may run on 4..8), B and C 2 GPUs x 1 h; all at t=0, in order A, B, C."""
    return [hand_job(1, "A", 8, 4.0, gpu_range=(4, 8)), hand_job(2, "B", 2, 1.0), hand_job(3, "C", 2, 1.0)]


@pytest.mark.parametrize("policy", ["fifo", "slurm"])
def test_seed_example_fifo_schedule_is_exact(seed_jobs: list[WorkloadJob], policy: str) -> None:
    recs = by_name(simulate(seed_jobs, get_policy(policy)))
    a, b, c = recs["A"], recs["B"], recs["C"]
    # A is first and fits: it starts at once on the user's 8 GPUs; nothing is left beside
    # it, so B and C (builtin: strict order; backfill: no free GPU) start when A ends.
    assert a.first_start_s == 0.0 and a.gpus == 8 and a.end_s == pytest.approx(4 * HOUR)
    assert b.first_start_s == a.end_s and c.first_start_s == a.end_s
    assert b.end_s == pytest.approx(5 * HOUR) and c.end_s == pytest.approx(5 * HOUR)
    assert (b.gpus, c.gpus) == (2, 2)
    # (4 + 5 + 5) / 3 = 4.67 h: the seed rounds this to "about 4.5 h".
    assert mean_jct_h(simulate(seed_jobs, get_policy(policy))) == pytest.approx(14 / 3, rel=1e-6)
    assert mean_jct_h(simulate(seed_jobs, get_policy(policy))) == pytest.approx(4.5, rel=0.05)


def test_seed_example_a_on_four_gpus_takes_about_eight_hours(seed_jobs: list[WorkloadJob]) -> None:
    """The seed's alternative: A on 4 GPUs (near-linear scaling: ~8 h) beside B and C: ~3.3 h mean."""
    a = seed_jobs[0]
    est = Estimator(CostModel(GPU), 8)
    a4 = TRUTH.job_time_s(a.profile, est.best(a.profile, 4).config) * a.truth_factor
    a8 = TRUTH.job_time_s(a.profile, est.best(a.profile, 8).config) * a.truth_factor
    assert 1.8 < a4 / a8 < 2.1  # near-linear scaling in the cost model
    assert 7.5 * HOUR < a4 < 8.5 * HOUR
    seed_schedule_h = (a4 / HOUR + 1.0 + 1.0) / 3
    assert seed_schedule_h == pytest.approx(3.3, abs=0.1)


def test_seed_example_pipeswift_beats_fifo(seed_jobs: list[WorkloadJob]) -> None:
    """pipeswift must do at least as well as the seed's 3.3 h schedule.

    Tolerance: the seed's "A on 4 GPUs beside B and C" schedule is one feasible plan
    (3.30 h with this cost model, see the test above); any better plan is allowed, and
    we allow 5 % above it for the 60 s tick and prediction rounding. pipeswift in fact
    runs B and C first (shortest first, with a faster config on their 2 GPUs) and A on
    8 GPUs right after (~2.3 h): waiting 1 h for 8 GPUs beats 8 h on 4 GPUs now.
    """
    fifo = mean_jct_h(simulate(seed_jobs, get_policy("fifo")))
    result = simulate(seed_jobs, get_policy("pipeswift"))
    ps = mean_jct_h(result)
    assert ps < fifo * 0.75
    assert ps <= 3.3 * 1.05
    recs = by_name(result)
    assert recs["B"].first_start_s == 0.0 and recs["C"].first_start_s == 0.0
    assert recs["A"].first_start_s <= recs["B"].end_s + 60.0  # A waits only for B and C
    assert all(r.restarts == 0 for r in result.records)


def test_pipeswift_runs_a_on_the_free_fragment_when_waiting_is_worse() -> None:
    """B and C (2 GPUs x 8 h each) are running; A (8 GPUs x 4 h, allows 4..8) arrives.
    Waiting for 8 GPUs ends at ~12 h; starting now on the 4 free GPUs ends at ~8 h:
    pipeswift resizes A to 4 GPUs at once; slurm keeps A waiting for 8 GPUs. (No short-job
    lane: with the default one, kept whether or not short jobs are about, the long jobs B,
    C and A may hold 7 of the 8 GPUs, and A waits for B and C.)"""
    jobs = [hand_job(1, "B", 2, 8.0), hand_job(2, "C", 2, 8.0),
            hand_job(3, "A", 8, 4.0, gpu_range=(4, 8), submit_s=60.0)]
    ps = by_name(simulate(jobs, get_policy("pipeswift", short_lane_fraction=0)))
    assert ps["A"].first_start_s == 60.0 and ps["A"].gpus == 4 and ps["A"].reconfigured
    assert ps["A"].config is not None and ps["A"].config.gpus == 4
    assert 7.5 * HOUR < ps["A"].end_s - 60.0 < 8.5 * HOUR
    sl = by_name(simulate(jobs, get_policy("slurm")))
    assert sl["A"].first_start_s == pytest.approx(8 * HOUR) and sl["A"].gpus == 8
    assert ps["A"].jct_s < sl["A"].jct_s


# ------------------------------------------------------------------ the real controller

def test_pipeswift_preemption_lets_short_jobs_through_a_long_one() -> None:
    """8 GPUs; L (8 GPUs x 10 h) starts at 0; at 1 h, eight 1-GPU x 15 min jobs arrive.
    Non-preemptive: they wait 9 h for L. With preemption on, L is requeued once at the
    next tick, the short jobs run at once, and L resumes from its checkpoint after them."""
    jobs = [hand_job(1, "L", 8, 10.0, save_interval=50)] + [
        hand_job(10 + i, "s%d" % i, 1, 0.25, submit_s=HOUR, global_batch=128) for i in range(8)]
    iter_s = TRUTH.iter_time_s(jobs[0].profile, jobs[0].profile.requested)
    plain = simulate(jobs, get_policy("pipeswift"))
    pre = simulate(jobs, get_policy("pipeswift", preempt=True))
    short_wait = statistics.fmean(r.first_start_s - r.submit_s for r in pre.records if r.name != "L")
    assert short_wait <= 120.0  # started within two ticks
    assert by_name(plain)["s0"].first_start_s == pytest.approx(10 * HOUR, rel=0.01)
    assert mean_jct_h(pre) < 0.3 * mean_jct_h(plain)
    long_run = by_name(pre)["L"]
    assert long_run.restarts == 1
    assert long_run.iters_done == jobs[0].profile.plan.iterations
    # L lost only the short jobs' run, its restart and the work since its last checkpoint
    assert 0.25 * HOUR < long_run.end_s - by_name(plain)["L"].end_s < 0.25 * HOUR + 50 * iter_s + 600.0
    without_checkpoints = [hand_job(1, "L", 8, 10.0)] + jobs[1:]
    assert not any(r.restarts for r in simulate(without_checkpoints, get_policy("pipeswift", preempt=True)).records)


def test_simulation_drives_the_real_controller_tick(seed_jobs: list[WorkloadJob]) -> None:
    spy = Spy(get_policy("sjf"))
    estimator = Estimator(CostModel(GPU), 8)
    sim = Simulation(seed_jobs, spy, estimator, TRUTH, SimSettings(1, 8))
    assert type(sim.controller) is controller_mod.Controller
    assert sim.controller.backend is sim.backend and sim.controller.policy is spy
    ticks: list[float] = []
    sim.on_tick = lambda now, report: ticks.append(now)
    result = sim.run()
    assert len(spy.calls) == result.ticks == len(ticks) > 0
    first_view, first_decisions = spy.calls[0]
    assert first_view.now == 0.0 and {j.job_id for j in first_view.pending} == {1, 2, 3}
    # sjf's order reaches the backend only as SiteFactors: B and C rank above A.
    factors = {d.job_id: d.site_factor for d in first_decisions}
    assert factors[2] > factors[3] > factors[1]


def _imports(path: Path) -> list[tuple[int, str]]:
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            out.append((node.level, node.module or ""))
            out += [(node.level, "%s.%s" % (node.module or "", a.name)) for a in node.names]
        elif isinstance(node, ast.Import):
            out += [(0, a.name) for a in node.names]
    return out


def test_sim_package_imports_no_policy_module_but_the_registry() -> None:
    files = sorted((REPO / "pipeswift_slurm" / "sim").glob("*.py")) + [REPO / "pipeswift_slurm" / "slurm" / "backends" / "sim.py"]
    assert len(files) >= 5
    for path in files:
        for level, name in _imports(path):
            absolute = name if level == 0 else "pipeswift_slurm." + name.lstrip(".")
            parts = absolute.replace("pipeswift_slurm.", "", 1).split(".")
            if parts[0] == "policy":
                assert parts in (["policy"], ["policy", "get_policy"], ["policy", "policy_names"],
                                 ["policy", "PRESETS"], ["policy", "knob_defaults"]), \
                    "%s imports %s: only the registry (pipeswift_slurm.policy) may be used" % (path.name, absolute)
        text = path.read_text()
        for name in ("FifoPolicy", "SlurmPolicy", "SjfPolicy", "TiresiasPolicy", "PipeSwiftPolicy"):
            assert name not in text, "%s names %s" % (path.name, name)
    assert not any(n.startswith("policy") or ".policy" in n for _, n in _imports(files[-1]))


# ------------------------------------------------------------------ invariants (hypothesis)

def _fits_cluster(job: WorkloadJob, nodes: int, gpn: int) -> bool:
    return megatron_rules.node_shape(job.gpus, gpn)[0] <= nodes


@st.composite
def workloads(draw: Any, regular: bool = False) -> tuple[int, int, list[WorkloadJob]]:
    """(nodes, GPUs per node, jobs): 1-4 nodes x 1-8 GPUs (``regular``: 1, 2 or 4 nodes of
    2, 4 or 8 GPUs, where every GPU count a job may get has a placeable node shape)."""
    nodes = draw(st.sampled_from([1, 2, 4]) if regular else st.integers(1, 4))
    gpn = draw(st.sampled_from([2, 4, 8]) if regular else st.integers(1, 8))
    n_jobs = draw(st.integers(5, 30))
    wseed = draw(st.integers(0, 10_000))
    flex = draw(st.sampled_from([0.0, 0.5, 1.0]))
    load = draw(st.sampled_from([0.5, 1.0, 2.0]))
    rows = synthetic_trace(n_jobs, nodes * gpn, load, wseed)
    conv = Conversion(TRUTH, nodes * gpn, gpn, flex=flex, seed=wseed, noise_sigma=0.1)
    # Rows the conversion cannot place on this node shape are skipped here; they are the
    # subject of test_build_workload_rejects_jobs_whose_node_shape_cannot_fit and
    # test_conversion_of_an_odd_node_size_raises_a_workload_error (bugs, reported).
    jobs = []
    for i, row in enumerate(rows):
        try:
            job = to_megatron_job(i, row, conv)
        except (WorkloadError, megatron.MegatronArgError):
            continue
        if _fits_cluster(job, nodes, gpn):
            jobs.append(job)
    return nodes, gpn, jobs


def _run_checked(nodes: int, gpn: int, jobs: list[WorkloadJob], policy_name: str) -> tuple[Any, list[str]]:
    """Run with an on_tick hook that checks the backend's GPU accounting after each pass."""
    spy = Spy(make_policy(policy_name))
    problems: list[str] = []
    estimator = Estimator(CostModel(GPU), gpn)
    sim = Simulation(jobs, spy, estimator, TRUTH, SimSettings(nodes, gpn))
    configs: dict[int, Any] = {}

    def check(now: float, report: Any) -> None:
        be = sim.backend
        if any(f < 0 or f > gpn for f in be.free):
            problems.append("t=%s: free GPUs per node %s" % (now, be.free))
        used = [0] * nodes
        for job in be.running.values():
            for node in job.placement:
                used[node] += job.gpus_per_node
            if job.start_s is None or job.start_s < job.submit_s:
                problems.append("job %d started at %s before its submit %s" % (job.job_id, job.start_s, job.submit_s))
            if job.num_nodes != len(job.placement):
                problems.append("job %d on %d nodes, placed on %s" % (job.job_id, job.num_nodes, job.placement))
            seen = configs.setdefault(job.job_id, (job.start_s, job.num_nodes, job.gpus_per_node, job.config))
            if seen[0] == job.start_s and seen != (job.start_s, job.num_nodes, job.gpus_per_node, job.config):
                problems.append("job %d changed while running: %s -> %s" % (job.job_id, seen, job.config))
        if [gpn - f for f in be.free] != used:
            problems.append("t=%s: used per node %s but free says %s" % (now, used, be.free))
        # what the policy saw: a planned start now never exceeds the GPUs free now
        view, decisions = spy.calls[-1]
        by_id = {j.job_id: j for j in view.jobs}
        start_now = sum((d.config.gpus if d.config is not None else by_id[d.job_id].gpus) for d in decisions
                        if d.predicted_start_s == view.now and not d.requeue and d.job_id in by_id
                        and by_id[d.job_id].pending)
        # a reshaped running job restarts at once in its new shape
        start_now += sum(d.config.gpus for d in decisions if d.requeue and d.config is not None
                         and d.job_id in by_id and by_id[d.job_id].running)
        freed = sum(by_id[d.job_id].gpus for d in decisions if d.requeue and d.job_id in by_id
                    and by_id[d.job_id].running)
        if start_now > view.free_gpus + freed:
            problems.append("t=%s: policy plans %d GPUs to start now, %d free, %d freed"
                            % (now, start_now, view.free_gpus, freed))
        for d in decisions:
            job = by_id.get(d.job_id)
            if job is not None and job.running and d.config is not None and not (
                    d.requeue and policy_name == "pipeswift:preempt" and d.config.gpus > job.gpus):
                problems.append("t=%s: decision resizes running job %d" % (now, d.job_id))
            if d.config is not None:
                c = d.config
                if c.gpus != c.tp * c.pp * c.cp * c.dp or c.gpus != c.num_nodes * c.gpus_per_node:
                    problems.append("job %d: config %s is not tp*pp*dp" % (d.job_id, c.short()))
                if c.num_nodes > nodes or c.gpus_per_node > gpn:
                    problems.append("job %d: config %s does not fit the cluster" % (d.job_id, c.short()))

    sim.on_tick = check
    result = sim.run()
    for rec in result.records:  # GPU-seconds: the records and the backend's own accounting agree
        attained = sim.backend.jobs[rec.job_id].attained_gpu_s
        if abs(rec.busy_gpu_s - attained) > 1e-6 * max(1.0, attained):
            problems.append("job %d: busy %s GPU-s, backend attained %s" % (rec.job_id, rec.busy_gpu_s, attained))
    return result, problems


def _replay_peak(records: list[JobRecord]) -> int:
    events = sorted([(r.first_start_s, 1, r.gpus) for r in records] + [(r.end_s, 0, -r.gpus) for r in records])
    level = peak = 0
    for _, _, delta in events:  # ends before starts at equal times
        level += delta
        peak = max(peak, level)
    return peak


# No shrinking: a failure is reported with its generated example, and the run time of
# this file stays bounded when one fails.
PROPERTY = settings(max_examples=20, deadline=None, derandomize=True, database=None,
                    phases=[Phase.explicit, Phase.generate],
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])


@pytest.mark.parametrize("policy_name", POLICIES)
@PROPERTY
@seed(20240611)
@given(data=workloads())
def test_invariants_on_random_clusters(data: tuple[int, int, list[WorkloadJob]], policy_name: str) -> None:
    """Fails for pipeswift on odd node shapes (e.g. 3 x 6 GPUs): it resizes a job to an
    unplaceable 4-node config and the simulation stalls (bug, reported; see
    test_policies.py::test_pipeswift_never_picks_more_nodes_than_the_cluster_has)."""
    check_invariants(data, policy_name)


@PROPERTY
@seed(99)
@given(data=workloads(regular=True))
def test_pipeswift_invariants_on_regular_clusters(data: tuple[int, int, list[WorkloadJob]]) -> None:
    check_invariants(data, "pipeswift")


def check_invariants(data: tuple[int, int, list[WorkloadJob]], policy_name: str) -> None:
    nodes, gpn, jobs = data
    if not jobs:
        return
    result, problems = _run_checked(nodes, gpn, jobs, policy_name)
    assert problems == []
    recs = result.records
    by_id = {j.job_id: j for j in jobs}
    assert {r.job_id for r in recs} == set(by_id)
    for r in recs:
        job = by_id[r.job_id]
        assert r.end_s is not None and r.first_start_s is not None, "job %d never finished" % r.job_id
        assert r.first_start_s >= r.submit_s == job.submit_s
        assert r.end_s > r.first_start_s and r.queue_s >= -1e-6
        assert 0 < r.gpus <= nodes * gpn and r.config is not None and r.config.gpus == r.gpus
        assert r.iters_done == job.profile.plan.iterations
    assert all(r.run_s <= r.jct_s + 1e-6 for r in recs)
    assert sum(r.busy_gpu_s for r in recs) <= result.makespan_s * nodes * gpn * (1 + 1e-9)
    if policy_name in NON_PREEMPTIVE:
        assert all(r.restarts == 0 for r in recs)
        assert _replay_peak(recs) <= nodes * gpn
        for r in recs:
            job = by_id[r.job_id]
            assert r.busy_gpu_s == pytest.approx(r.gpus * (r.end_s - r.first_start_s), rel=1e-9)
            assert r.run_s == pytest.approx(r.end_s - r.first_start_s, rel=1e-9)
            # truth: the run took the cost model's time of the config it ran x the truth factor
            true_s = TRUTH.job_time_s(job.profile, r.config) * job.truth_factor
            # (plus the launcher's start, Slurm's default settings: SchedulingSettings.launch_s)
            assert r.run_s == pytest.approx(true_s + SchedulingSettings().launch_s, rel=1e-6)
        if policy_name in ("fifo", "slurm", "sjf"):
            assert not any(r.reconfigured for r in recs)
            assert all(r.config == by_id[r.job_id].profile.requested for r in recs)


@pytest.mark.parametrize("policy_name", POLICIES)
@settings(PROPERTY, max_examples=3)
@seed(3)
@given(data=workloads(regular=True))
def test_same_seed_same_records(data: tuple[int, int, list[WorkloadJob]], policy_name: str) -> None:
    nodes, gpn, jobs = data
    if not jobs:
        return
    first = simulate(jobs, make_policy(policy_name), nodes, gpn)
    second = simulate(jobs, make_policy(policy_name), nodes, gpn)
    assert first.records == second.records
    assert (first.ticks, first.updates, first.makespan_s) == (second.ticks, second.updates, second.makespan_s)


def test_same_seed_same_workload() -> None:
    conv = Conversion(TRUTH, 32, 8, flex=0.5, seed=5, noise_sigma=0.2)
    one = build_workload(synthetic_trace(25, 32, 0.8, 5), conv)
    two = build_workload(synthetic_trace(25, 32, 0.8, 5), conv)
    assert one == two
    other = build_workload(synthetic_trace(25, 32, 0.8, 6), replace(conv, seed=6))
    assert [j.submit_s for j in one] != [j.submit_s for j in other]


# ------------------------------------------------------------------ the wait bound

def _starvation_jobs() -> list[WorkloadJob]:
    """8 GPUs; a rigid 8-GPU x 2 h job at t=0 behind a 2-GPU job, then a stream of 2-GPU
    x 1 h jobs every 20 min for 24 h: shortest-first alone never frees 8 GPUs at once."""
    jobs = [hand_job(1, "first", 2, 1.0), hand_job(2, "big", 8, 2.0, submit_s=30.0)]
    for i in range(72):
        jobs.append(hand_job(3 + i, "s%d" % i, 2, 1.0, submit_s=60.0 + i * 1200.0))
    return jobs


@pytest.fixture(scope="module")
def starvation_jobs() -> list[WorkloadJob]:
    return _starvation_jobs()


def test_pipeswift_keeps_the_wait_bound_where_sjf_starves(starvation_jobs: list[WorkloadJob]) -> None:
    bound_s = 6 * HOUR  # 3 x the longest job: feasible (the big job needs one 2 h gap)
    sjf = by_name(simulate(starvation_jobs, get_policy("sjf")))
    assert sjf["big"].queue_s > bound_s  # the scenario does starve without a bound
    result = simulate(starvation_jobs, get_policy("pipeswift", wait_bound_s=bound_s))
    assert max(r.queue_s for r in result.records) <= bound_s
    assert summarize(result, starvation_jobs, bound_s)["jobs_over_wait_bound"] == 0


@settings(PROPERTY, max_examples=8)
@seed(11)
@given(data=workloads(regular=True))
def test_pipeswift_never_exceeds_a_feasible_wait_bound(data: tuple[int, int, list[WorkloadJob]]) -> None:
    """Bound = 4 x (all the work serialised on the whole cluster + the longest limit):
    every job could wait for everything else and still start within it."""
    nodes, gpn, jobs = data
    if not jobs:
        return
    cluster = nodes * gpn
    longest = max(j.time_limit_s for j in jobs)
    serial = sum(j.time_limit_s * j.gpus for j in jobs) / cluster
    bound = 4 * (serial + longest)
    result = simulate(jobs, get_policy("pipeswift", wait_bound_s=bound), nodes, gpn)
    assert max(r.queue_s for r in result.records) <= bound
    assert summarize(result, jobs, bound)["jobs_over_wait_bound"] == 0


# ------------------------------------------------------------------ metrics

def test_summarize_on_the_seed_example(seed_jobs: list[WorkloadJob]) -> None:
    result = simulate(seed_jobs, get_policy("fifo"))
    m = summarize(result, seed_jobs, wait_bound_s=3 * HOUR)
    assert m["policy"] == "fifo" and m["jobs"] == 3
    assert m["mean_jct_s"] == pytest.approx(14 * HOUR / 3)
    assert m["median_jct_s"] == pytest.approx(5 * HOUR) and m["p99_jct_s"] == pytest.approx(5 * HOUR)
    assert m["mean_queue_s"] == pytest.approx(8 * HOUR / 3) and m["max_wait_s"] == pytest.approx(4 * HOUR)
    assert m["queue_ratio"] == pytest.approx(8 / 14)
    assert m["jobs_over_wait_bound"] == 2
    assert m["makespan_s"] == pytest.approx(5 * HOUR)
    assert m["gpu_utilisation"] == pytest.approx((8 * 4 + 2 * 2) / (8 * 5))
    assert m["reconfigured_jobs"] == 0 and m["restarts"] == 0
    assert sum(m["jobs_by_class"].values()) == 3
    est = Estimator(CostModel(GPU), 8)
    assert lower_bound_s(seed_jobs, est, TRUTH, 8) < m["mean_jct_s"]


def test_percentile_is_nearest_rank() -> None:
    assert percentile([], 50) is None
    assert percentile([3.0, 1.0, 2.0], 50) == 2.0
    assert percentile(list(range(1, 101)), 99) == 99
    assert percentile([5.0], 99) == 5.0


# ------------------------------------------------------------------ workload conversion

def test_user_config_reproduces_the_recorded_duration() -> None:
    rows = synthetic_trace(60, 64, 0.9, 2) + [TraceRow("big", 0.0, 10 * HOUR, 128, "u", "x")]
    conv = Conversion(CostModel(hardware.get_gpu_type("A100-80GB")), 128, 8, seed=2)
    checked = 0
    for i, row in enumerate(rows):
        job = to_megatron_job(i, row, conv)
        profile = job.profile
        iter_s = conv.cost.iter_time_s(profile, profile.requested)
        predicted = conv.cost.job_time_s(profile, profile.requested)
        assert profile.requested.gpus == row.num_gpus
        assert conv.cost.fits(profile, profile.requested)
        assert megatron_rules.check_config(profile, profile.requested, 8) == []
        if row.duration_s > conv.cost.startup_s(profile) + iter_s:
            assert abs(predicted - row.duration_s) <= max(0.01 * row.duration_s, iter_s), row
            checked += 1
        assert job.recorded_duration_s == row.duration_s
        # the user's limit: 1.5 x the true run time, rounded up to 30 min
        assert job.time_limit_s % 1800 == 0 and job.time_limit_s >= 1.5 * predicted * job.truth_factor - 1e-6
        assert job.time_limit_s < 1.5 * predicted * job.truth_factor + 1800
    assert checked > 40


def test_rescale_load_gives_the_requested_offered_load() -> None:
    rows = synthetic_trace(50, 32, 0.9, 4)
    assert offered_load(rows, 32) == pytest.approx(0.9)
    for load in (0.3, 1.5):
        scaled = rescale_load(rows, 32, load)
        assert offered_load(scaled, 32) == pytest.approx(load)
        assert [r.name for r in scaled] == [r.name for r in rows]
        assert [r.duration_s for r in scaled] == [r.duration_s for r in rows]
        assert scaled[0].submit_s == rows[0].submit_s
    assert rescale_load([], 32, 0.5) == []


def test_select_window_slices_days_and_rebases() -> None:
    day = 86400.0
    rows = [TraceRow(n, t * day, 60.0, 1) for n, t in (("a", 0.5), ("d", 2.5), ("b", 1.2), ("c", 1.9))]
    chosen = select_window(rows, start_day=1, window_days=1)
    assert [r.name for r in chosen] == ["b", "c"]
    assert chosen[0].submit_s == 0.0 and chosen[1].submit_s == pytest.approx(0.7 * day)
    assert [r.name for r in select_window(rows, start_day=1)] == ["b", "c", "d"]
    assert select_window(rows, start_day=5, window_days=1) == []


def test_flex_share_is_about_f() -> None:
    rows = synthetic_trace(400, 64, 0.9, 9)
    for flex in (0.0, 0.3, 1.0):
        jobs = build_workload(rows, Conversion(TRUTH, 64, 8, flex=flex, seed=9))
        share = sum(j.profile.flexible for j in jobs) / len(jobs)
        # binomial sd at 400 jobs is at most 0.025: 3 sd
        assert share == pytest.approx(flex, abs=0.075)
        for j in jobs:
            if j.profile.flexible:
                assert j.profile.gpu_range == (max(1, j.gpus // 2), min(2 * j.gpus, 64))


def test_truth_factor_is_class_bias_times_noise() -> None:
    rows = synthetic_trace(300, 256, 0.9, 3) + [TraceRow("llama", 0.0, 20 * HOUR, 128)]
    base = Conversion(TRUTH, 256, 8, seed=3)
    assert all(j.truth_factor == 1.0 for j in build_workload(rows, base))
    biased = build_workload(rows, replace(base, class_bias=(("gpt", 1.3), ("gpt-swiglu", 2.0))))
    llama = next(j for j in biased if j.name == "llama")
    assert llama.model == "llama-70b" and llama.profile.job_class.startswith("gpt-swiglu")
    assert llama.truth_factor == 2.0  # the later, more specific prefix wins
    assert all(j.truth_factor == 1.3 for j in biased if j.name != "llama")
    noisy = build_workload(rows, replace(base, class_bias=(("gpt", 1.3),), noise_sigma=0.2))
    logs = [math.log(j.truth_factor / 1.3) for j in noisy if not j.profile.job_class.startswith("gpt-swiglu")]
    assert abs(statistics.fmean(logs)) < 0.05
    assert statistics.pstdev(logs) == pytest.approx(0.2, rel=0.2)


def test_conversion_is_per_row_and_order_independent() -> None:
    rows = synthetic_trace(30, 32, 0.9, 8)
    conv = Conversion(TRUTH, 32, 8, flex=0.5, seed=8, noise_sigma=0.3)
    forward = {j.name: j for j in build_workload(rows, conv)}
    backward = {j.name: j for j in build_workload(rows[::-1], conv)}
    for name, job in forward.items():
        other = backward[name]
        assert (job.argv, job.profile, job.truth_factor, job.time_limit_s) == (
            other.argv, other.profile, other.truth_factor, other.time_limit_s)


def test_synthetic_trace_is_seeded_and_capped() -> None:
    rows = synthetic_trace(200, 12, 0.9, 1)
    assert rows == synthetic_trace(200, 12, 0.9, 1)
    assert rows != synthetic_trace(200, 12, 0.9, 2)
    assert all(1 <= r.num_gpus <= 12 for r in rows)
    assert {r.category for r in rows} <= {"debug-eval", "finetune", "pretrain"}
    assert [r.submit_s for r in rows] == sorted(r.submit_s for r in rows)


def test_oversized_jobs_are_an_error_unless_dropped() -> None:
    rows = [TraceRow("ok", 0.0, HOUR, 8), TraceRow("huge", 10.0, HOUR, 32)]
    conv = Conversion(TRUTH, 16, 8)
    with pytest.raises(WorkloadError, match="huge with 32 GPUs.*--drop-oversized"):
        build_workload(rows, conv)
    kept = build_workload(rows, conv, drop_oversized=True)
    assert [j.name for j in kept] == ["ok"] and kept[0].job_id == 1


def test_build_workload_rejects_jobs_whose_node_shape_cannot_fit() -> None:
    """BUG (reported): on 3 nodes x 3 GPUs an 8-GPU row becomes a 4 x 2 job that can
    never be placed; build_workload accepts it and the simulation later stalls with a
    RuntimeError instead of a WorkloadError naming the job (as for oversized jobs)."""
    rows = [TraceRow("fits", 0.0, HOUR, 2), TraceRow("eight", 10.0, HOUR, 8)]
    conv = Conversion(TRUTH, 9, 3)
    try:
        jobs = build_workload(rows, conv)
    except WorkloadError as exc:
        assert "eight" in str(exc)
        return
    shapes = {j.name: (j.profile.requested.num_nodes, j.profile.requested.gpus_per_node) for j in jobs}
    assert all(nodes <= 3 for nodes, _ in shapes.values()), "unplaceable job shapes accepted: %s" % shapes


def test_conversion_of_an_odd_node_size_raises_a_workload_error() -> None:
    """BUG (reported): a 12-GPU row on nodes of 3 GPUs tries gpt-2.7b (tp=2) and
    ``_fit_model`` lets megatron.MegatronArgError ("tp 2 does not fit inside a node of 3
    GPUs") escape instead of trying the next model; ``pipeswift simulate --gpus 12
    --gpus-per-node 3`` then ends in a traceback."""
    conv = Conversion(TRUTH, 12, 3, seed=0)
    try:
        job = to_megatron_job(0, TraceRow("r0", 0.0, HOUR, 12), conv)
    except WorkloadError:
        return
    assert job.gpus == 12 and job.profile.requested.gpus_per_node <= 3


def test_read_trace_errors_name_file_line_and_column(tmp_path: Path) -> None:
    path = tmp_path / "t.csv"
    path.write_text("job_id,submit_time_s,duration_s,num_gpus\nj1,0,60,1\nj2,5,abc,2\n")
    with pytest.raises(WorkloadError, match=r"t\.csv:3: column 'duration_s': 'abc' is not a number"):
        read_trace(path)
    path.write_text("job_id,submit_time_s,duration_s,num_gpus\nj1,0,60,1.5\n")
    with pytest.raises(WorkloadError, match=r":2: column 'num_gpus'"):
        read_trace(path)
    path.write_text("job_id,submit_time_s,num_gpus\nj1,0,1\n")
    with pytest.raises(WorkloadError, match="missing column.*duration_s"):
        read_trace(path)
    path.write_text("job_id,submit_time_s,duration_s,num_gpus,user,cluster\nj1,0,60,1,alice,vc1\n")
    assert read_trace(path) == [TraceRow("j1", 0.0, 60.0, 1, "alice", "vc1")]
    # a CSV saved by Excel starts with a byte-order mark: it is not part of the first column's name
    path.write_bytes(b"\xef\xbb\xbf" + path.read_bytes())
    assert read_trace(path) == [TraceRow("j1", 0.0, 60.0, 1, "alice", "vc1")]


@pytest.mark.parametrize("row, needle", [
    ("j1,0,1e300,1,u,c", r":2: column 'duration_s': '1e300' is over the largest a trace may hold"),
    ("j1,1e300,60,1,u,c", r":2: column 'submit_time_s'"),
    ("j1,0,60,1e300,u,c", r":2: column 'num_gpus'"),
    ("j1,0,60,1,smith,john,vc1", r":2: more fields than the header's 6; a value with a comma must be quoted"),
    ("j1,0,60,1,alice", r":2: fewer fields than the header's 6"),
])
def test_a_trace_row_that_cannot_be_right_is_named(tmp_path: Path, row: str, needle: str) -> None:
    """Each was accepted before: a 1e300 duration gave a mean JCT of 10^295 days, and an
    unquoted comma in a user name moved the row to another cluster."""
    path = tmp_path / "t.csv"
    path.write_text("job_id,submit_time_s,duration_s,num_gpus,user,cluster\n%s\n" % row)
    with pytest.raises(WorkloadError, match=needle):
        read_trace(path)


def test_a_trace_that_is_a_fifo_nobody_writes_is_empty_not_a_hang(tmp_path: Path) -> None:
    import os

    os.mkfifo(tmp_path / "t.csv")
    with pytest.raises(WorkloadError, match="missing column"):
        read_trace(tmp_path / "t.csv")


class RequeueOnce:
    """Requeues job 1 at the first tick at or after 100 s (what a preempting policy does)."""

    name = "requeue-once"
    scheduler = "backfill"
    preempts = True
    site_factor_max = 0

    def __init__(self) -> None:
        self.done = False

    def decide(self, view: Any, profiles: Any, estimator: Any) -> list[Any]:
        job = view.job(1)
        if self.done or view.now < 100.0 or job is None or not job.running:
            return []
        self.done = True
        return [Decision(1, requeue=True, reason="test")]


def test_a_requeued_job_starts_again_when_its_begin_time_passes() -> None:
    """Slurm keeps a requeued job pending on its begin time (``requeue_delay_s``; 121 s by
    default): the engine runs Slurm's passes then. The job, requeued by the tick of another
    job's arrival at 120 s with GPUs to spare, starts again at 241 s; the idealised Slurm's
    at once."""
    jobs = [hand_job(1, "a", 4, 1.0, save_interval=10), hand_job(2, "b", 1, 1.0, submit_s=120.0)]
    for delay_s, restart_s in ((121.0, 241.0), (0.0, 120.0)):
        result = Simulation(jobs, RequeueOnce(), Estimator(CostModel(GPU), 8), TRUTH,
                            SimSettings(1, 8, tick_interval_s=60.0, slurm=replace(IDEAL, requeue_delay_s=delay_s))).run()
        rec = by_name(result)["a"]
        assert (rec.restarts, rec.run_started_s, by_name(result)["b"].first_start_s) == (1, restart_s, 120.0)


def test_a_controller_on_its_own_clock_sees_a_job_first_only_with_the_first_look() -> None:
    """With ticks on events the controller sizes a job at its arrival, before Slurm's pass.
    On cron's clock (``ticks_on_events`` off) without the first look Slurm starts it first,
    at its own size, and pipeswift-launch runs the layout the estimator chooses for that
    allocation. With psbatch's first look (a begin time ``first_look_s`` ahead) it waits
    for the controller's first tick, at the next minute of its clock, which sizes it and
    clears the begin time; with the controller's clock slower than the first look, it starts
    at its begin time, at its own size."""
    job = hand_job(1, "a", 1, 1.0, gpu_range=(1, 8), submit_s=10.0)
    estimator = Estimator(CostModel(GPU), 8)
    seen: dict[str, list[float]] = {}

    def run(name: str, **settings: Any) -> JobRecord:
        seen[name] = []
        result = Simulation([job], make_policy("pipeswift"), estimator, TRUTH, SimSettings(1, 8, slurm=IDEAL, **settings),
                            on_tick=lambda now, _report: seen[name].append(now)).run()
        return by_name(result)["a"]

    events, unseen = run("events"), run("cron", ticks_on_events=False, first_look_s=0.0)
    looked, late = run("look", ticks_on_events=False), run("late", ticks_on_events=False, tick_interval_s=600.0)
    assert (events.first_start_s, unseen.first_start_s, looked.first_start_s, late.first_start_s) == (
        10.0, 10.0, 60.0, 70.0)
    assert events.gpus > 1 and looked.gpus == events.gpus and unseen.gpus == late.gpus == 1
    chosen = estimator.best(job.profile, 1)
    assert chosen is not None and unseen.config == chosen.config
    assert unseen.jct_s > looked.jct_s > events.jct_s
    assert seen["events"][0] == 10.0 and seen["cron"][0] == seen["look"][0] == 60.0 and seen["late"][0] == 600.0
