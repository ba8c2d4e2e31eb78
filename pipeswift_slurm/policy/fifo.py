"""``fifo``: strict first-come-first-served with the user's configs. It moves no lever;
Slurm's builtin scheduler (no backfill) and the age factor give the order."""

from __future__ import annotations

from typing import Any, ClassVar, Mapping

from pipeswift_slurm.core.model import ClusterView, Decision, JobProfile


class FifoPolicy:
    name: ClassVar[str] = "fifo"
    scheduler: ClassVar[str] = "builtin"
    preempts: ClassVar[bool] = False

    def decide(self, view: ClusterView, profiles: Mapping[int, JobProfile], estimator: Any) -> list[Decision]:
        return []
