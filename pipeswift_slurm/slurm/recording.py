"""Record one controller tick in the Store, in one transaction: the snapshot (jobs, state
transitions, occupancy), jobs that left unseen, new or changed profile requests, the
uncalibrated run-time prediction of every running opted-in job (what calibration
compares the actual run time with), and the decisions with their outcome.
Imported only when a Store is in use (it pulls in SQLAlchemy through the store)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Mapping, Optional

from pipeswift_slurm.core.estimator import Estimator
from pipeswift_slurm.core.model import JobProfile
from pipeswift_slurm.policy import Policy
from pipeswift_slurm.policy.common import current_config
from pipeswift_slurm.slurm.seams import HistoryStore

if TYPE_CHECKING:
    from pipeswift_slurm.slurm.controller import TickReport


def record_tick(store: HistoryStore, report: "TickReport", profiles: Mapping[int, JobProfile],
                parsed: Mapping[int, tuple[str, Optional[JobProfile], str]], policy: Policy, estimator: Estimator,
                dry_run: bool) -> None:
    """Write ``report`` (a controller TickReport) into ``store`` as one tick."""
    view = report.view
    with store.tick(view.now, policy.name, dry_run) as tx:
        summary = tx.save_snapshot(view)
        if summary.vanished:
            tx.mark_vanished(summary.vanished, view.now)
        known = tx.profile_texts(list(parsed))
        tx.upsert_profiles([(job_id, text, profile, why or None) for job_id, (text, profile, why) in parsed.items()
                            if known.get(job_id) != text])
        predicted = {}
        for job in view.running:
            profile = profiles.get(job.job_id)
            if profile is not None:
                predicted[job.job_id] = estimator.cost.job_time_s(profile, current_config(job, profile))
        if predicted:
            tx.set_predicted_runs(predicted)
        applied: dict[int, Optional[bool]] = {j: True for j in report.applied}
        errors = dict(report.errors)
        applied.update({j: False for j in errors})
        tx.record_decisions(report.decisions, applied, errors)
        tx.finish(status="failed" if report.failed else "ok", error=report.failed, duration_s=report.duration_s)
