"""``fifo``: strict first-come-first-served with the user's configs. It moves no lever;
Slurm's builtin scheduler (no backfill) and the age factor give the order."""

from __future__ import annotations

from typing import ClassVar, Mapping

from pipeswift_slurm.core.estimator import EstimatorProtocol
from pipeswift_slurm.core.model import ClusterView, Decision, JobProfile
from pipeswift_slurm.policy.knobs import NoKnobs


class FifoPolicy:
    name: ClassVar[str] = "fifo"
    scheduler: ClassVar[str] = "builtin"
    preempts: ClassVar[bool] = False
    site_factor_max: ClassVar[int] = 0  # it sets no SiteFactor

    def __init__(self, knobs: NoKnobs = NoKnobs()):
        self.knobs = knobs

    def decide(self, view: ClusterView, profiles: Mapping[int, JobProfile], estimator: EstimatorProtocol) -> list[Decision]:
        return []
