"""Estimator: the cost model corrected by a per-job-class bias (and per-layout terms) learned
from finished jobs.

Every policy sees run times only through an Estimator, so calibration reaches all of them
at once. The bias map (job_class -> actual/predicted ratio) comes from the Store in the
controller and from online learning in the simulator; ``calibration.py`` computes it.
Pure: no I/O, apart from ``job_side_estimator`` reading the hardware file and the site
model the environment names.
"""

from __future__ import annotations

import logging
import time
from typing import Any, Hashable, Mapping, Optional, Protocol

from pipeswift_slurm.core.calibration import lookup_bias
from pipeswift_slurm.core.costmodel import CostModel, Estimate
from pipeswift_slurm.core.layout_fit import (is_feature_key, layout_factor, measured_factor, own_layout_measured,
                                             unmeasured_factor)
from pipeswift_slurm.core.model import ExecConfig, JobProfile
from pipeswift_slurm.core.planner import LayoutFactor, Planner

log = logging.getLogger(__name__)


class EstimatorProtocol(Protocol):
    """What a policy asks of an estimator (``Estimator`` is the one implementation; tests
    and benches may pass others): predicted run times, and the config to run per GPU count
    (``best``: the planner's ``choose``, the fastest unless the user's layout is within
    the error band), and the GPU counts a policy may choose (``option``: ``Planner.offer``)."""

    def startup_s(self, profile: JobProfile) -> float: ...

    def run_time_s(self, profile: JobProfile, config: ExecConfig, iterations: Optional[int] = None) -> float: ...

    def best(self, profile: JobProfile, gpus: int) -> Optional[Estimate]: ...

    def best_run_time_s(self, profile: JobProfile, gpus: int) -> Optional[tuple[ExecConfig, float]]: ...

    def option(self, profile: JobProfile, gpus: int) -> Optional[tuple[ExecConfig, float]]: ...

    def option_run_times_s(self, profile: JobProfile, lo: int, hi: int) -> list[tuple[int, ExecConfig, float]]: ...

    def option_run_times_key(self, profile: JobProfile, lo: int, hi: int) -> Hashable: ...


class Estimator:
    """Predicted run times of jobs in given configs, and best configs per GPU count.

    Args:
        cost: cost model for the cluster's GPU type.
        gpus_per_node: GPUs per node.
        bias: map from job_class to the ratio actual/predicted run time (1 = unbiased).
        planner: share a planner (and its cache) with another estimator.
        own_layout_first: bet against no user's layout of a class before a run in one was
            measured (``[calibration] own_layout_first``; ``layout_factor``).
        explores: with ``own_layout_first``, bet on layouts the site has not measured (the
            controller, which lets one job of a class at a time do so, ``slurm/explore.py``);
            False where the jobs in flight are not known (the launcher and psbatch: only the
            controller explores).
    """

    def __init__(self, cost: CostModel, gpus_per_node: int,
                 bias: Optional[Mapping[str, float]] = None, planner: Optional[Planner] = None,
                 own_layout_first: bool = False, explores: bool = True):
        self.cost = cost
        self.gpus_per_node = gpus_per_node
        self.bias_by_class = dict(bias or {})
        self.planner = planner or Planner(cost, gpus_per_node)
        self.own_layout_first = own_layout_first
        self.explores = explores
        # classes with learned layout terms: their do-no-harm weighs the corrected times
        self._layout_classes = frozenset(k.rpartition(" ")[0] for k in self.bias_by_class if is_feature_key(k))

    def with_bias(self, bias: Mapping[str, float]) -> "Estimator":
        """A copy with another bias map, sharing the planner cache."""
        return Estimator(self.cost, self.gpus_per_node, bias, self.planner, self.own_layout_first, self.explores)

    def with_gpus_per_node(self, gpus_per_node: int) -> "Estimator":
        """A copy that plans for nodes of ``gpus_per_node`` GPUs (a new planner: configs,
        and so its cache, depend on the node size); itself when that is its node size."""
        if gpus_per_node == self.gpus_per_node:
            return self
        return self.for_hardware(self.cost, gpus_per_node)

    def for_hardware(self, cost: CostModel, gpus_per_node: int) -> "Estimator":
        """A copy for another GPU type (``cost``) and node size, with the same bias map and
        planner settings and a planner of its own (a partition of other GPUs)."""
        planner = Planner(cost, gpus_per_node, vary_tp=self.planner.vary_tp, max_vp=self.planner.max_vp,
                          do_no_harm=self.planner.do_no_harm)
        return Estimator(cost, gpus_per_node, self.bias_by_class, planner, self.own_layout_first, self.explores)

    def bias(self, job_class: str, config: Optional[ExecConfig] = None,
             requested: Optional[ExecConfig] = None) -> float:
        """actual/predicted ratio for the class, else its model family's, else 1; times the
        class's learned layout terms for ``config`` of a job that asked for ``requested``
        when given (``core/layout_fit.py``)."""
        if not self.bias_by_class:
            return 1.0
        return lookup_bias(self.bias_by_class, job_class, config, requested)

    def startup_s(self, profile: JobProfile) -> float:
        return self.cost.startup_s(profile)

    def run_time_s(self, profile: JobProfile, config: ExecConfig, iterations: Optional[int] = None) -> float:
        """Predicted run time (startup + iterations x iteration time) x the class bias x the
        job's own ``run_time_factor``."""
        return self.cost.job_time_s(profile, config, iterations) \
            * self.bias(profile.job_class, config, profile.requested) * profile.run_time_factor

    def layout_factor(self, profile: JobProfile) -> LayoutFactor:
        """What the site's runs taught about the layouts of ``profile``'s class (its learned
        layout terms, ``layout_fit.layout_factor``), for the planner's do-no-harm rule;
        None when the class has none. With ``own_layout_first``, a class none of whose runs in
        a user's own layout was measured keeps its users' layouts (``unmeasured_factor``); a
        job the controller holds (``JobProfile.known_layouts_only``), and any job where the
        estimator does not explore, runs only layouts the site measured (``measured_factor``)."""
        if self.own_layout_first and not own_layout_measured(self.bias_by_class, profile.job_class):
            return unmeasured_factor(profile.requested)
        if profile.known_layouts_only or (self.own_layout_first and not self.explores):
            return measured_factor(self.bias_by_class, profile.job_class, profile.requested)
        if profile.job_class not in self._layout_classes:
            return None
        bias, job_class, requested = self.bias_by_class, profile.job_class, profile.requested
        return lambda config: layout_factor(bias, job_class, config, requested)

    def best(self, profile: JobProfile, gpus: int) -> Optional[Estimate]:
        """The config to run on ``gpus`` GPUs (None when none is valid): the fastest, unless
        the user's own layout is within the error band (``Planner.choose``, weighing what
        the site learned of both layouts). The policies and the launcher both ask this, so
        they choose alike."""
        return self.planner.choose(profile, gpus, self.layout_factor(profile))

    def fastest(self, profile: JobProfile, gpus: int) -> Optional[Estimate]:
        """The fastest valid config on ``gpus`` GPUs, whatever the user's layout."""
        return self.planner.best(profile, gpus)

    def best_run_time_s(self, profile: JobProfile, gpus: int) -> Optional[tuple[ExecConfig, float]]:
        """(config, predicted run time) of the config to run on ``gpus`` GPUs (``best``)."""
        return self._with_run_time_s(profile, self.best(profile, gpus))

    def option(self, profile: JobProfile, gpus: int) -> Optional[tuple[ExecConfig, float]]:
        """``best_run_time_s`` on a GPU count a policy may choose for the job, None on one
        that enters only through a layout change the band does not back (``Planner.offer``)."""
        return self._with_run_time_s(profile, self.planner.offer(profile, gpus, self.layout_factor(profile)))

    def option_run_times_s(self, profile: JobProfile, lo: int, hi: int) -> list[tuple[int, ExecConfig, float]]:
        """(GPU count, config, predicted run time) of ``option`` for every count from ``lo``
        to ``hi`` that offers one, ascending: one search per shape and range
        (``Planner.offers``), shared by all the jobs of that shape."""
        startup_s = self.cost.startup_s(profile)
        return [(gpus, est.config, self._run_s(profile, est, startup_s))
                for gpus, est in self.planner.offers(profile, lo, hi, self.layout_factor(profile))]

    def option_run_times_key(self, profile: JobProfile, lo: int, hi: int) -> Hashable:
        """Equal for profiles that get equal ``option_run_times_s(profile, lo, hi)`` here:
        one search (``Planner.offers_key``), length, class, run-time factor, layout kept."""
        return (self.planner.offers_key(profile, lo, hi), profile.plan.iterations, profile.job_class,
                profile.run_time_factor, profile.known_layouts_only)

    def _with_run_time_s(self, profile: JobProfile, est: Optional[Estimate]) -> Optional[tuple[ExecConfig, float]]:
        return None if est is None else (est.config, self._run_s(profile, est, self.cost.startup_s(profile)))

    def _run_s(self, profile: JobProfile, est: Estimate, startup_s: float) -> float:
        return (startup_s + profile.plan.iterations * est.iter_time_s) \
            * self.bias(profile.job_class, est.config, profile.requested) * profile.run_time_factor


def job_side_estimator(env: Mapping[str, str], gpus_per_node: int, learned: bool = True) -> tuple[Estimator, str]:
    """(Estimator, what it rests on, in words) where no controller config is at hand: inside
    a job (the launcher) and on a submit host (``psbatch --pipeswift=check``).

    The site model ``$PIPESWIFT_SITE_MODEL`` names (``core/site_model.py``, published by
    the controller), when set and readable, gives the bias map the controller plans with
    (unless ``learned`` is False: an emulated run must not sleep what calibration learned
    from emulated runs) and the GPU type of the job's partition (``$SLURM_JOB_PARTITION``,
    where the site model names one). Otherwise the type is ``$PIPESWIFT_GPU_TYPE``, else the
    site model's, else the default; the hardware table ``$PIPESWIFT_HARDWARE``, else the site
    model's; the site model's layer profile where it was measured on that type. An unusable
file or an unknown type logs one warning and falls back."""
    from pipeswift_slurm.core import site_model
    from pipeswift_slurm.core.hardware import DEFAULT_GPU_TYPE, HardwareError, get_gpu_type

    published, problem = site_model.from_env(env)
    if problem:
        log.warning("%s", problem)
    site = published or site_model.SiteModel()  # an empty one names nothing
    name = site.partition_gpu_types.get(env.get("SLURM_JOB_PARTITION", ""), "") or env.get("PIPESWIFT_GPU_TYPE") \
        or site.gpu_type or DEFAULT_GPU_TYPE
    hardware = env.get("PIPESWIFT_HARDWARE") or site.hardware_file or None
    try:
        gpu = get_gpu_type(name, hardware)
    except HardwareError as exc:
        log.warning("%s; using %s", exc, DEFAULT_GPU_TYPE)
        gpu = get_gpu_type(DEFAULT_GPU_TYPE)
    cost = CostModel(gpu, layer_profile=_site_layer_profile(site.layer_profile, gpu.name))
    if published is None or not learned:
        return Estimator(cost, gpus_per_node), "the cost model alone"
    written = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(site.written_at))
    return Estimator(cost, gpus_per_node, site.bias, own_layout_first=site.own_layout_first, explores=False), \
        "the site model of %s" % written


def _site_layer_profile(path: str, gpu_name: str) -> Any:
    """The site model's layer profile where it was measured on ``gpu_name`` (the controller
    plans that GPU type with it), else None; a file that cannot be read logs one warning."""
    if not path:
        return None
    from pipeswift_slurm.core.layer_profile import profile_for_gpu
    from pipeswift_slurm.core.profile_file import ProfileFormatError, read_profile_toml

    try:
        loaded = read_profile_toml(path)
    except ProfileFormatError as exc:
        log.warning("the site model's layer profile: %s; using the GPU table", exc)
        return None
    return profile_for_gpu(loaded, gpu_name)
