"""What-if on a site's own history: jobs as they ran (from ``sacct --json``, see
``sim/sacct.py``, or from the controller's history database) turned into simulator jobs,
and what each policy would have changed for each user and job class.

A job whose Comment carries psbatch's profile token (``core/token.py``) is replayed as a
Megatron job: the request is re-validated by ``core/request.py::request_profile`` on the
simulated cluster, exactly as the controller does every tick, so a job that allowed a GPU
range is flexible. Its truth is its real run: the cost model's run time of the config it
ran in (the controller's decision token when it has one, else the user's layout at the
GPUs it held) is scaled (``truth_factor``) to its recorded start-to-end time, and every
other config the policy may pick is scaled alike. Every other job, and a Megatron job
whose token cannot be read, is replayed as it ran: its nodes and GPUs (on the simulated
node size: the fewest nodes with an equal share when its own shape does not fit), its
start-to-end time, no profile, so no policy can change it. Time limits are the recorded
ones (raised to the run time where the replay needs more), else the trace rule of
``workload.py``. Pure: no I/O.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Optional, Sequence

from pipeswift_slurm.core.megatron import MegatronArgError
from pipeswift_slurm.core.megatron_rules import node_shape
from pipeswift_slurm.core.model import ExecConfig, JobProfile
from pipeswift_slurm.core.request import request_profile
from pipeswift_slurm.core.token import TokenError, carries_profile, decode_decision, decode_profile
from pipeswift_slurm.sim.workload import TIME_LIMIT_ROUND_S, Conversion, WorkloadError, WorkloadJob, user_time_limit_s

AS_RAN_CLASS = "(as it ran)"  # the job class shown for jobs without a profile
BASELINE = "slurm"  # the policy whose replay is held against the history (Slurm as the site runs it)


@dataclass(frozen=True)
class RanJob:
    """One job of a site's history as it ran: epoch seconds, the GPUs it held."""

    job_id: str
    user: str
    name: str
    submit_s: float
    start_s: float
    end_s: float
    num_nodes: int
    gpus: int
    time_limit_s: Optional[int] = None
    comment: str = ""  # the job's Comment: psbatch's profile token, if any
    admin_comment: str = ""  # the controller's decision token, if any
    partition: str = ""
    state: str = ""

    @property
    def run_s(self) -> float:
        return max(0.0, self.end_s - self.start_s)

    @property
    def jct_s(self) -> float:
        return max(0.0, self.end_s - self.submit_s)


@dataclass
class History:
    """The jobs of a history that can be replayed, and how many were left out, by reason."""

    source: str
    dialect: str = ""
    jobs: list[RanJob] = field(default_factory=list)
    skipped: dict[str, int] = field(default_factory=dict)

    def add(self, job: Optional[RanJob], why: str = "") -> None:
        """Keep ``job``, or count one job left out for ``why``."""
        if job is not None:
            self.jobs.append(job)
        else:
            self.skipped[why] = self.skipped.get(why, 0) + 1


def _number(value: Any) -> Optional[float]:
    """A history column's finite number (a database edited by hand may hold text), else None."""
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return number if math.isfinite(number) else None


# a time a job ran at is after 1970 and before the year 5000 (a history edited by hand may
# say -1e15 or 2**63: replayed, no clock could reach or show it)
MAX_EPOCH_S = 1e11


def history_from_rows(rows: Iterable[Any], source: str) -> History:
    """A History from the controller database's job rows (``store.reads.ran_job_rows``)."""
    history = History(source=source, dialect="pipeswift history")
    for r in rows:
        submit, start, end, gpus = (_number(r.submit_time), _number(r.start_time), _number(r.end_time),
                                    _number(r.gpus))
        why = ("no submit time" if not submit else "never started" if not start
               else "not finished" if not end else "no GPUs" if not gpus or gpus < 0 or gpus != int(gpus)
               else "a time before 1970 or past the year 5000" if not 0 < min(submit, start, end)
               or max(submit, start, end) >= MAX_EPOCH_S
               else "ends before it starts" if end < max(start, submit)
               else "a name, user or profile that is not text" if not all(
                   v is None or isinstance(v, str) for v in (r.user, r.name, r.profile_text, r.partition, r.state))
               else "")
        if why:
            history.add(None, why)
            continue
        history.add(RanJob(job_id=str(r.job_id), user=r.user or "", name=r.name or "", submit_s=submit,
                           start_s=max(start, submit), end_s=end, num_nodes=int(_number(r.num_nodes) or 1),
                           gpus=int(gpus),
                           comment=r.profile_text or "", partition=r.partition or "", state=r.state or ""))
    return history


# ---------------------------------------------------------------- to simulator jobs

def _limit_s(recorded: Optional[int], run_s: float) -> int:
    """The recorded limit, at least the run time; without one, the trace rule."""
    if recorded:
        return max(recorded, math.ceil(run_s), 1)
    return max(user_time_limit_s(run_s), TIME_LIMIT_ROUND_S)


def _ran_config(ran: RanJob, profile: JobProfile, conv: Conversion) -> ExecConfig:
    """The config the job ran in: the controller's decision, else the user's layout at the
    GPUs it held."""
    if ran.admin_comment:
        try:
            config, _ = decode_decision(ran.admin_comment)
            if config.gpus == ran.gpus:
                return config
        except TokenError:
            pass
    if profile.requested.gpus == ran.gpus:
        return profile.requested
    pinned = request_profile(decode_profile(ran.comment), world_size=ran.gpus, gpus_per_node=conv.gpus_per_node,
                             allocated=True)
    return pinned.requested


def _megatron(job_id: int, ran: RanJob, conv: Conversion) -> Optional[WorkloadJob]:
    """The Megatron job of a history job with a profile token; None when it cannot be read."""
    try:
        req = decode_profile(ran.comment)
        profile = request_profile(req, world_size=ran.gpus, gpus_per_node=conv.gpus_per_node,
                                  cluster_gpus=conv.cluster_gpus)
        ran_config = _ran_config(ran, profile, conv)
        model_s = conv.cost.job_time_s(profile, ran_config)
        user_s = conv.cost.job_time_s(profile, profile.requested)
    except (TokenError, MegatronArgError, ArithmeticError, RecursionError, ValueError):
        return None
    if not (model_s > 0 and math.isfinite(model_s) and math.isfinite(user_s)):
        return None
    factor = max(ran.run_s, 1.0) / model_s
    return WorkloadJob(job_id=job_id, name=ran.job_id, user=ran.user or "user", submit_s=ran.submit_s,
                       argv=tuple(req.argv), profile=profile, recorded_duration_s=ran.run_s,
                       time_limit_s=_limit_s(ran.time_limit_s, max(ran.run_s, user_s * factor)),
                       model=profile.job_class, category=ran.partition, truth_factor=factor,
                       as_ran_jct_s=ran.jct_s)


def _as_ran(job_id: int, ran: RanJob, conv: Conversion) -> WorkloadJob:
    per_node, rest = divmod(ran.gpus, ran.num_nodes)
    nodes, per_node = (ran.num_nodes, per_node) if not rest and per_node <= conv.gpus_per_node \
        else node_shape(ran.gpus, conv.gpus_per_node)
    return WorkloadJob(job_id=job_id, name=ran.job_id, user=ran.user or "user", submit_s=ran.submit_s, argv=(),
                       profile=None, recorded_duration_s=ran.run_s, time_limit_s=_limit_s(ran.time_limit_s, ran.run_s),
                       model=AS_RAN_CLASS, category=ran.partition, as_ran_nodes=nodes, as_ran_gpus_per_node=per_node,
                       as_ran_jct_s=ran.jct_s)


def to_workload(history: History, conv: Conversion, drop_oversized: bool = False) -> list[WorkloadJob]:
    """The simulator's jobs of a history, in submit order (job ids from 1), times as
    recorded (epoch seconds). Counts into ``history.skipped`` the jobs dropped as larger
    than the cluster, and the profile tokens that could not be read (those jobs replay as
    they ran).

    Raises:
        WorkloadError: no job to replay, or a job larger than the cluster (unless dropped).
    """
    if not history.jobs:
        left = ", ".join("%d %s" % (n, why) for why, n in sorted(history.skipped.items()))
        raise WorkloadError("%s: no job to replay (%s)" % (history.source, left or "no jobs at all"))
    nodes = conv.cluster_gpus // conv.gpus_per_node
    jobs: list[WorkloadJob] = []
    too_big: list[RanJob] = []
    for ran in sorted(history.jobs, key=lambda r: (r.submit_s, r.job_id)):
        job = _megatron(len(jobs) + 1, ran, conv) if carries_profile(ran.comment) else None
        if job is None and carries_profile(ran.comment):
            history.skipped["profile unreadable: replayed as it ran"] = \
                history.skipped.get("profile unreadable: replayed as it ran", 0) + 1
        job = job or _as_ran(len(jobs) + 1, ran, conv)
        shape = node_shape(job.gpus, conv.gpus_per_node) if job.profile is not None else (job.as_ran_nodes, 0)
        if job.gpus > conv.cluster_gpus or shape[0] > nodes:
            too_big.append(ran)
            continue
        jobs.append(job)
    if too_big and not drop_oversized:
        raise WorkloadError("%d job(s) do not fit the cluster's %d nodes x %d GPUs (first: job %s with %d GPUs on %d"
                            " nodes); give the site's size with --gpus and --gpus-per-node, or --drop-oversized"
                            % (len(too_big), nodes, conv.gpus_per_node, too_big[0].job_id, too_big[0].gpus,
                               too_big[0].num_nodes))
    if too_big:
        history.skipped["larger than the cluster"] = len(too_big)
    if not jobs:
        raise WorkloadError("%s: every job is larger than the cluster's %d nodes x %d GPUs; use a bigger --gpus"
                            % (history.source, nodes, conv.gpus_per_node))
    return jobs


# ---------------------------------------------------------------- what would have changed

def _mean(values: Sequence[float]) -> Optional[float]:
    return statistics.fmean(values) if values else None


def _groups(jobs: Sequence[WorkloadJob], results: Sequence[Any], key: Callable[[WorkloadJob], str],
            name: str) -> list[dict[str, Any]]:
    jct = {r.policy: {rec.job_id: rec.jct_s for rec in r.records} for r in results}
    groups: dict[str, list[WorkloadJob]] = {}
    for job in jobs:
        groups.setdefault(key(job), []).append(job)
    out = []
    for group, members in sorted(groups.items(), key=lambda kv: (-len(kv[1]), kv[0])):
        ran = _mean([j.as_ran_jct_s for j in members if j.as_ran_jct_s is not None])
        means = {p: _mean([by_id[j.job_id] for j in members if j.job_id in by_id]) for p, by_id in jct.items()}
        out.append({name: group, "jobs": len(members), "as_ran_mean_jct_s": ran, "mean_jct_s": means,
                    "vs_as_ran": {p: (m / ran if m is not None and ran else None) for p, m in means.items()}})
    return out


def replay_fidelity(jobs: Sequence[WorkloadJob], result: Any) -> Optional[dict[str, Any]]:
    """How close the ``slurm`` baseline's replay (``result``, a SimResult) came to what Slurm
    did: its mean JCT and mean wait (start - submit) against the history's, over the jobs
    with a recorded JCT, and their ratios (1.0: reproduced). None without such jobs."""
    recs = {r.job_id: r for r in result.records}
    pairs = [(j, recs[j.job_id]) for j in jobs if j.as_ran_jct_s is not None and j.job_id in recs
             and recs[j.job_id].first_start_s is not None]
    if not pairs:
        return None
    ran_jct = statistics.fmean(j.as_ran_jct_s or 0.0 for j, _ in pairs)
    ran_wait = statistics.fmean(max(0.0, (j.as_ran_jct_s or 0.0) - j.recorded_duration_s) for j, _ in pairs)
    sim_jct = statistics.fmean(r.jct_s for _, r in pairs)
    sim_wait = statistics.fmean((r.first_start_s or 0.0) - r.submit_s for _, r in pairs)
    return {"jobs": len(pairs), "as_ran_mean_jct_s": ran_jct, "replay_mean_jct_s": sim_jct,
            "as_ran_mean_wait_s": ran_wait, "replay_mean_wait_s": sim_wait,
            "mean_jct_ratio": sim_jct / ran_jct if ran_jct else None,
            "mean_wait_ratio": sim_wait / ran_wait if ran_wait else None}


def what_changed(jobs: Sequence[WorkloadJob], results: Sequence[Any]) -> dict[str, Any]:
    """Mean JCT as it ran and under each policy (``results``: SimResults), over all jobs,
    per user and per job class (``AS_RAN_CLASS`` for jobs without a profile); ``vs_as_ran``
    is a policy's mean JCT over the real one (below 1: the policy would have been faster);
    ``slurm_replay_vs_as_ran``: how closely the ``slurm`` baseline reproduced the history
    (``replay_fidelity``; None when ``slurm`` did not run)."""
    overall = _groups(jobs, results, lambda j: "all", "jobs_of")[0]
    slurm = next((r for r in results if r.policy == BASELINE), None)
    return {"as_ran_mean_jct_s": overall["as_ran_mean_jct_s"], "mean_jct_s": overall["mean_jct_s"],
            "vs_as_ran": overall["vs_as_ran"],
            "slurm_replay_vs_as_ran": replay_fidelity(jobs, slurm) if slurm is not None else None,
            "by_user": _groups(jobs, results, lambda j: j.user, "user"),
            "by_class": _groups(jobs, results, lambda j: j.profile.job_class if j.profile else AS_RAN_CLASS,
                                "job_class")}
