"""Run several policies on one workload and cluster, side by side: what ``pipeswift
simulate``, ``pipeswift demo`` and the benches call. Builds the workload, one estimator
and truth model per run, the Simulation per policy, and the metrics. No formatting."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Optional, Sequence

from pipeswift_slurm.core.costmodel import CostModel
from pipeswift_slurm.core.estimator import Estimator
from pipeswift_slurm.core.hardware import GpuType
from pipeswift_slurm.policy import PRESETS, get_policy, knob_defaults
from pipeswift_slurm.sim.engine import SimResult, SimSettings, Simulation
from pipeswift_slurm.sim.metrics import lower_bound_s, summarize
from pipeswift_slurm.sim.workload import (Conversion, TraceRow, WorkloadError, WorkloadJob, build_workload, offered_load,
                       read_trace, rescale_load, select_window, synthetic_trace, window_start_s)

log = logging.getLogger(__name__)

ALL_POLICIES = ("fifo", "slurm", "sjf", "tiresias", "pipeswift")


@dataclass(frozen=True)
class RunSpec:
    """Everything that defines a comparison (CLI options map one to one).

    ``workload`` None means the synthetic LLM-cluster generator with ``synthetic_jobs``
    jobs. ``load`` None keeps the trace's own arrival times. ``class_bias`` is
    ((job_class prefix, true/predicted ratio), ...) for the truth; ``noise_sigma`` the
    log-normal per-job noise of the truth. ``layouts``: the users' own layouts, "user"
    (the zoo defaults) or "expert" (the planner's best at each job's GPU count; see
    sim/workload.py).
    """

    gpus: int = 64
    gpus_per_node: int = 8
    gpu: Optional[GpuType] = None
    workload: Optional[str] = None
    synthetic_jobs: int = 400
    load: Optional[float] = 0.9
    policies: Sequence[str] = ALL_POLICIES
    seed: int = 1
    start_day: float = 0.0
    window_days: Optional[float] = None
    flex: float = 1.0
    tick_interval_s: float = 60.0
    wait_bound_s: float = 48 * 3600.0
    drop_oversized: bool = False
    class_bias: tuple[tuple[str, float], ...] = ()
    noise_sigma: float = 0.0
    cluster_filter: Optional[str] = None
    policy_knobs: dict[str, dict[str, Any]] = field(default_factory=dict)  # by label, over policy.PRESETS
    no_requeue: tuple[str, ...] = ()  # labels run where the site does not allow requeue
    # epoch second of the simulation's time 0, as the history (store) sees it; None: the
    # trace's own dates when its times are dates, else today (UTC midnight); 0: relative
    start_epoch_s: Optional[float] = 0.0
    layouts: str = "user"


@dataclass
class Comparison:
    """Per-policy metrics (in the order run), the workload facts and the raw results."""

    spec: RunSpec
    workload: dict[str, Any]
    metrics: list[dict[str, Any]]
    results: list[SimResult]
    jobs: list[WorkloadJob]


def trace_rows(spec: RunSpec) -> tuple[list[TraceRow], Optional[float]]:
    """The trace rows of the spec (a file slice, optionally re-loaded, or the generator),
    times from 0, and the window's own start (epoch s) when the trace's times are dates.

    Raises:
        WorkloadError: unreadable/malformed file or an empty window.
    """
    if spec.workload is None:
        return synthetic_trace(spec.synthetic_jobs, spec.gpus, spec.load or 0.9, spec.seed), None
    rows = read_trace(spec.workload)
    if spec.cluster_filter:
        rows = [r for r in rows if r.category == spec.cluster_filter]
    own_start_s = window_start_s(rows, spec.start_day)
    rows = select_window(rows, spec.start_day, spec.window_days)
    if not rows:
        raise WorkloadError("%s: no job in the selected window (start day %g, %s days)"
                            % (spec.workload, spec.start_day, spec.window_days or "all"))
    return (rescale_load(rows, spec.gpus, spec.load) if spec.load else rows), own_start_s


def today_utc_s() -> float:
    """Today's UTC midnight in epoch seconds."""
    now = time.time()
    return float(now - now % 86400)


def build_jobs(spec: RunSpec, cost: CostModel) -> tuple[list[WorkloadJob], dict[str, Any]]:
    """Workload jobs plus a description (counts, offered load) for the report."""
    if spec.gpus % spec.gpus_per_node:
        raise WorkloadError("--gpus %d is not a multiple of --gpus-per-node %d" % (spec.gpus, spec.gpus_per_node))
    rows, own_start_s = trace_rows(spec)
    conv = Conversion(cost, spec.gpus, spec.gpus_per_node, flex=spec.flex, seed=spec.seed,
                      class_bias=spec.class_bias, noise_sigma=spec.noise_sigma, layouts=spec.layouts)
    jobs = build_workload(rows, conv, drop_oversized=spec.drop_oversized)
    start_s = spec.start_epoch_s if spec.start_epoch_s is not None else own_start_s or today_utc_s()
    jobs = [replace(j, submit_s=j.submit_s + start_s) for j in jobs] if start_s else jobs
    facts = {"source": spec.workload or "synthetic", "jobs": len(jobs), "dropped_oversized": len(rows) - len(jobs),
             "offered_load": offered_load(rows, spec.gpus),
             "span_days": (max(r.submit_s for r in rows) - min(r.submit_s for r in rows)) / 86400.0 if rows else 0.0,
             "flexible_jobs": sum(1 for j in jobs if j.profile.flexible), "start_epoch_s": start_s}
    return jobs, facts


def run_comparison(spec: RunSpec, store_for: Optional[Callable[[str], Any]] = None,
                   on_tick: Optional[Callable[[str, float, Any], None]] = None,
                   on_start: Optional[Callable[[str, int], None]] = None) -> Comparison:
    """Simulate every policy of ``spec`` on the same workload, cluster and seed.

    Args:
        spec: the run.
        store_for: policy name -> Store to record that run's ticks into (or None).
        on_tick: progress callback (policy name, simulated time, tick report).
        on_start: called before each policy's run (policy name, jobs in the workload).
    """
    from pipeswift_slurm.core.hardware import DEFAULT_GPU_TYPE, get_gpu_type

    gpu = spec.gpu or get_gpu_type(DEFAULT_GPU_TYPE)
    truth = CostModel(gpu)
    jobs, facts = build_jobs(spec, truth)
    estimator = Estimator(CostModel(gpu), spec.gpus_per_node)
    settings = SimSettings(spec.gpus // spec.gpus_per_node, spec.gpus_per_node, tick_interval_s=spec.tick_interval_s)
    metrics, results = [], []
    for name in spec.policies:
        base = name.split(":")[0]
        knobs = {**PRESETS.get(name, {}), **spec.policy_knobs.get(name, {})}
        if "wait_bound_s" in knob_defaults(base):
            knobs.setdefault("wait_bound_s", spec.wait_bound_s)
        policy = get_policy(base, **knobs)
        store = store_for(name) if store_for else None
        if on_start is not None:
            on_start(name, len(jobs))
        tick_cb = (lambda now, rep, _n=name: on_tick(_n, now, rep)) if on_tick else None
        t0 = time.perf_counter()
        run_settings = replace(settings, allow_requeue=False) if name in spec.no_requeue else settings
        result = Simulation(jobs, policy, estimator, truth, run_settings, store=store, on_tick=tick_cb).run()
        result.policy = name
        result.makespan_s = max(0.0, result.makespan_s - facts["start_epoch_s"])  # a duration, from time 0
        log.info("%s: %d jobs simulated in %.1f s", name, len(jobs), time.perf_counter() - t0)
        results.append(result)
        metrics.append(summarize(result, jobs, spec.wait_bound_s))
    facts["lower_bound_mean_jct_s"] = lower_bound_s(jobs, estimator, truth, spec.gpus)
    return Comparison(spec, facts, metrics, results, jobs)


def with_policies(spec: RunSpec, policies: Sequence[str]) -> RunSpec:
    return replace(spec, policies=tuple(policies))
