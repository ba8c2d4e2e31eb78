"""``slurm``: what sites run today. It moves no lever; Slurm's multifactor priority
(age) and EASY backfill from the users' time limits decide, with the users' configs."""

from __future__ import annotations

from typing import Any, ClassVar, Mapping

from pipeswift_slurm.core.model import ClusterView, Decision, JobProfile


class SlurmPolicy:
    name: ClassVar[str] = "slurm"
    scheduler: ClassVar[str] = "backfill"
    preempts: ClassVar[bool] = False

    def decide(self, view: ClusterView, profiles: Mapping[int, JobProfile], estimator: Any) -> list[Decision]:
        return []
