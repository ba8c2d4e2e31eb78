"""The controller's calibration step: after each tick, refit the per-class bias of the
run-time estimator from the jobs that finished, and hand the next tick the estimator
with the new bias; and correct each user's claims by how much longer their jobs ran than
predicted (``user_factors``: claims that lie cost the liar, not others). ``StoreCalibration`` learns from the history (what cron and the
daemon run); ``OnlineCalibration`` from a simulation's own records of finished jobs,
through ``core.calibration.OnlineCalibrator``. The controller calls either the same way
(``Controller.tick``), so cron and the simulator share the step and its timing: a refit
at the end of tick t applies from tick t+1 on.
"""

from __future__ import annotations

import dataclasses
import logging
import math
from typing import Any, Callable, Iterable, Mapping, Optional, Sequence

from pipeswift_slurm.core.calibration import Observation, OnlineCalibrator, fit_bias, lookup_bias
from pipeswift_slurm.core.estimator import Estimator
from pipeswift_slurm.core.site_model import SiteModel, SiteModelError
from pipeswift_slurm.core.site_model import read as read_site_model
from pipeswift_slurm.core.site_model import write as write_site_model

log = logging.getLogger(__name__)

# The per-user correction of claims: the mean excess log(actual / calibrated prediction)
# of a user's finished jobs, over (their count + USER_PRIOR_JOBS): one job cannot condemn a
# user (an honest job that ran 3x its prediction gives (3 / 1.25)^(1/3) = 1.34), many can.
USER_PRIOR_JOBS = 2
# A run up to this much longer than its calibrated prediction counts as honest (the cost
# model's own per-job error): an honest user's noise would otherwise add up to a factor.
USER_TOLERANCE = 1.25
USER_FACTOR_MAX = 1000.0  # the job's own time limit caps the prediction well before this


def user_factors(runs: Iterable[tuple[str, str, float, float]], bias: Mapping[str, float]) -> dict[str, float]:
    """Per user, the factor (>= 1) their jobs' predicted run times are multiplied by, from
    their finished jobs (user, job_class, uncalibrated predicted s, actual s).

    Each job counts by how much longer it ran than its class-calibrated prediction (the
    class bias, the cost model's error for every user's jobs of that class, is taken out
    first), never by how much shorter: a job ends early for many reasons (it failed, its
    user cancelled it, it converged), and a user who could earn a factor below 1, or
    dilute their record, with jobs that claim long runs and end at once (cheap: they are
    ranked as long jobs only while they wait) would win back the advantage the correction
    takes. So a job that ended before its prediction / ``USER_TOLERANCE`` is no evidence
    (left out), one within ``USER_TOLERANCE`` of it counts as honest (0), one longer by its
    excess log ratio; the factor is never below 1. Shrunk toward 1 with few jobs: the mean
    over (jobs + ``USER_PRIOR_JOBS``); at most ``USER_FACTOR_MAX``.
    """
    excess: dict[str, list[float]] = {}
    for user, job_class, predicted_s, run_s in runs:
        calibrated = predicted_s * (lookup_bias(bias, job_class) if bias else 1.0)
        if not user or not calibrated > 0 or not run_s >= 0 or not math.isfinite(calibrated * run_s):
            continue
        log_ratio = math.log(max(run_s, 1e-9) / calibrated)
        if log_ratio >= -math.log(USER_TOLERANCE):
            excess.setdefault(user, []).append(max(0.0, log_ratio - math.log(USER_TOLERANCE)))
    return {user: min(USER_FACTOR_MAX, math.exp(sum(xs) / (len(xs) + USER_PRIOR_JOBS)))
            for user, xs in excess.items() if sum(xs) > 0}


def user_factor_of(calibration: Any, user: str) -> float:
    """``calibration``'s correction of ``user``'s claims; 1 with no calibration at all."""
    return float(calibration.user_factor(user)) if calibration is not None else 1.0


class StoreCalibration:
    """Refit from the store's finished jobs, save the fit there, and use the stored bias.

    Only jobs whose run says something true about the cost model are learned from: a
    job recorded with ``calibration_skip`` (it ran a config the controller cannot know:
    ``slurm/recording.py``) is left out, and so is every job of an excluded partition.
    Why partitions: an emulated run (``pipeswift-launch --emulate``) sleeps a fraction of
    the prediction, and nothing the controller can trust tells it so (the launcher only
    sees the user's side, and whatever it could write there a user could write too). The
    site knows where it runs emulations: its test partitions, listed in ``[calibration]
    exclude_partitions``; on a test cluster that only emulates, ``[controller] calibrate
    = false`` turns the step off.

    A finished job whose launcher measured its iteration time (``[calibration]
    measure_dir``, ``slurm/measured.py``) is learned from by that measurement, with the
    layout that ran, so the layout terms are fitted too; others by their elapsed time, when
    it is within ``measured.MEASURE_BOUND`` of the prediction (a run that ended at once or
    ran far past its claim says more about its user than about the model: the per-user
    correction weighs it). Either way one user's runs weigh at most
    ``layout_fit.USER_CAP_RUNS`` in each term.

    After each refit the bias map is published for the jobs' side, when a file is set
    (``[calibration] publish_file``, ``core/site_model.py``): the launcher's own plan (a job
    without a decision) and ``psbatch --pipeswift=check`` then weigh what the site measured.

    Args:
        store: a ``store.history.Store`` (``finished_jobs``, ``save_calibration``,
            ``calibration``, ``measurements``, ``save_measurement``).
        exclude_partitions: partitions whose jobs never feed calibration.
        measure_dir: the spool folder the launchers report to ('' = none read).
        publish_file: where to publish the site model ('' = nowhere).
        site: the rest of the site model (GPU types, hardware file).
    """

    def __init__(self, store: Any, exclude_partitions: Sequence[str] = (), measure_dir: str = "",
                 publish_file: str = "", site: SiteModel = SiteModel()):
        self.store = store
        self.exclude_partitions = frozenset(exclude_partitions)
        self.measure_dir = measure_dir
        self.publish_file = publish_file
        self.site = site
        self._user_factors: Optional[dict[str, float]] = None

    def publish(self, bias: Mapping[str, float], now: float) -> None:
        """Write the site model with ``bias`` to ``publish_file`` unless the file already
        holds it (compared with the file itself: a cron tick is a new process); a failure is
        logged and tried again next tick, never raised: the launchers then plan with what
        the file held before, or the cost model alone."""
        if not self.publish_file:
            return
        wanted = dataclasses.replace(self.site, bias=dict(bias), written_at=0.0)
        try:
            if dataclasses.replace(read_site_model(self.publish_file), written_at=0.0) == wanted:
                return
        except SiteModelError:
            pass  # none yet, or not one: write it
        try:
            write_site_model(self.publish_file, dataclasses.replace(wanted, written_at=now))
        except OSError as exc:
            log.warning("cannot publish the site model to %s (%s); the launchers keep the last one",
                        self.publish_file, exc.strerror or exc)

    def measured(self, jobs: Iterable[Any], profile_of: Callable[[Any], Any],
                 iter_time_s: Callable[[Any, Any], float], now: float) -> None:
        """Record the launchers' reports of ``jobs`` (``slurm/measured.py``), if a folder is set."""
        if self.measure_dir:
            from pipeswift_slurm.slurm.measured import ingest

            try:
                ingest(self.measure_dir, [j for j in jobs if j.partition not in self.exclude_partitions], profile_of,
                       iter_time_s, self.store)
            except (ArithmeticError, TypeError, ValueError) as exc:  # what users wrote must not stop the tick
                log.error("the launchers' reports were not taken in this tick (%s: %s); the tick goes on",
                          type(exc).__name__, exc)

    def user_factor(self, user: str) -> float:
        """The per-user correction of ``user``'s claims (``user_factors``; 1 for a user
        without evidence), read from the history on first use and after every refit."""
        if self._user_factors is None:
            from pipeswift_slurm.store.reads import finished_user_runs

            bias = self.bias_map()
            self._user_factors = user_factors(
                ((r.user, r.job_class or "", r.predicted_run_s, r.run_s) for r in finished_user_runs(self.store)
                 if r.partition not in self.exclude_partitions), bias)
        return self._user_factors.get(user, 1.0)

    def learns_from(self, job: Any) -> bool:
        """Whether a finished job (``store.queries.FinishedJob``) may feed calibration."""
        return bool(job.job_class and job.predicted_run_s and job.run_s and not job.calibration_skip
                    and job.partition not in self.exclude_partitions)

    def bias_map(self) -> dict[str, float]:
        """The stored bias per job class (actual / predicted run time)."""
        return {cls: ratio for cls, (ratio, _n) in self.store.calibration().items()}

    def refit(self, now: float, estimator: Estimator) -> Estimator:
        """Refit the per-class bias from finished jobs; the estimator with the stored bias."""
        from pipeswift_slurm.store.queries import CalibrationEntry

        from pipeswift_slurm.slurm.measured import observation, within_bound, within_elapsed

        measured = {m.job_id: m for m in self.store.measurements()} if self.measure_dir else {}
        obs = []
        for f in self.store.finished_jobs():
            if self.learns_from(f):
                m = measured.get(f.job_id)
                if m is not None and m.status == "ok" and not within_elapsed(m, f.run_s):
                    self.store.save_measurements([dataclasses.replace(m, status="exceeds elapsed")])
                got = observation(f, m)
                if got is None and within_bound(f.predicted_run_s, f.run_s):  # Slurm's elapsed time
                    got = Observation(f.job_class, f.predicted_run_s, f.run_s, f.end_time, f.user)
                if got is not None:
                    obs.append(got)
        fitted = fit_bias(obs, now=now)
        self.store.save_calibration([CalibrationEntry(c.job_class, c.n_jobs, c.log_ratio, now)
                                     for c in fitted.values()])
        bias = self.bias_map()
        self._user_factors = None  # refit from the new bias on next use
        self.publish(bias, now)
        return estimator if bias == estimator.bias_by_class else estimator.with_bias(bias)


class OnlineCalibration:
    """Learn online from a simulation's job records as they finish (``OnlineCalibrator``).

    Args:
        calibrator: the online calibrator (its fit and observations stay readable).
        records: returns the simulation's records so far (job id -> record with
            ``end_s``); only records not yet finished are scanned again.
    """

    def __init__(self, calibrator: OnlineCalibrator, records: Callable[[], dict[int, Any]]):
        self.calibrator = calibrator
        self.records = records
        self._unfinished: dict[int, Any] = {}
        self._known = 0

    def _finished(self, now: float) -> Iterable[Any]:
        records = self.records()
        if len(records) != self._known:
            self._unfinished.update((k, r) for k, r in records.items() if k not in self.calibrator.seen)
            self._known = len(records)
        done = [r for r in self._unfinished.values() if self.calibrator.reported(r, now)]
        for record in done:
            del self._unfinished[record.job_id]
        return done

    def user_factor(self, user: str) -> float:
        """1: a simulation's users claim what their jobs run (its truth is set per class)."""
        return 1.0

    def measured(self, jobs: Iterable[Any], profile_of: Callable[[Any], Any],
                 iter_time_s: Callable[[Any, Any], float], now: float) -> None:
        """Nothing: a simulated job's layout reaches the calibrator with its record."""

    def refit(self, now: float, estimator: Estimator) -> Estimator:
        """Observe the jobs finished by ``now``; the calibrator's new estimator after a refit."""
        if self.calibrator.update(self._finished(now), now):
            return self.calibrator.estimator()  # type: ignore[no-any-return]
        return estimator
