"""Calibration: the bias of the cost model per job class, learned from finished jobs.

Ordering jobs needs only relative accuracy, but a systematic bias for one kind of model
gives all its jobs false priority (DESIGN section 1 point 5). This module fits, per job
class, the ratio actual / predicted run time from finished jobs, robustly (decayed,
trimmed, shrunk toward 1 while evidence is thin), and turns it into the bias map that
``Estimator.with_bias`` takes. ``OnlineCalibrator`` does the same online in the
simulator, from jobs as they finish (the controller's calibration step drives it:
``slurm/calibrate.py``). Pure: no I/O, no SQLAlchemy, no wall clock; the
Store (or the simulator) passes observations in and ``now`` explicitly.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from typing import Any, Iterable, Mapping, Optional, Sequence

from pipeswift_slurm.core.layout_fit import (DEFAULT_FEATURE_PRIOR_JOBS, fit_feature_terms, layout_factor,
                                            layout_features, user_capped)

log = logging.getLogger(__name__)

DEFAULT_HALF_LIFE_S = 14 * 86400.0
DEFAULT_TRIM = 0.2
DEFAULT_PRIOR_JOBS = 5.0
FAMILY_SUFFIX = "-*"


@dataclass(frozen=True)
class Observation:
    """One finished job: what the cost model predicted and what really happened.

    ``predicted_run_s`` must be the UNCALIBRATED prediction (cost model only) of the
    config the job ran with; ``actual_run_s`` the run time it took (one uninterrupted
    run); ``end_time`` when it finished, in seconds on the same clock as ``now``
    (epoch seconds from the Store, simulation seconds in the simulator).
    """

    job_class: str
    predicted_run_s: float
    actual_run_s: float
    end_time: float
    user: str = ""  # '' = unknown: not capped (``layout_fit.user_capped``)
    features: tuple[tuple[str, int], ...] = ()  # the layout that ran, when known (layout terms)


@dataclass(frozen=True)
class ClassBias:
    """Fitted bias of one job class (or of a model family, key ``<family>-*``).

    ``ratio`` = exp(``log_ratio``) is what the estimator multiplies the cost model by.
    ``raw_log_ratio`` is the robust estimate before shrinkage, ``prior_log_ratio`` the
    value it was shrunk toward (0, or the family's estimate from sibling classes),
    ``n_jobs`` the valid observations, ``n_eff`` their decayed weight sum, and
    ``confidence`` = n_eff / (n_eff + prior_jobs) in [0, 1).
    """

    job_class: str
    ratio: float
    log_ratio: float
    n_jobs: int
    confidence: float
    n_eff: float = 0.0
    raw_log_ratio: float = 0.0
    prior_log_ratio: float = 0.0


def family_of(job_class: str) -> str:
    """Model family of a job class: the part before the size bucket ("-<" or "->").

    ``"gpt-swiglu-gqa-<80B"`` -> ``"gpt-swiglu-gqa"``; a user-given class without a
    bucket is its own family.
    """
    cuts = [i for i in (job_class.find("-<"), job_class.find("->")) if i >= 0]
    return job_class[:min(cuts)] if cuts else job_class


def family_key(family: str) -> str:
    """Key of a family's own entry in a fit / bias map (cannot collide with a class)."""
    return family + FAMILY_SUFFIX


def _is_valid(obs: Observation) -> bool:
    try:
        values = (float(obs.predicted_run_s), float(obs.actual_run_s), float(obs.end_time))
    except (TypeError, ValueError):
        return False
    if not all(math.isfinite(v) for v in values):
        return False
    return values[0] > 0 and values[1] > 0 and bool(obs.job_class)


def valid_observations(observations: Iterable[Observation]) -> tuple[list[Observation], int]:
    """Split out unusable observations: zero/negative/NaN/inf times or an empty class.

    Returns:
        (the valid observations in input order, how many were skipped).
    """
    kept, skipped = [], 0
    for obs in observations:
        if _is_valid(obs):
            kept.append(obs)
        else:
            skipped += 1
    return kept, skipped


def decay_weight(age_s: float, half_life_s: float) -> float:
    """w = 2 ** (-max(age_s, 0) / half_life_s); 1 for every age when half_life_s is inf."""
    if math.isinf(half_life_s):
        return 1.0
    return float(0.5 ** (max(age_s, 0.0) / half_life_s))


def trimmed_mean(values: Sequence[float], weights: Sequence[float], trim: float) -> float:
    """Weighted trimmed mean: the mean of the middle (1 - 2 trim) of the weight mass.

    With x sorted ascending, cumulative weights C_i (C_0 = 0) and total W, each x_i keeps
    k_i = max(0, min(C_i, (1 - trim) W) - max(C_{i-1}, trim W)), and the estimate is
    sum(k_i x_i) / sum(k_i). trim = 0 is the weighted mean; trim -> 0.5 the weighted
    median. A share of outliers below ``trim`` of the weight cannot move it beyond the
    range of the other values.

    Raises:
        ValueError: empty input, non-positive total weight, or trim outside [0, 0.5).
    """
    if not 0.0 <= trim < 0.5:
        raise ValueError("trim must be in [0, 0.5), got %r" % trim)
    pairs = sorted(zip(values, weights))
    total = sum(w for _, w in pairs)
    if not pairs or total <= 0:
        raise ValueError("trimmed_mean needs values with a positive total weight")
    lo, hi = trim * total, (1.0 - trim) * total
    acc = num = den = 0.0
    for x, w in pairs:
        kept = max(0.0, min(acc + w, hi) - max(acc, lo))
        num += kept * x
        den += kept
        acc += w
    return num / den


@dataclass(frozen=True)
class _Estimate:
    raw: float
    n_jobs: int
    n_eff: float


def _estimate(obs: Sequence[Observation], now: float, half_life_s: float, trim: float) -> Optional[_Estimate]:
    if not obs:
        return None
    logs = [math.log(o.actual_run_s / o.predicted_run_s) for o in obs]
    weights = user_capped([o.user for o in obs], [decay_weight(now - o.end_time, half_life_s) for o in obs])
    n_eff = sum(weights)
    if n_eff <= 0:  # every observation decayed to 0 (underflow): no evidence left
        return None
    return _Estimate(trimmed_mean(logs, weights, trim), len(obs), n_eff)


def _shrunk(key: str, est: _Estimate, prior_log: float, prior_jobs: float) -> ClassBias:
    confidence = est.n_eff / (est.n_eff + prior_jobs)
    log_ratio = confidence * est.raw + (1.0 - confidence) * prior_log
    return ClassBias(key, math.exp(log_ratio), log_ratio, est.n_jobs, confidence, est.n_eff, est.raw, prior_log)


def _check_knobs(half_life_s: float, trim: float, prior_jobs: float) -> None:
    if not half_life_s > 0:
        raise ValueError("half_life_s must be > 0 (math.inf for no decay), got %r" % half_life_s)
    if not 0.0 <= trim < 0.5:
        raise ValueError("trim must be in [0, 0.5), got %r" % trim)
    if not prior_jobs >= 0:
        raise ValueError("prior_jobs must be >= 0, got %r" % prior_jobs)


def fit_bias(observations: Iterable[Observation], *, now: float, half_life_s: float = DEFAULT_HALF_LIFE_S,
             trim: float = DEFAULT_TRIM, prior_jobs: float = DEFAULT_PRIOR_JOBS) -> dict[str, ClassBias]:
    """Fit the run-time bias of every job class seen, and of every model family.

    Per class c with valid observations i (x_i = log(actual_i / predicted_i)):
      w_i   = 2 ** (-(now - end_time_i) / half_life_s)        decay: recent jobs count more
      m_c   = weighted trimmed mean of x_i, ``trim`` of the weight cut at each tail
      n_eff = sum(w_i)                                        decayed job count
      conf  = n_eff / (n_eff + prior_jobs)                    grows with the number of jobs
      log_ratio_c = conf * m_c + (1 - conf) * prior_c,  ratio_c = exp(log_ratio_c)
    The prior (family fallback): prior_c is the shrunk estimate of the OTHER classes of
    c's family pooled (same formula, shrunk toward 0), or 0 when c has no siblings with
    data; so a class with 1-2 jobs barely moves from what its family shows. Each family F
    also gets an entry ``F-*`` (all its classes pooled, shrunk toward 0) for classes not
    seen yet. The trimmed mean of logs ignores a share of outliers below ``trim`` and
    treats x1.3 and /1.3 symmetrically; the median (trim -> 0.5) is more robust but
    noisier. Within each estimate a user's observations weigh at most
    ``layout_fit.USER_CAP_RUNS`` runs (one user cannot carry a class). Observations that
    carry the layout that ran (``features``) then fit the layout terms, keyed
    ``"<class> tp=4"`` (``layout_fit.fit_feature_terms``).

    Args:
        observations: finished jobs; invalid ones (zero/negative/NaN times, empty class)
            are skipped and counted in a log message.
        now: the time weights are measured from, seconds on the observations' clock.
        half_life_s: age at which an observation counts half (math.inf: no decay).
        trim: weight share cut at each tail, in [0, 0.5).
        prior_jobs: pseudo-jobs at the prior; confidence is 0.5 at this many jobs.

    Returns:
        Map from job_class (and ``family_key(family)``) to ClassBias.

    Raises:
        ValueError: a knob out of range.
    """
    _check_knobs(half_life_s, trim, prior_jobs)
    kept, skipped = valid_observations(observations)
    if skipped:
        log.warning("calibration: skipped %d invalid observation(s) of %d", skipped, skipped + len(kept))
    by_class: dict[str, list[Observation]] = {}
    for obs in kept:
        by_class.setdefault(obs.job_class, []).append(obs)
    families: dict[str, list[str]] = {}
    for job_class in by_class:
        families.setdefault(family_of(job_class), []).append(job_class)
    fit: dict[str, ClassBias] = {}
    for family, classes in sorted(families.items()):
        _fit_family(fit, family, classes, by_class, (now, half_life_s, trim, prior_jobs))
    rows = [(o.job_class, o.user, o.features, math.log(o.actual_run_s / o.predicted_run_s),
             decay_weight(now - o.end_time, half_life_s)) for o in kept if o.features]
    class_log = {k: cb.log_ratio for k, cb in fit.items()}
    for key, (log_ratio, n, n_eff) in fit_feature_terms(rows, class_log).items():
        confidence = n_eff / (n_eff + DEFAULT_FEATURE_PRIOR_JOBS)
        fit[key] = ClassBias(key, math.exp(log_ratio), log_ratio, n, confidence, n_eff, log_ratio)
    return fit


def _fit_family(fit: dict[str, ClassBias], family: str, classes: list[str],
                by_class: Mapping[str, list[Observation]], knobs: tuple[float, float, float, float]) -> None:
    now, half_life_s, trim, prior_jobs = knobs
    pooled = _estimate([o for c in classes for o in by_class[c]], now, half_life_s, trim)
    if pooled is not None:
        fit[family_key(family)] = _shrunk(family_key(family), pooled, 0.0, prior_jobs)
    for job_class in sorted(classes):
        own = _estimate(by_class[job_class], now, half_life_s, trim)
        if own is None:
            continue
        siblings = _estimate([o for c in classes if c != job_class for o in by_class[c]], now, half_life_s, trim)
        prior_log = _shrunk(family_key(family), siblings, 0.0, prior_jobs).log_ratio if siblings else 0.0
        fit[job_class] = _shrunk(job_class, own, prior_log, prior_jobs)


def bias_map(fit: Mapping[str, ClassBias]) -> dict[str, float]:
    """Map from job_class (and ``family_key(family)``) to ratio: what ``Estimator.with_bias`` takes."""
    return {key: cb.ratio for key, cb in fit.items()}


def lookup_bias(bias: Mapping[str, float], job_class: str, config: Any = None, requested: Any = None) -> float:
    """The ratio for ``job_class``: its own entry, else its family's, else 1; times the
    class's layout terms for ``config`` (of a job that asked for ``requested``) when given
    (``layout_fit.layout_factor``)."""
    ratio = bias[job_class] if job_class in bias else bias.get(family_key(family_of(job_class)), 1.0)
    return ratio * layout_factor(bias, job_class, config, requested) if config is not None else ratio


def report_rows(fit: Mapping[str, ClassBias]) -> list[dict[str, Any]]:
    """Rows for the admin report "estimator bias per job class" (classes, then families)."""
    keys = sorted(fit, key=lambda k: (k.endswith(FAMILY_SUFFIX), k))
    return [{"job_class": k, "ratio": fit[k].ratio, "bias_pct": 100.0 * (fit[k].ratio - 1.0),
             "n_jobs": fit[k].n_jobs, "n_eff": fit[k].n_eff, "confidence": fit[k].confidence,
             "raw_ratio": math.exp(fit[k].raw_log_ratio)} for k in keys]


class OnlineCalibrator:
    """Learns the bias online from jobs as they finish (the simulator's calibration).

    Only FINISHED jobs are learned from: a record counts once its ``end_s`` is set and
    not after ``now``; running jobs' true run times are never read. The un-calibration
    subtlety: ``JobRecord.predicted_run_s`` was made by the estimator in force when the
    job started, which may already carry a bias b; the fit must see the cost model's own
    prediction, predicted_run_s / b, or it would chase its own corrections. The
    calibrator keeps the estimators it handed out with the time they were installed and
    divides by ``estimator.bias(job_class)`` of the one in force at the job's start (an
    estimator installed at tick t applies to jobs started after t: the controller refits
    at the end of a tick, and the simulator predicts the run time of a job started right
    after that tick with the estimator the tick decided with).

    Args:
        base_estimator: the uncalibrated Estimator (anything with ``with_bias``,
            ``bias`` and ``bias_by_class``); its own bias map is kept for classes the
            fit has not seen.
        refit_every: refit after this many newly finished jobs.
        half_life_s, trim, prior_jobs: the knobs of ``fit_bias``.
        layouts: learn the layout terms too (``simulate --learn``): each finished job
            reports the layout it ran, as the launcher does (``submit/iterlog.py``).
        report_s: when set, a job is learned from this long after its run started, while
            it runs, as the launcher's iteration-time report reaches a live controller
            (its run's true time, which the simulator knows at the start); None: when it
            finishes, from its elapsed time.
    """

    def __init__(self, base_estimator: Any, *, refit_every: int = 5, half_life_s: float = DEFAULT_HALF_LIFE_S,
                 trim: float = DEFAULT_TRIM, prior_jobs: float = DEFAULT_PRIOR_JOBS, layouts: bool = False,
                 report_s: Optional[float] = None):
        if refit_every < 1:
            raise ValueError("refit_every must be >= 1")
        _check_knobs(half_life_s, trim, prior_jobs)
        self.base = base_estimator
        self.refit_every = refit_every
        self.layouts = layouts
        self.report_s = report_s
        self.knobs = {"half_life_s": half_life_s, "trim": trim, "prior_jobs": prior_jobs}
        self.observations: list[Observation] = []
        self.fit: dict[str, ClassBias] = {}
        self.skipped = 0
        self.refits = 0
        self._seen: set[int] = set()
        self._since_fit = 0
        self._current = base_estimator
        self._installed: list[tuple[float, Any]] = [(-math.inf, base_estimator)]

    def bias_in_force(self, job_class: str, start_s: float, config: Any = None, requested: Any = None) -> float:
        """Bias the installed estimator applied to a job of ``job_class`` started at
        ``start_s`` (with ``config``'s layout terms when given, for a job that asked for
        ``requested``)."""
        estimator = self.base
        for installed_s, est in self._installed:
            if installed_s < start_s:
                estimator = est
        return float(estimator.bias(job_class, config, requested) if config is not None else estimator.bias(job_class))

    def observe(self, record: Any, bias_used: Optional[float] = None) -> bool:
        """Learn from one finished JobRecord, or with ``report_s`` a running one (once per
        job); False when not usable.

        Skipped: unfinished records (without ``report_s``), jobs that were requeued (their last run covered only
        the remaining iterations, while predicted_run_s is a fresh start's), and invalid
        times. ``bias_used`` overrides the bias looked up from the install history.
        """
        if not self.reported(record, math.inf) or record.job_id in self._seen:
            return False
        self._seen.add(record.job_id)
        if record.restarts:
            self.skipped += 1
            return False
        config = getattr(record, "config", None) if self.layouts else None
        requested = getattr(record, "requested", None)
        bias = bias_used if bias_used is not None else self.bias_in_force(record.job_class, record.run_started_s,
                                                                          config, requested)
        finished = record.end_s is not None
        obs = Observation(record.job_class, record.predicted_run_s / bias if bias > 0 else float("nan"),
                          record.end_s - record.run_started_s if finished else record.run_true_s,
                          record.end_s if finished else record.run_started_s + self.report_s,
                          getattr(record, "user", ""), layout_features(config, requested) if config is not None else ())
        if not _is_valid(obs):
            self.skipped += 1
            return False
        self.observations.append(obs)
        self._since_fit += 1
        return True

    def reported(self, record: Any, now: float) -> bool:
        """Whether ``record`` can be learned from by ``now``: it finished, or (``report_s``)
        its first run has run that long."""
        if record.end_s is not None:
            return bool(record.end_s <= now)
        return self.report_s is not None and not record.restarts and getattr(record, "run_true_s", 0.0) > 0 \
            and record.run_started_s + self.report_s <= now

    def refit(self, now: float) -> dict[str, ClassBias]:
        """Fit on every observation so far; the next ``estimator()`` uses it from ``now`` on."""
        self.fit = fit_bias(self.observations, now=now, **self.knobs)
        self._current = self.base.with_bias({**self.base.bias_by_class, **bias_map(self.fit)})
        self._installed.append((now, self._current))
        self._since_fit = 0
        self.refits += 1
        log.debug("calibration refit at %.0f s on %d jobs: %s", now, len(self.observations), bias_map(self.fit))
        return self.fit

    @property
    def seen(self) -> frozenset[int]:
        """Ids of the jobs already observed (each is learned from once)."""
        return frozenset(self._seen)

    def estimator(self) -> Any:
        """The estimator of the latest fit (the base one before any fit); install it right after ``refit``."""
        return self._current

    def update(self, records: Iterable[Any], now: float) -> bool:
        """Observe newly finished records (end_s <= now); refit every ``refit_every``. True when refitted."""
        for record in records:
            if record.job_id not in self._seen and self.reported(record, now):
                self.observe(record)
        if self._since_fit >= self.refit_every:
            self.refit(now)
            return True
        return False
