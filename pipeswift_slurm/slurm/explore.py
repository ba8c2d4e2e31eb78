"""Exploration holds: while a class has no measured run in a layout pipeswift chose, at most
one of its jobs bets on one at a time (``[calibration] own_layout_first``; the rule is
``layout_fit.exploration_holds``). The controller marks the other pending jobs of such a class
``keep_layout`` before the policy decides, so every policy and the launcher (which follows
the decision) keep their users' layouts. Pure: changes nothing but the profiles it returns."""

from __future__ import annotations

from dataclasses import replace
from typing import Any, Mapping, Sequence

from pipeswift_slurm.core.layout_fit import exploration_holds
from pipeswift_slurm.core.megatron_rules import same_layout
from pipeswift_slurm.core.model import Job, JobProfile


def with_exploration_holds(estimator: Any, jobs: Sequence[Job], profiles: Mapping[int, JobProfile],
                           runnable: dict[int, JobProfile]) -> dict[int, JobProfile]:
    """``runnable`` with ``keep_layout`` set on the pending jobs the rule holds, when the
    estimator plans with ``own_layout_first``; ``profiles`` are those of every managed job
    (running ones tell which classes have a relaid run in flight)."""
    if not getattr(estimator, "own_layout_first", False):
        return runnable
    rows = []
    for job in sorted(jobs, key=lambda j: (j.submit_time, j.job_id)):
        profile = profiles.get(job.job_id)
        if profile is None or not (job.pending or job.running):
            continue
        relaid = job.running and job.config is not None and not same_layout(job.config, profile.requested)
        rows.append((job.job_id, profile.job_class, job.running, relaid))
    held = exploration_holds(estimator.bias_by_class, rows)
    return {job_id: replace(p, keep_layout=True) if job_id in held else p for job_id, p in runnable.items()}
