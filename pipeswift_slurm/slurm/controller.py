"""The controller tick: observe -> ingest -> decide -> act -> record.

One function serves cron, the daemon and the simulator; only the backend (real Slurm or
the in-memory one), the clock and where calibration learns from differ. A tick ends with
the calibration step (``slurm/calibrate.py``), so a refit applies from the next tick on;
a tick that cannot observe the cluster is recorded as failed. Rules it enforces whatever the policy says:
only opted-in jobs are touched; running jobs are never resized (only requeued, and only
when the site allows it); a decision equal to what the job already has is not re-issued
(idempotent ticks); the profile a user put in the job is parsed with bounded effort and
re-validated, never executed or trusted. Must not import SQLAlchemy at module level (the
Store is passed in) and never contains policy names.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Mapping, Optional

from pipeswift_slurm.core.estimator import Estimator
from pipeswift_slurm.core.megatron import MegatronArgError
from pipeswift_slurm.core.model import ClusterView, Decision, Job, JobProfile, SiteCaps
from pipeswift_slurm.core.request import submitted_profile
from pipeswift_slurm.core.token import TokenError, decode_profile, submitted_gpus
from pipeswift_slurm.policy import Policy, wait_bound_of
from pipeswift_slurm.slurm.backends import Backend, BackendError, JobGone, OutcomeUnknown
from pipeswift_slurm.slurm.calibrate import user_factor_of
from pipeswift_slurm.slurm.decision_diff import evolve_decision, intent_outcome, unchanged_parts
from pipeswift_slurm.slurm.explore import with_exploration_holds
from pipeswift_slurm.slurm.factors import stable_factors
from pipeswift_slurm.slurm.holds import first_looks_to_clear, not_runnable, own_holds_to_release, warn_first_looks_kept
from pipeswift_slurm.slurm.limits import gpu_cap, within_site_limits, within_time_limit
from pipeswift_slurm.slurm.seams import BatchingBackend, Calibration, HistoryStore
from pipeswift_slurm.slurm.wait_bound import over_wait_bound

log = logging.getLogger(__name__)


@dataclass
class TickReport:
    """What one tick saw and did."""

    view: ClusterView
    decisions: list[Decision] = field(default_factory=list)
    applied: list[int] = field(default_factory=list)
    skipped: list[tuple[int, str]] = field(default_factory=list)
    errors: list[tuple[int, str]] = field(default_factory=list)
    unknown: list[tuple[int, str]] = field(default_factory=list)  # Slurm did not say (timed out)
    decide_s: float = 0.0
    duration_s: float = 0.0
    failed: Optional[str] = None
    over_wait_bound: list[int] = field(default_factory=list)  # runnable pending jobs queued past the bound


@dataclass(frozen=True)
class ControllerSettings:
    """Site settings the controller enforces (not policy knobs)."""

    dry_run: bool = False
    allow_requeue: bool = False
    partitions: tuple[str, ...] = ()
    gpus_per_node: int = 0  # 0: the cluster's own (Slurm's node records); else a cap on it
    warn_wait_bound: bool = True  # a WARNING line per tick with jobs past the policy's wait bound


def cluster_gpus_per_node(view: ClusterView, partitions: tuple[str, ...] = ()) -> int:
    """GPUs per node to plan with, from Slurm's node records: the fewest any usable GPU
    node of ``partitions`` (all when empty) has, so a shape planned fits on every node the
    job may get (heterogeneous partitions); 0 when no node reports GPUs."""
    nodes = [n for n in view.nodes if n.gpus > 0 and (not partitions or set(n.partitions) & set(partitions))]
    usable = [n.gpus for n in nodes if n.usable] or [n.gpus for n in nodes]
    return min(usable, default=0)


def parse_profile(job: Job, gpus_per_node: int, cluster_gpus: int) -> tuple[Optional[JobProfile], str]:
    """The JobProfile a job's Comment asks for, re-validated; (None, why) when unusable. The
    token is a request: its GPU range is clipped to the cluster, the Megatron arguments must
    pass the same checks as anywhere else, at the size the job was submitted with
    (``request.submitted_profile``); a token claiming another is refused."""
    try:
        return submitted_profile(decode_profile(job.comment), submitted_gpus(job.admin_comment, job.gpus),
                                 gpus_per_node=gpus_per_node, cluster_gpus=cluster_gpus), ""
    except (TokenError, MegatronArgError, ArithmeticError, RecursionError) as exc:
        # Requests are user text: whatever one holds, the job is left as submitted with the
        # reason, and every other job of the tick is handled as usual.
        return None, str(exc)[:500]


class Controller:
    """Runs ticks against one backend with one policy and estimator.

    Keeps parsed profiles between ticks (map from job_id to (comment, profile)), so a
    long-running controller or the simulator parses each job once; a cron tick starts
    empty and parses what it sees. ``calibration`` (None: none) ends every recorded tick
    that was not a dry run, and replaces ``estimator`` for the next one. With
    ``partition_costs`` (partition -> the cost model of its GPU type: a mixed cluster) each
    of those partitions is planned on its own (``policy/partitions.py``). ``clock`` times
    the tick; ``epoch_clock`` dates a tick that failed before it could see the cluster.
    """

    def __init__(self, backend: Backend, policy: Policy, estimator: Estimator, store: Optional[HistoryStore] = None,
                 settings: ControllerSettings = ControllerSettings(), *, clock: Callable[[], float] = time.monotonic,
                 calibration: Optional[Calibration] = None, partition_costs: Optional[Mapping[str, Any]] = None):
        self.backend = backend
        self.policy = policy
        self.estimator = estimator
        self.store = store
        self.settings = settings
        self.clock = clock
        self.epoch_clock: Callable[[], float] = time.time
        self.calibration = calibration
        self._profiles: dict[int, tuple[str, Optional[JobProfile], str]] = {}
        self._limited: dict[int, tuple[Any, ...]] = {}  # the inputs each cached profile was limited with
        self._caps: dict[int, SiteCaps] = {}  # the site's limits each cached profile was clipped to
        self.partition_costs = dict(partition_costs or {})  # partition -> CostModel of its GPUs (a mixed cluster)
        self._partition_estimators: dict[tuple[str, int], Estimator] = {}

    def _planning_gpus_per_node(self, view: ClusterView) -> int:
        """This tick's GPUs per node: the cluster's own (``cluster_gpus_per_node``), capped
        by the site's setting when it has one; the estimator plans with it from now on."""
        cluster = cluster_gpus_per_node(view, self.settings.partitions)
        fixed = self.settings.gpus_per_node
        had = getattr(self.estimator, "gpus_per_node", 0)
        gpn = min(fixed, cluster) if fixed and cluster else (fixed or cluster or had)
        if gpn != had and isinstance(self.estimator, Estimator):
            log.info("planning for %d GPUs per node (the estimator had %d)", gpn, had)
            self.estimator = self.estimator.with_gpus_per_node(gpn)
        return gpn

    def _ingest(self, view: ClusterView) -> dict[int, JobProfile]:
        gpn, total = self._planning_gpus_per_node(view), view.total_gpus
        profiles: dict[int, JobProfile] = {}
        live = set()
        for job in view.jobs:
            if not job.opted_in or not (job.pending or job.running) or (self.settings.partitions and not set(
                    job.partition.split(",")) & set(self.settings.partitions)):
                continue
            live.add(job.job_id)
            cached = self._profiles.get(job.job_id)
            if cached is None or cached[0] != job.comment or self._caps.get(job.job_id) != job.caps:
                self._caps[job.job_id] = job.caps
                profile, why = parse_profile(job, gpn, gpu_cap(job, gpn, total)) if job.gpus > 0 else (
                    None, "the job asks for no GPUs (never given any)")
                if profile is None:
                    log.warning("job %d: profile request ignored (job left as submitted): %s", job.job_id, why)
                cached = self._profiles[job.job_id] = (job.comment, profile, why)
            if cached[1] is not None:
                profiles[job.job_id] = self._within_time_limit(job, cached)
        for gone in set(self._profiles) - live:
            del self._profiles[gone]
            self._limited.pop(gone, None)
            self._caps.pop(gone, None)
        return profiles

    def _allowed(self, decision: Decision, job: Optional[Job], profiles: dict[int, JobProfile]) -> str:
        """Why a decision must not be acted on ('' when it may)."""
        if job is None:
            return "job no longer in the queue"
        if decision.job_id not in profiles:
            return "job is not opted in"
        if decision.requeue:
            return "" if (job.running and self.settings.allow_requeue) else "requeue not allowed"
        if not job.pending:
            return "job is %s, only PENDING jobs are changed" % job.state
        return ""

    def tick(self) -> TickReport:
        """One tick.

        Raises:
            BackendError: the cluster could not be observed (a failed tick row is recorded,
                nothing else), or it stopped answering while acting (acting stops, or with
                a batching backend the rest of the batch fails; what was applied, and the
                failures, are recorded so the database matches Slurm).
        """
        started = self.clock()
        try:
            snapshot = self.backend.snapshot()
        except BackendError as exc:
            self._record_failed(exc)
            raise
        view = self._with_history(snapshot)
        report = TickReport(view=view)
        profiles = self._ingest(view)
        by_id = {j.job_id: j for j in view.jobs}
        runnable = with_exploration_holds(self.estimator, view.jobs, profiles, {
            job_id: p for job_id, p in profiles.items() if not not_runnable(by_id[job_id], view.now)})
        report.over_wait_bound = over_wait_bound(view, runnable, wait_bound_of(self.policy),
                                                 self.settings.warn_wait_bound)
        t0 = self.clock()
        decisions = self._decide(view, runnable)
        report.decide_s = self.clock() - t0
        decisions = self._stable_order(decisions, by_id)
        todo_items: list[tuple[Decision, Job]] = []
        for decision in decisions:
            job = by_id.get(decision.job_id)
            why = self._allowed(decision, job, runnable)
            if why:
                report.skipped.append((decision.job_id, why))
                continue
            assert job is not None
            decision = self._within_site_limits(decision, job)
            todo = decision if decision.requeue else unchanged_parts(decision, job)
            if not todo.changes_anything:
                continue
            report.decisions.append(todo)
            todo_items.append((todo, job))
        releases = own_holds_to_release(view, {d.job_id for d, _ in todo_items}, runnable)
        releases += first_looks_to_clear(view, {d.job_id for d, _ in todo_items})
        report.decisions += [d for d, _ in releases]
        todo_items += releases
        intent_tick = self._record_intents(report, profiles, todo_items)
        self._act(todo_items, report)
        report.duration_s = self.clock() - started
        if intent_tick is not None:
            self._record_outcomes(intent_tick, report)
        elif self.store is not None:
            self._record(report, profiles)
        if report.failed is not None:
            raise BackendError(report.failed)
        if self.calibration is not None and not self.settings.dry_run:
            gpn, est = getattr(self.estimator, "gpus_per_node", 0), self.estimator  # the launchers' reports:
            getattr(self.calibration, "measured", lambda *a: None)(
                view.jobs, lambda j: profiles.get(j.job_id) or parse_profile(j, gpn, gpu_cap(j, gpn, view.total_gpus))[0],
                lambda p, c: est.cost.iter_time_s(p, c), view.now)
            self.estimator = self.calibration.refit(view.now, self.estimator)
        return report

    def _decide(self, view: ClusterView, runnable: dict[int, JobProfile]) -> list[Decision]:
        """The policy's decisions: on the whole cluster, or partition by partition on a
        mixed one, each with its own estimator (its GPU type, its nodes' size, this tick's
        bias map); a partition without GPU nodes, or whose nodes report another GRES type
        than the config's GPU type (``partition_check``: one WARNING each), is not planned."""
        if not self.partition_costs:
            return self.policy.decide(view, runnable, self.estimator)
        from pipeswift_slurm.policy.partitions import decide_by_partition
        from pipeswift_slurm.slurm.partition_check import gres_mismatches

        wrong = gres_mismatches(view, {name: cost.gpu.name for name, cost in self.partition_costs.items()})
        for why in wrong.values():
            log.warning("%s", why)
        estimators: dict[str, Any] = {}
        for name, cost in self.partition_costs.items():
            if name in wrong:
                continue
            gpn = cluster_gpus_per_node(view, (name,))
            gpn = min(gpn, self.settings.gpus_per_node or gpn)  # the site's cap, as for one cluster
            if not gpn:
                log.warning("partition %s: no GPU node in it; not planned this tick", name)
                continue
            est = self._partition_estimators.get((name, gpn))
            if est is None:
                est = self._partition_estimators[name, gpn] = self.estimator.for_hardware(cost, gpn)
            elif est.bias_by_class != self.estimator.bias_by_class:
                est = self._partition_estimators[name, gpn] = est.with_bias(self.estimator.bias_by_class)
            estimators[name] = est
        return decide_by_partition(self.policy, view, runnable, estimators)

    def _within_time_limit(self, job: Job, cached: tuple[str, Optional[JobProfile], str]) -> JobProfile:
        """The cached profile, its user's correction applied within the job's time limit (cached)."""
        assert cached[1] is not None
        factor = user_factor_of(self.calibration, job.user)
        inputs = (job.time_limit_s, job.gpus, job.config, factor)
        last = self._limited.get(job.job_id)
        if last is not None and last[0] is cached[1] and last[1] is self.estimator and last[2] == inputs:
            return cached[1]  # as at the last tick: nothing to redo for each of thousands queued
        profile = within_time_limit(cached[1], job, self.estimator, factor)
        if profile is not cached[1]:
            self._profiles[job.job_id] = (cached[0], profile, cached[2])
        self._limited[job.job_id] = (profile, self.estimator, inputs)
        return profile

    @staticmethod
    def _within_site_limits(decision: Decision, job: Job) -> Decision:
        """The decision within the job's partition, QOS and association limits (logged
        when that changed it)."""
        kept, why = within_site_limits(decision, job)
        if why:
            log.info("job %d: within the site's limits: %s", job.job_id, why)
        return kept

    def _record_failed(self, exc: BackendError) -> None:
        """A tick row with status failed, so the history (and ``pipeswift_last_tick_ok``)
        shows the tick that could not see the cluster. Never hides the backend's error: a
        store that cannot record it either is logged."""
        if self.store is None:
            return
        try:
            self.store.record_failed_tick(self.epoch_clock(), self.policy.name, self.settings.dry_run,
                                          "cannot observe the cluster: %s" % exc)
        except Exception as store_exc:  # the store's own failure must not replace the backend's
            log.warning("could not record the failed tick either: %s", store_exc)

    def _with_history(self, view: ClusterView) -> ClusterView:
        """The view with what live Slurm forgets and the history keeps. A requeued job's
        run time and first submit and eligible times: the policy then sees what the
        simulator shows it, the job's whole wait since its first submission less its
        earlier runs (``Job.queued_s``; a job requeued again and again still ages toward its
        wait bound), and the work it has left (``attained_gpu_s``). And a pending job's
        eligible time where Slurm restarted it (a release of the controller's hold, the end
        of psbatch's first look: ``rows.eligible_since``), so a job the controller held
        keeps its age. Jobs the backend already counts (the simulator's: it restarts
        neither) and jobs never stored are left as they are."""
        if self.store is None:
            return view
        wanted = [j for j in view.jobs if (j.restarts and not j.ran_s and not j.attained_gpu_s) or (
            j.pending and not j.restarts and j.eligible_time is not None and j.eligible_time > j.submit_time)]
        if not wanted:
            return view
        fields = self.store.history_fields(view.now, wanted)
        jobs = tuple(replace(j, **fields[j.job_id]) if fields.get(j.job_id) else j for j in view.jobs)
        return replace(view, jobs=jobs)

    def _stable_order(self, decisions: list[Decision], by_id: dict[int, Job]) -> list[Decision]:
        """Keep the order the policy's SiteFactors express, with as few changes to the
        pending jobs' current factors as possible (each change is an update in Slurm). On a
        mixed cluster, per partition (where each job goes): Slurm never weighs a job of one
        partition against one of another, so their relative order would only cost updates."""
        ranked = [(i, d) for i, d in enumerate(decisions) if d.site_factor is not None and not d.requeue
                  and d.job_id in by_id and by_id[d.job_id].pending]
        if not ranked:
            return decisions
        top = self.policy.site_factor_max or max(d.site_factor or 0 for _, d in ranked)
        groups: dict[str, list[tuple[int, Decision]]] = {}
        for item in ranked:
            where = item[1].partition or by_id[item[1].job_id].partition if self.partition_costs else ""
            groups.setdefault(where, []).append(item)
        factors: dict[int, int] = {}
        for group in groups.values():
            order = [d.job_id for _, d in sorted(group, key=lambda x: (-(x[1].site_factor or 0), x[0]))]
            current = {j: by_id[j].site_factor for j in order if by_id[j].site_factor > 0}
            factors.update(stable_factors(order, current, top))
        out = list(decisions)
        for i, d in ranked:
            out[i] = evolve_decision(d, site_factor=factors[d.job_id])
        return out

    def _act(self, items: list[tuple[Decision, Job]], report: TickReport) -> None:
        """Apply the decisions: all in one ``apply_many`` call when the backend batches,
        else one ``apply`` each, stopping at the first failure (slurmctld gone)."""
        if self.settings.dry_run:
            warn_first_looks_kept(report.view)
        if self.settings.dry_run or not items:
            return
        if isinstance(self.backend, BatchingBackend):
            for (decision, _), batch_outcome in zip(items, self.backend.apply_many(items), strict=True):
                self._outcome(decision.job_id, batch_outcome, report)
            return
        for decision, job in items:
            if report.failed is not None:
                break
            try:
                self.backend.apply(decision, job)
                outcome: Optional[BackendError] = None
            except BackendError as exc:
                outcome = exc
            self._outcome(decision.job_id, outcome, report)

    @staticmethod
    def _outcome(job_id: int, outcome: Optional[BackendError], report: TickReport) -> None:
        """None: applied; JobGone: skipped (logged); any other BackendError: an error, and
        the first one fails the tick."""
        if outcome is None:
            report.applied.append(job_id)
        elif isinstance(outcome, OutcomeUnknown):
            report.unknown.append((job_id, str(outcome)))
            if report.failed is None:
                report.failed = str(outcome)
        elif isinstance(outcome, JobGone):
            log.info("job %d skipped: %s", job_id, outcome)
            report.skipped.append((job_id, str(outcome)))
        else:
            report.errors.append((job_id, str(outcome)))
            if report.failed is None:
                report.failed = str(outcome)

    def _record(self, report: TickReport, profiles: dict[int, JobProfile], intents: bool = False) -> int:
        from pipeswift_slurm.slurm.recording import record_tick

        assert self.store is not None
        return record_tick(self.store, report, profiles, self._profiles, self.policy, self.estimator,
                           self.settings.dry_run, intents=intents,
                           settle=None if getattr(self.backend, "in_memory", False) else intent_outcome)

    def _record_intents(self, report: TickReport, profiles: dict[int, JobProfile],
                        items: list[tuple[Decision, Job]]) -> Optional[int]:
        """Before Slurm is changed: the tick with its decisions as intents (its id), so that
        no change is ever made that the history does not know of; None when nothing will
        be changed or nothing is recorded. A store that cannot be written fails the tick
        here, before any change."""
        if self.store is None or self.settings.dry_run or not items or getattr(self.backend, "in_memory", False):
            return None  # (an in-memory cluster dies with the tick: nothing to read back)
        return self._record(report, profiles, intents=True)

    def _record_outcomes(self, tick_id: int, report: TickReport) -> None:
        from pipeswift_slurm.slurm.recording import record_outcomes

        assert self.store is not None
        record_outcomes(self.store, tick_id, report)


def tick(backend: Backend, store: Optional[HistoryStore], policy: Policy, estimator: Estimator, *,
         dry_run: bool = False) -> TickReport:
    """One stateless tick (what cron runs): a fresh Controller, one observe-decide-act."""
    return Controller(backend, policy, estimator, store, ControllerSettings(dry_run=dry_run)).tick()
