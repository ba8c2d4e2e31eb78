"""Run several policies on one workload and cluster, side by side: what ``pipeswift
simulate``, ``pipeswift demo`` and the benches call. Builds the workload, one estimator
and truth model per run, the Simulation per policy, and the metrics. No formatting."""

from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Optional, Sequence

from pipeswift_slurm.core.costmodel import CostModel
from pipeswift_slurm.core.estimator import Estimator
from pipeswift_slurm.core.hardware import GpuType
from pipeswift_slurm.core.planner import Planner
from pipeswift_slurm.slurm.backends.sched_settings import SchedulingSettings
from pipeswift_slurm.policy import PRESETS, get_policy, knob_defaults
from pipeswift_slurm.sim.engine import SimResult, SimSettings, Simulation
from pipeswift_slurm.sim.harm import layout_harm, resized_jct
from pipeswift_slurm.sim.learning import learner, unseen_layout_errors
from pipeswift_slurm.sim.mixed import SimPartition, assign_partitions, check_partitions
from pipeswift_slurm.sim.metrics import alone_s, lower_bound_s, summarize, worst_user
from pipeswift_slurm.sim.replay import to_workload, what_changed
from pipeswift_slurm.sim.truth import MAX_TRUTH_SIGMA, ShapeNoise, TruthModel
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
    log-normal per-job noise of the truth; ``shape_sigma`` the log-normal per-config-shape
    factor of the truth (``sim/truth.py``, seeded by ``seed``), ``user_favour`` how much
    faster than predicted the shape each job asked for really runs. ``layouts``: the users'
    own layouts, "user" (the zoo defaults) or "expert" (the planner's fastest at each job's
    GPU count; see sim/layouts.py). ``partitions`` (sim/mixed.py) make a mixed cluster:
    ``gpus``, ``gpus_per_node`` and ``gpu`` are then theirs (the total, the smallest node,
    the first partition's type, for making the workload's jobs), and ``partition_flex`` is
    the share of jobs that allow every partition they fit in; ``partition_truth`` how much
    slower than predicted each named partition's GPUs really run.
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
    ticks_on_events: bool = True  # False: the controller ticks on its own clock only (SimSettings)
    first_look_s: float = 60.0  # then psbatch's first-look begin time (SimSettings)
    wait_bound_s: float = 48 * 3600.0
    drop_oversized: bool = False
    class_bias: tuple[tuple[str, float], ...] = ()
    noise_sigma: float = 0.0
    shape_sigma: float = 0.0
    user_favour: float = 1.0
    cluster_filter: Optional[str] = None
    policy_knobs: dict[str, dict[str, Any]] = field(default_factory=dict)  # by label, over policy.PRESETS
    no_requeue: tuple[str, ...] = ()  # labels run where the site does not allow requeue
    # epoch second of the simulation's time 0, as the history (store) sees it; None: the
    # trace's own dates when its times are dates, else today (UTC midnight); 0: relative
    start_epoch_s: Optional[float] = 0.0
    # the planner keeps a user's layout within the error band (``planner.keep_user_layout``);
    # False only to measure what that rule costs or saves (bench/do_no_harm.py)
    do_no_harm: bool = True
    # ``simulate --learn``: calibration with layout terms, online (sim/learning.py)
    learn: bool = False
    # with ``learn``: no user's layout of a class is bet against before a run in one was
    # measured (``[calibration] own_layout_first``, ``Estimator.own_layout_first``)
    own_layout_first: bool = False
    # with ``learn``: the calibration starts from this many days of the site's history (the
    # same policy on the trace's days before the window, learned from as it ran), as at a
    # site that has run pipeswift that long; 0: a new install, nothing measured
    learn_history_days: float = 0.0
    # with ``learn``: a job is learned from this many seconds after its run started, as the
    # launcher's iteration-time report reaches a live controller; None: when it finishes
    learn_report_s: Optional[float] = None
    # a site's own history (sim/replay.py History, from --sacct or --history) replayed
    # instead of ``workload``; its own times are kept (``load`` is not applied)
    history: Any = None
    # the site's Slurm scheduling settings (``--slurm-config``); Slurm's defaults otherwise
    slurm: SchedulingSettings = field(default_factory=SchedulingSettings)
    layouts: str = "user"
    partitions: tuple[SimPartition, ...] = ()
    partition_flex: float = 1.0
    partition_truth: tuple[tuple[str, float], ...] = ()  # (partition, true/predicted iteration time there)


@dataclass
class Comparison:
    """Per-policy metrics (in the order run), the workload facts and the raw results."""

    spec: RunSpec
    workload: dict[str, Any]
    metrics: list[dict[str, Any]]
    results: list[SimResult]
    jobs: list[WorkloadJob]
    changed: Optional[dict[str, Any]] = None  # a history's replay: replay.what_changed
    calibrators: dict[str, Any] = field(default_factory=dict)  # ``learn``: policy -> its OnlineCalibrator


def trace_rows(spec: RunSpec) -> tuple[list[TraceRow], Optional[float]]:
    """The trace rows of the spec (a file slice, optionally re-loaded, or the generator),
    times from 0, and the window's own start (epoch s) when the trace's times are dates.

    Raises:
        WorkloadError: unreadable/malformed file or an empty window.
    """
    if spec.workload is None:
        return synthetic_trace(spec.synthetic_jobs, spec.gpus, spec.load or 0.9, spec.seed), None
    rows = read_trace(spec.workload)
    if spec.cluster_filter is not None:
        clusters = sorted({r.category for r in rows if r.category})
        rows = [r for r in rows if r.category == spec.cluster_filter]
        if not rows:
            raise WorkloadError("%s: no job of cluster %r (--vc); the trace's clusters: %s"
                                % (spec.workload, spec.cluster_filter, ", ".join(clusters[:20]) or "none"))
    own_start_s = window_start_s(rows, spec.start_day)
    rows = select_window(rows, spec.start_day, spec.window_days)
    if not rows:
        raise WorkloadError("%s: no job in the selected window (start day %g, %s days%s)"
                            % (spec.workload, spec.start_day, spec.window_days or "all",
                               ", cluster %s" % spec.cluster_filter if spec.cluster_filter else ""))
    return (rescale_load(rows, spec.gpus, spec.load) if spec.load else rows), own_start_s


def today_utc_s() -> float:
    """Today's UTC midnight in epoch seconds."""
    now = time.time()
    return float(now - now % 86400)


def history_jobs(spec: RunSpec, conv: Conversion) -> tuple[list[WorkloadJob], dict[str, Any]]:
    """The jobs of the spec's history in its window, times from 0, and the facts: the
    window's own start (epoch s), span and offered load."""
    jobs = to_workload(spec.history, conv, drop_oversized=spec.drop_oversized)
    t0 = min(j.submit_s for j in jobs)
    rel = [replace(j, submit_s=j.submit_s - t0) for j in jobs]
    first = min((j.submit_s for j in rel if j.submit_s >= spec.start_day * 86400.0), default=0.0)
    kept = select_window(rel, spec.start_day, spec.window_days)
    if not kept:
        raise WorkloadError("%s: no job in the selected window (start day %g, %s days)"
                            % (spec.history.source, spec.start_day, spec.window_days or "all"))
    span = kept[-1].submit_s - kept[0].submit_s
    work = sum(j.gpus * j.recorded_duration_s for j in kept)
    return kept, {"source": spec.history.source, "dialect": spec.history.dialect, "own_start_s": t0 + first,
                  "span_days": span / 86400.0, "offered_load": work / (max(span, 1.0) * spec.gpus),
                  "replayed_as_ran": sum(1 for j in kept if j.profile is None),
                  "skipped": dict(sorted(spec.history.skipped.items()))}


def build_jobs(spec: RunSpec, cost: CostModel) -> tuple[list[WorkloadJob], dict[str, Any]]:
    """Workload jobs plus a description (counts, offered load) for the report."""
    if spec.gpus % spec.gpus_per_node:
        raise WorkloadError("--gpus %d is not a multiple of --gpus-per-node %d" % (spec.gpus, spec.gpus_per_node))
    for option, sigma in (("--truth-noise", spec.noise_sigma), ("--truth-shape-noise", spec.shape_sigma)):
        if not 0 <= sigma <= MAX_TRUTH_SIGMA:
            raise WorkloadError("%s %g: a log-normal sigma from 0 to %g (0.3 is a typical prediction error)"
                                % (option, sigma, MAX_TRUTH_SIGMA))
    if spec.history is not None:
        conv = Conversion(cost, spec.gpus, spec.gpus_per_node, seed=spec.seed)
        jobs, facts = history_jobs(spec, conv)
        start_s = spec.start_epoch_s if spec.start_epoch_s is not None else facts.pop("own_start_s")
        facts.pop("own_start_s", None)
        jobs = [replace(j, submit_s=j.submit_s + start_s) for j in jobs] if start_s else jobs
        facts.update({"jobs": len(jobs), "dropped_oversized": spec.history.skipped.get("larger than the cluster", 0),
                      "flexible_jobs": sum(1 for j in jobs if j.flexible), "start_epoch_s": start_s})
        return jobs, facts
    rows, own_start_s = trace_rows(spec)
    conv = Conversion(cost, spec.gpus, spec.gpus_per_node, flex=spec.flex, seed=spec.seed,
                      class_bias=spec.class_bias, noise_sigma=spec.noise_sigma, shape_noise=shape_noise(spec),
                      layouts=spec.layouts)
    jobs = build_workload(rows, conv, drop_oversized=spec.drop_oversized)
    start_s = spec.start_epoch_s if spec.start_epoch_s is not None else own_start_s or today_utc_s()
    jobs = [replace(j, submit_s=j.submit_s + start_s) for j in jobs] if start_s else jobs
    facts = {"source": spec.workload or "synthetic", "jobs": len(jobs), "dropped_oversized": len(rows) - len(jobs),
             "offered_load": offered_load(rows, spec.gpus),
             "span_days": (max(r.submit_s for r in rows) - min(r.submit_s for r in rows)) / 86400.0 if rows else 0.0,
             "flexible_jobs": sum(1 for j in jobs if j.flexible), "start_epoch_s": start_s}
    return jobs, facts


def shape_noise(spec: RunSpec) -> ShapeNoise:
    """The truth's per-config-shape factors of the spec (the same for every policy of a run)."""
    return ShapeNoise(spec.shape_sigma, spec.seed, spec.user_favour)


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

    spec = mixed_spec(spec)
    gpu = spec.gpu or get_gpu_type(DEFAULT_GPU_TYPE)
    truth = TruthModel(gpu, shape_noise(spec))
    jobs, facts = build_jobs(spec, CostModel(gpu))
    factors = dict(spec.partition_truth)
    unknown = sorted(set(factors) - {p.name for p in spec.partitions})
    if unknown:
        raise WorkloadError("--truth-partition-factor %s: no such --partition (known: %s)"
                            % (", ".join(unknown), ", ".join(p.name for p in spec.partitions)))
    truths = {p.name: TruthModel(p.gpu, shape_noise(spec), gpu_factor=factors.get(p.name, 1.0))
              for p in spec.partitions}
    if spec.partitions:
        jobs, unfit = assign_partitions(jobs, spec.partitions, spec.partition_flex, spec.seed)
        facts.update(jobs=len(jobs), dropped_oversized=facts["dropped_oversized"] + unfit,
                     flexible_jobs=sum(1 for j in jobs if j.flexible),
                     partitions=[p.text() for p in spec.partitions],
                     multi_partition_jobs=sum(1 for j in jobs if j.partitions))
    alone = alone_s(jobs, truth)
    cost = CostModel(gpu)
    estimator = Estimator(cost, spec.gpus_per_node,
                          planner=Planner(cost, spec.gpus_per_node, do_no_harm=spec.do_no_harm),
                          own_layout_first=spec.own_layout_first and spec.learn)
    settings = SimSettings(spec.gpus // spec.gpus_per_node, spec.gpus_per_node, tick_interval_s=spec.tick_interval_s,
                           ticks_on_events=spec.ticks_on_events, first_look_s=spec.first_look_s, slurm=spec.slurm,
                           partitions=spec.partitions)
    metrics, results = [], []
    calibrators: dict[str, Any] = {}
    for name in spec.policies:
        base = name.split(":")[0]
        knobs = {**PRESETS.get(name, {}), **spec.policy_knobs.get(name, {})}
        keeps_bound = "wait_bound_s" in knob_defaults(base)
        if keeps_bound:
            knobs.setdefault("wait_bound_s", spec.wait_bound_s)
        policy = get_policy(base, **knobs)
        store = store_for(name) if store_for else None
        if on_start is not None:
            on_start(name, len(jobs))
        tick_cb = (lambda now, rep, _n=name: on_tick(_n, now, rep)) if on_tick else None
        t0 = time.perf_counter()
        run_settings = replace(settings, allow_requeue=False) if name in spec.no_requeue else settings
        cal = learner(estimator, site_history(spec, name), min((j.submit_s for j in jobs), default=0.0),
                      spec.learn_report_s) if spec.learn else None
        if cal is not None:
            calibrators[name] = cal
        result = Simulation(jobs, policy, cal.estimator() if cal is not None else estimator, truth, run_settings,
                            store=store, on_tick=tick_cb, calibrator=cal, truths=truths).run()
        result.policy = name
        result.makespan_s = max(0.0, result.makespan_s - facts["start_epoch_s"])  # a duration, from time 0
        log.info("%s: %d jobs simulated in %.1f s", name, len(jobs), time.perf_counter() - t0)
        results.append(result)
        metrics.append(summarize(result, jobs, knobs.get("wait_bound_s", spec.wait_bound_s), alone))
        metrics[-1]["keeps_wait_bound"] = keeps_bound
        metrics[-1]["do_no_harm"] = layout_harm(result.records, jobs, truth, spec.gpus_per_node)
        if cal is not None:
            metrics[-1]["unseen_layouts"] = unseen_layout_errors(result.records, cal)
            metrics[-1]["seen_layouts"] = unseen_layout_errors(result.records, cal, seen=True)
    facts["lower_bound_mean_jct_s"] = lower_bound_s(jobs, estimator, truth, spec.gpus)
    compare_users(metrics)
    compare_resized(metrics, results)
    fifo = next((m for m in metrics if m["policy"] == "fifo"), None)
    facts["fifo_bound_kept"] = fifo["bound_kept"] if fifo else None
    changed = what_changed(jobs, results) if spec.history is not None else None
    return Comparison(spec, facts, metrics, results, jobs, changed, calibrators)


def site_history(spec: RunSpec, name: str) -> list[Any]:
    """What the site measured before the window (``learn_history_days``): the calibration's
    observations of policy ``name`` run, learning, on the trace's days before the window (as
    many as the trace has); none without, for a generated workload or a replayed history."""
    days = min(spec.learn_history_days, spec.start_day) if spec.workload and spec.history is None else 0.0
    if days <= 0 or not spec.learn:
        return []
    before = replace(spec, start_day=spec.start_day - days, window_days=days, policies=(name,), learn_history_days=0.0)
    try:
        return list(run_comparison(before).calibrators[name].observations)
    except WorkloadError:  # no job of the trace in those days
        return []


def mixed_spec(spec: RunSpec) -> RunSpec:
    """The spec with ``gpus``, ``gpus_per_node`` and ``gpu`` of its partitions (itself without)."""
    if not spec.partitions:
        return spec
    check_partitions(spec.partitions)
    return replace(spec, gpus=sum(p.gpus for p in spec.partitions), gpu=spec.partitions[0].gpu,
                   gpus_per_node=math.gcd(*(p.gpus_per_node for p in spec.partitions)))


def compare_users(metrics: list[dict[str, Any]], base: str = "slurm") -> None:
    """Set each policy's ``worst_user_vs_slurm`` (``metrics.worst_user`` against ``base``;
    None when ``base`` did not run or no user has enough jobs)."""
    ref = next((m for m in metrics if m["policy"] == base), None)
    for m in metrics:
        m["worst_user_vs_slurm"] = worst_user(m, ref) if ref is not None else None


def compare_resized(metrics: list[dict[str, Any]], results: list[SimResult], base: str = "slurm") -> None:
    """Set each policy's ``do_no_harm.resized_jct_vs_slurm`` (``harm.resized_jct``: its
    resized jobs' JCT over the same jobs' under ``base``; None when ``base`` did not run)."""
    ref = next((r for r in results if r.policy == base), None)
    by_id = {r.job_id: r for r in ref.records} if ref is not None else {}
    for m, result in zip(metrics, results):
        m["do_no_harm"]["resized_jct_vs_slurm"] = resized_jct(result.records, by_id)


def with_policies(spec: RunSpec, policies: Sequence[str]) -> RunSpec:
    return replace(spec, policies=tuple(policies))
