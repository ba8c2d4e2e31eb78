"""Exploration holds: at most one job of a class at a time runs a layout the site has not
measured (``[calibration] own_layout_first``; the rule is ``layout_fit.exploration_holds``).
The controller marks the other pending jobs of the class ``known_layouts_only`` before the
policy decides, so every policy, and the launcher (which follows the decision), runs them in
their users' layouts or in ones already measured. Pure: returns profiles, changes nothing."""

from __future__ import annotations

from dataclasses import replace
from typing import Any, Mapping, Sequence

from pipeswift_slurm.core.layout_fit import exploration_holds, layout_measured
from pipeswift_slurm.core.model import Job, JobProfile


def with_exploration_holds(estimator: Any, jobs: Sequence[Job], profiles: Mapping[int, JobProfile],
                           runnable: dict[int, JobProfile]) -> dict[int, JobProfile]:
    """``runnable`` with ``known_layouts_only`` set on the pending jobs the rule holds, when
    the estimator plans with ``own_layout_first``; ``profiles`` are those of every managed
    job (running ones tell which classes have a run in an unmeasured layout in flight)."""
    if not getattr(estimator, "own_layout_first", False):
        return runnable
    bias, rows = estimator.bias_by_class, []
    for job in sorted(jobs, key=lambda j: (j.submit_time, j.job_id)):
        profile = profiles.get(job.job_id)
        if profile is None or not (job.pending or job.running):
            continue
        exploring = job.running and job.config is not None and not layout_measured(
            bias, profile.job_class, job.config, profile.requested)
        rows.append((job.job_id, profile.job_class, job.running, exploring))
    held = exploration_holds(rows)
    return {job_id: replace(p, known_layouts_only=True) if job_id in held else p for job_id, p in runnable.items()}
