"""Mixed clusters: partitions of different GPU types, planned one by one, and the
partition each pending job that allows several goes to.

A site whose partitions hold different GPUs (A100 nodes in one, H100 nodes in another)
gives each partition an estimator of its own (its GPU type and node size). Each tick:

1. Where each pending job goes (``choose_partitions``). A job runs in one partition: the
   one Slurm shows for it, or, for a job that allows several (Slurm's ``-p a,b``, or a
   profile request's ``parts=``, among the partitions planned here), the one where it is
   predicted to finish first. Jobs are placed in Slurm's priority order (the order the
   policy set last tick) on a free-GPU timeline per partition, built from the running
   jobs' predicted ends: a job bound to one partition takes its GPUs there from its
   earliest start; a job that allows several is tried in each, at every GPU count it
   allows, and goes where its predicted end is earliest (list scheduling by earliest
   finish). A job already in one partition moves only when that cuts its predicted time
   to finish by more than ``MOVE_GAIN`` (predictions err by about that much; a move that
   gains less is churn). Only the first ``MAX_PLACED`` jobs are placed, as Slurm's
   backfill tests only so many: the rest stay where they are.
2. The policy plans each partition on its own (``decide_by_partition``): its nodes, the
   running jobs on them, the pending jobs bound for it, its estimator. The policy's
   decisions for a job that moves also carry ``Decision.partition``.
Only a policy whose ``moves_partitions`` is true moves jobs (the baselines keep every job
where it was submitted, as the sites they stand for do); every policy is planned per
partition. A node in several planned partitions belongs to the first of them (in the
order given) that lists it, so no GPU is counted twice. Pure; knows no policy names.
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any, Iterable, Mapping, Optional, Sequence

from pipeswift_slurm.core.estimator import EstimatorProtocol
from pipeswift_slurm.core.model import ClusterView, Decision, Job, JobProfile, Node
from pipeswift_slurm.policy.common import Timeline, job_options, predicted_end_s, priority_order

MOVE_GAIN = 0.1  # a job moves between partitions only to cut its predicted time to finish by more than this share
MAX_PLACED = 200  # jobs placed on the partitions' timelines per tick, in priority order
_UNKNOWN_RUN_S = 365 * 86400.0  # a job with neither a profile nor a time limit: "very long"


def job_partitions(job: Job, profile: Optional[JobProfile], planned: Sequence[str],
                   gres_types: Optional[Mapping[str, str]] = None) -> tuple[str, ...]:
    """The planned partitions a job may run in, in ``planned``'s order: those Slurm shows
    for it (``a,b`` for a job pending in several) and those its profile request allows;
    for a job that asks for a GPU type (``gpu:a100:4``), only those whose nodes report that
    type (``gres_types``, ``partition_gres_types``: the user asked for that hardware, and
    Slurm leaves a retyped pending job never runnable) besides the one it is in. Empty when
    none of them is planned here."""
    wanted = set(p for p in job.partition.split(",") if p)
    if profile is not None:
        wanted.update(profile.partitions)
    asked = job.gpu_request.gpu_type
    if asked and gres_types is not None:
        wanted = {p for p in wanted if gres_types.get(p) == asked or p == job.partition}
    return tuple(p for p in planned if p in wanted)


def partition_gres_types(nodes: Iterable[Node]) -> dict[str, str]:
    """Map from partition name to the GRES type its nodes report, for the partitions whose
    typed GPU nodes all report one type (a partition with none, or with several, is left
    out: a typed request cannot be moved there by type)."""
    types: dict[str, set[str]] = {}
    for node in nodes:
        if node.gpu_type:
            for partition in node.partitions:
                types.setdefault(partition, set()).add(node.gpu_type)
    return {partition: next(iter(names)) for partition, names in types.items() if len(names) == 1}


def node_owners(view: ClusterView, planned: Sequence[str]) -> dict[str, str]:
    """Node name -> the first planned partition that lists it (nodes in none: absent)."""
    owners: dict[str, str] = {}
    for node in view.nodes:
        for name in planned:
            if name in node.partitions:
                owners[node.name] = name
                break
    return owners


def _running_partition(job: Job, owners: Mapping[str, str], planned: Sequence[str]) -> Optional[str]:
    """Where a running job runs: its first node's partition, else the first planned one
    Slurm names for it."""
    for node in job.node_list:
        if node in owners:
            return owners[node]
    return next((p for p in job.partition.split(",") if p in planned), None)


def _pending_partition(job: Job, profile: Optional[JobProfile], planned: Sequence[str]) -> Optional[str]:
    """Where a pending job is now: the one partition Slurm shows, or the first planned of several."""
    own = [p for p in job.partition.split(",") if p in planned]
    if own:
        return own[0]
    allowed = job_partitions(job, profile, planned)
    return allowed[0] if allowed else None


class _Partition:
    """One partition's free-GPU timeline while jobs are placed."""

    def __init__(self, view: ClusterView, nodes: Sequence[Any], running: Sequence[Job],
                 profiles: Mapping[int, JobProfile], estimator: EstimatorProtocol):
        self.estimator = estimator
        self.gpus = sum(n.gpus for n in nodes if n.usable)
        self.nodes = sum(1 for n in nodes if n.usable)
        self.timeline = Timeline(view.now, sum(n.gpus_free for n in nodes),
                                 [(predicted_end_s(j, profiles, estimator, view.now), j.gpus) for j in running])

    def run_s(self, job: Job, profile: Optional[JobProfile]) -> float:
        """The job's predicted run at its current size here (its time limit without a profile)."""
        if profile is not None:
            best = self.estimator.best_run_time_s(profile, job.gpus)
            if best is not None:
                return best[1]
        return float(job.time_limit_s or _UNKNOWN_RUN_S)

    def earliest_end(self, profile: JobProfile) -> tuple[float, int, float]:
        """(predicted end, GPUs, run seconds) of the job's earliest-ending option here."""
        best = (math.inf, 0, 0.0)
        for option in job_options(profile, self.estimator, self.gpus, self.nodes):
            start = self.timeline.earliest(option.gpus, option.run_s)
            if start + option.run_s < best[0]:
                best = (start + option.run_s, option.gpus, option.run_s)
        return best

    def take(self, gpus: int, run_s: float, start: Optional[float] = None) -> None:
        """Mark ``gpus`` busy for ``run_s`` from ``start`` (None: the earliest they are free)."""
        start = self.timeline.earliest(gpus, run_s) if start is None else start
        if start < math.inf:
            self.timeline.take(start, start + run_s, gpus)


def choose_partitions(view: ClusterView, profiles: Mapping[int, JobProfile],
                      estimators: Mapping[str, EstimatorProtocol], moves: bool) -> dict[int, str]:
    """Pending job id -> the planned partition it goes to (module docstring, step 1);
    jobs in no planned partition are absent."""
    planned = list(estimators)
    where = {j.job_id: p for j in view.pending
             if (p := _pending_partition(j, profiles.get(j.job_id), planned)) is not None}
    gres_types = partition_gres_types(view.nodes)
    choosers = [j for j in view.pending if j.job_id in profiles
                and len(job_partitions(j, profiles[j.job_id], planned, gres_types)) > 1]
    if not moves or not choosers:
        return where
    owners = node_owners(view, planned)
    running: dict[str, list[Job]] = {p: [] for p in planned}
    for job in view.running:
        ran_in = _running_partition(job, owners, planned)
        if ran_in is not None:
            running[ran_in].append(job)
    parts = {p: _Partition(view, [n for n in view.nodes if owners.get(n.name) == p], running[p], profiles,
                           estimators[p]) for p in planned}
    for job in priority_order(view, [j for j in view.pending if j.job_id in where])[:MAX_PLACED]:
        profile = profiles.get(job.job_id)
        allowed = job_partitions(job, profile, planned, gres_types)
        if profile is None or len(allowed) < 2:
            home = parts[where[job.job_id]]
            home.take(job.gpus, home.run_s(job, profile))
            continue
        ends = {p: parts[p].earliest_end(profile) for p in allowed}
        best = min(allowed, key=lambda p: (ends[p][0], allowed.index(p)))
        now_in = job.partition if job.partition in allowed else None  # one partition now: moving has a price
        if now_in is not None and best != now_in:
            stay_s, move_s = ends[now_in][0] - view.now, ends[best][0] - view.now
            if not move_s < stay_s * (1.0 - MOVE_GAIN):
                best = now_in
        where[job.job_id] = best
        end_s, gpus, run_s = ends[best]
        parts[best].take(gpus, run_s, end_s - run_s)  # (its start, found above: not searched again)
    return where


def partition_views(view: ClusterView, where: Mapping[int, str], planned: Sequence[str],
                    profiles: Mapping[int, JobProfile]) -> dict[str, ClusterView]:
    """One view per planned partition: its nodes, the running jobs on them and the pending
    jobs bound for it (each shown in that one partition)."""
    owners = node_owners(view, planned)
    nodes: dict[str, list[Any]] = {p: [] for p in planned}
    for node in view.nodes:
        if node.name in owners:
            nodes[owners[node.name]].append(node)
    jobs: dict[str, list[Job]] = {p: [] for p in planned}
    for job in view.jobs:
        if job.pending:
            part = where.get(job.job_id)
            if part is not None:
                jobs[part].append(job if job.partition == part else replace(job, partition=part))
        elif job.running:
            part = _running_partition(job, owners, planned)
            if part is not None:
                jobs[part].append(job)
    return {p: ClusterView(now=view.now, nodes=tuple(nodes[p]), jobs=tuple(jobs[p])) for p in planned}


def decide_by_partition(policy: Any, view: ClusterView, profiles: Mapping[int, JobProfile],
                        estimators: Mapping[str, EstimatorProtocol]) -> list[Decision]:
    """The policy's decisions, partition by partition (module docstring); a pending job
    bound for another partition than Slurm shows gets ``partition`` set."""
    planned = list(estimators)
    moves = bool(getattr(policy, "moves_partitions", False))
    where = choose_partitions(view, profiles, estimators, moves)
    decisions: list[Decision] = []
    for name, sub in partition_views(view, where, planned, profiles).items():
        ids = {j.job_id for j in sub.jobs}
        decisions += policy.decide(sub, {i: p for i, p in profiles.items() if i in ids}, estimators[name])
    moved = {j.job_id: where[j.job_id] for j in view.pending
             if moves and j.job_id in where and j.job_id in profiles and j.partition != where[j.job_id]}
    if not moved:
        return decisions
    out = []
    for decision in decisions:
        if decision.job_id in moved and not decision.requeue:
            part = moved.pop(decision.job_id)
            decision = replace(decision, partition=part, reason="%s; in partition %s" % (decision.reason, part))
        out.append(decision)
    out += [Decision(job_id, partition=part, reason="moved to partition %s: predicted to finish there first" % part)
            for job_id, part in moved.items()]
    return out
