"""The controller's calibration step: after each tick, refit the per-class bias of the
run-time estimator from the jobs that finished, and hand the next tick the estimator
with the new bias. ``StoreCalibration`` learns from the history (what cron and the
daemon run); ``OnlineCalibration`` from a simulation's own records of finished jobs,
through ``core.calibration.OnlineCalibrator``. The controller calls either the same way
(``Controller.tick``), so cron and the simulator share the step and its timing: a refit
at the end of tick t applies from tick t+1 on.
"""

from __future__ import annotations

from typing import Any, Callable, Iterable, Sequence

from pipeswift_slurm.core.calibration import Observation, OnlineCalibrator, fit_bias
from pipeswift_slurm.core.estimator import Estimator


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

    Args:
        store: a ``store.history.Store`` (``finished_jobs``, ``save_calibration``,
            ``calibration``).
        exclude_partitions: partitions whose jobs never feed calibration.
    """

    def __init__(self, store: Any, exclude_partitions: Sequence[str] = ()):
        self.store = store
        self.exclude_partitions = frozenset(exclude_partitions)

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

        obs = [Observation(f.job_class, f.predicted_run_s, f.run_s, f.end_time) for f in self.store.finished_jobs()
               if self.learns_from(f)]
        fitted = fit_bias(obs, now=now)
        self.store.save_calibration([CalibrationEntry(c.job_class, c.n_jobs, c.log_ratio, now)
                                     for c in fitted.values()])
        bias = self.bias_map()
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
        done = [r for r in self._unfinished.values() if r.end_s is not None and r.end_s <= now]
        for record in done:
            del self._unfinished[record.job_id]
        return done

    def refit(self, now: float, estimator: Estimator) -> Estimator:
        """Observe the jobs finished by ``now``; the calibrator's new estimator after a refit."""
        if self.calibrator.update(self._finished(now), now):
            return self.calibrator.estimator()  # type: ignore[no-any-return]
        return estimator
