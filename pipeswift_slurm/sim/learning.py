"""``simulate --learn``: the controller's calibration with layout terms, online, where each
finished job reports the layout it ran (the simulated launcher), and the figure of issue
25's goal: how far off the predictions of unseen layouts are once their class has 20
finished runs (with and without the learned corrections). Pure."""

from __future__ import annotations

import statistics
from dataclasses import replace
from typing import Any, Optional, Sequence

from pipeswift_slurm.core.calibration import Observation, OnlineCalibrator
from pipeswift_slurm.sim.truth import shape_key

RUNS_BEFORE = 20


def learner(estimator: Any, history: Sequence[Observation] = (), start_s: float = 0.0,
            report_s: Optional[float] = None) -> OnlineCalibrator:
    """The online calibrator of ``--learn`` (layout terms on, refit every 5 jobs learned
    from; ``report_s``: a job is learned from that long after it started, as the launcher's
    report reaches a live controller, else when it finishes); with ``history``
    (``runner.site_history``: what the site measured before the window, in that run's own
    times), fitted on it before ``start_s``, the history's last end moved to ``start_s``, so
    the window starts with what the site had learned."""
    cal = OnlineCalibrator(estimator, layouts=True, report_s=report_s)
    if history:
        shift_s = start_s - max(obs.end_time for obs in history)
        cal.observations.extend(replace(obs, end_time=obs.end_time + shift_s) for obs in history)
        cal.refit(start_s - 1.0)
    return cal


def unseen_layout_errors(records: list[Any], calibrator: OnlineCalibrator,
                         seen: bool = False) -> Optional[dict[str, float]]:
    """Median and 90th percentile |actual / predicted - 1| of the jobs that started once their
    class had ``RUNS_BEFORE`` finished runs, in a layout shape no finished run of the class
    had used (``seen``: one that some had): with the learned corrections (as predicted) and
    without (the cost model)."""
    done = sorted((r for r in records if r.end_s is not None and r.config is not None and not r.restarts),
                  key=lambda r: r.run_started_s)
    learned, model = [], []
    for rec in done:
        before = [r for r in done if r.job_class == rec.job_class and r.end_s <= rec.run_started_s]
        if len(before) < RUNS_BEFORE or (shape_key(rec.config) in {shape_key(r.config) for r in before}) != seen:
            continue
        actual = rec.end_s - rec.run_started_s
        bias = calibrator.bias_in_force(rec.job_class, rec.run_started_s, rec.config, rec.requested)
        learned.append(abs(actual / rec.predicted_run_s - 1.0))
        model.append(abs(actual / (rec.predicted_run_s / bias) - 1.0))
    if not learned:
        return None

    def p90(xs: list[float]) -> float:
        return sorted(xs)[min(len(xs) - 1, int(round(0.9 * (len(xs) - 1))))]

    return {"jobs": len(learned), "median_learned": statistics.median(learned), "p90_learned": p90(learned),
            "median_model": statistics.median(model), "p90_model": p90(model)}
