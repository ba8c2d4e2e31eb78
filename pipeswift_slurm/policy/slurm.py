"""``slurm``: what sites run today. It moves no lever; Slurm's multifactor priority and
its backfill, as the site configures them (the simulator's SchedulingSettings), decide,
with the users' configs."""

from __future__ import annotations

from typing import ClassVar, Mapping

from pipeswift_slurm.core.estimator import EstimatorProtocol
from pipeswift_slurm.core.model import ClusterView, Decision, JobProfile
from pipeswift_slurm.policy.knobs import NoKnobs


class SlurmPolicy:
    name: ClassVar[str] = "slurm"
    scheduler: ClassVar[str] = "backfill"
    preempts: ClassVar[bool] = False
    site_factor_max: ClassVar[int] = 0  # it sets no SiteFactor

    def __init__(self, knobs: NoKnobs = NoKnobs()):
        self.knobs = knobs

    def decide(self, view: ClusterView, profiles: Mapping[int, JobProfile], estimator: EstimatorProtocol) -> list[Decision]:
        return []
