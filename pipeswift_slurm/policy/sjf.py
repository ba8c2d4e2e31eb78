"""``sjf``: shortest predicted job first (Tiresias/Lucid-style with a known duration),
the users' configs, non-preemptive. Its only lever is the queue order (SiteFactor)."""

from __future__ import annotations

from typing import ClassVar, Mapping

from pipeswift_slurm.core.estimator import EstimatorProtocol
from pipeswift_slurm.core.model import ClusterView, Decision, JobProfile
from pipeswift_slurm.policy.common import rank_factors
from pipeswift_slurm.policy.knobs import SjfKnobs


class SjfPolicy:
    name: ClassVar[str] = "sjf"
    scheduler: ClassVar[str] = "backfill"
    preempts: ClassVar[bool] = False

    def __init__(self, knobs: SjfKnobs = SjfKnobs()):
        self.knobs = knobs

    @property
    def site_factor_max(self) -> int:
        return self.knobs.site_factor_max

    def decide(self, view: ClusterView, profiles: Mapping[int, JobProfile], estimator: EstimatorProtocol) -> list[Decision]:
        pending = [j for j in view.pending if j.job_id in profiles]
        keyed = sorted(pending, key=lambda j: (estimator.run_time_s(profiles[j.job_id], profiles[j.job_id].requested),
                                               j.submit_time, j.job_id))
        factors = rank_factors([j.job_id for j in keyed], self.site_factor_max)
        return [Decision(j.job_id, site_factor=factors[j.job_id], reason="shortest predicted run first")
                for j in keyed]
