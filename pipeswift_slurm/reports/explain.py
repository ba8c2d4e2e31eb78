"""Why is my job pending, and when will it finish? Answered from the history database.

This module owns ``explain_job``: for one job id it reads the job's row, its recorded
profile request and its decisions from the Store, re-parses the profile exactly as the
controller does (``core.request.submitted_profile``: token + Megatron argv, re-validated), and
ranks the candidate configs over the job's allowed GPU range with the planner and the
estimator (calibrated with the calibration table): the best config per GPU count and its
predicted run time, the chosen one marked. It needs no live cluster and never writes.
It returns a plain dataclass; text lives in ``report_render``. Must not import click or
matplotlib.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, field
from typing import Any, Optional

from pipeswift_slurm.core.megatron_rules import check_config
from pipeswift_slurm.core.model import FINISHED_STATES, PENDING, RUNNING, ExecConfig, JobProfile
from pipeswift_slurm.reports.queries import history_now_s
from pipeswift_slurm.store import reads
from pipeswift_slurm.store.rows import waited_s

log = logging.getLogger(__name__)

DEFAULT_GPUS_PER_NODE = 8


class UnknownJob(LookupError):
    """The job id is not in the history database."""


@dataclass(frozen=True)
class Candidate:
    """The config the policy runs on one GPU count and its predicted run time (calibrated).

    ``fits_free_now`` is whether the count fit the free GPUs at the last tick (pending
    jobs only; None otherwise).
    """

    gpus: int
    config: str
    iter_time_s: float
    run_s: float
    gpu_hours: float
    bubble_fraction: float
    mem_gib: float
    chosen: bool = False
    requested: bool = False
    fits_free_now: Optional[bool] = None


@dataclass(frozen=True)
class Explanation:
    """Everything ``pipeswift explain`` says about one job (times: epoch s; durations: s)."""

    job_id: int
    state: str
    state_reason: Optional[str]
    user: Optional[str]
    name: Optional[str]
    partition: Optional[str]
    opted_in: bool
    job_class: Optional[str]
    gpus: Optional[int]
    requested_gpus: Optional[int]
    submit_s: Optional[float]
    start_s: Optional[float]
    end_s: Optional[float]
    now_s: Optional[float]
    wait_s: Optional[float]
    run_s: Optional[float]
    summary: str
    predicted_start_s: Optional[float]
    predicted_end_s: Optional[float]
    predicted_run_s: Optional[float]
    chosen_config: Optional[str]
    chosen_applied: Optional[bool]
    why: str
    n_decisions: int
    last_decision_s: Optional[float]
    profile_error: Optional[str]
    gpu_range: Optional[tuple[int, int]]
    gpu_type: str
    gpus_per_node: int
    candidates: list[Candidate] = field(default_factory=list)


@dataclass(frozen=True)
class _Cluster:
    gpus_per_node: int
    total_gpus: int
    free_gpus: Optional[int]


def _cluster(store: Any, gpus_per_node: Optional[int]) -> _Cluster:
    """Cluster shape from the last tick snapshot (GPUs per node = total / nodes)."""
    snap = reads.last_snapshot(store)
    if snap is None:
        return _Cluster(gpus_per_node or DEFAULT_GPUS_PER_NODE, 0, None)
    gpn = gpus_per_node or (snap.total_gpus // snap.n_nodes if snap.n_nodes else DEFAULT_GPUS_PER_NODE)
    return _Cluster(gpn or DEFAULT_GPUS_PER_NODE, snap.total_gpus, snap.free_gpus)


def _profile(
    row: dict[str, Any], raw: Optional[str], cluster: _Cluster
) -> tuple[Optional[JobProfile], Optional[str]]:
    """Re-read the recorded profile request as the controller does (``core.request``)."""
    from pipeswift_slurm.core.megatron import MegatronArgError
    from pipeswift_slurm.core.request import submitted_profile
    from pipeswift_slurm.core.token import TokenError, decode_profile

    if raw is None:
        return None, "no profile recorded (not submitted with psbatch, or not opted in)"
    world = row["requested_gpus"] or row["gpus"] or 1
    try:
        return submitted_profile(decode_profile(raw), world, gpus_per_node=cluster.gpus_per_node,
                                 cluster_gpus=cluster.total_gpus), None
    except (TokenError, MegatronArgError) as exc:
        return None, str(exc) or None


def _chosen(decisions: list[Any]) -> tuple[Optional[ExecConfig], Optional[bool], str]:
    """(config, applied, reason) of the latest decision that set a config and was not refused."""
    for rec in reversed(decisions):
        if rec.decision.config is not None and rec.applied is not False:
            return rec.decision.config, rec.applied, rec.decision.reason
    return None, None, ""


def _candidates(
    profile: JobProfile, estimator: Any, chosen: Optional[ExecConfig], top: int, free_gpus: Optional[int]
) -> list[Candidate]:
    """The config the policy runs per GPU count it may choose (``Estimator.best``: the
    fastest, unless the user's layout is within the error band; counts ``Estimator.option``
    does not offer left out), by predicted run time; chosen and requested kept."""
    lo, hi = profile.gpu_range
    best: dict[int, Any] = {}
    for gpus in range(lo, hi + 1):
        est = estimator.best(profile, gpus)
        if est is not None and estimator.option(profile, gpus) is not None:
            best[gpus] = est
    # a recorded decision is the controller's, but the history is a file anyone with write
    # access may have edited: a config Megatron would refuse (pp = 2**63, mbs 0) is not estimated
    extra = [cfg for cfg in (chosen, profile.requested) if cfg is not None
             and not check_config(profile, cfg, cfg.gpus_per_node or DEFAULT_GPUS_PER_NODE, job_limits=False)]
    out = []
    for est in list(best.values()) + [estimator.cost.estimate(profile, cfg) for cfg in extra]:
        cfg = est.config
        run_s = estimator.run_time_s(profile, cfg)
        out.append(
            Candidate(
                cfg.gpus,
                cfg.short(),
                est.iter_time_s,
                run_s,
                cfg.gpus * run_s / 3600.0,
                est.bubble_fraction,
                est.mem_gib,
                cfg == chosen,
                cfg == profile.requested,
                None if free_gpus is None else cfg.gpus <= free_gpus,
            )
        )
    unique = {c.config: c for c in sorted(out, key=lambda c: (c.run_s, c.gpus, c.config))}
    ranked = sorted(unique.values(), key=lambda c: (c.run_s, c.gpus, c.config))
    keep = ranked[:top] + [c for c in ranked[top:] if c.chosen or c.requested]
    return keep


def _summary(row: dict[str, Any], now_s: Optional[float]) -> tuple[str, Optional[float]]:
    """One sentence on the job's state, and its wait so far (or its queue time)."""
    state, reason = row["state"], row["state_reason"] or ""
    requeues = " (requeued %d time(s) after running %s)" % (row["restarts"], _dur(row.get("ran_s") or 0.0)) \
        if row.get("restarts") else ""
    if state == PENDING:
        wait = None if now_s is None else waited_s(row, now_s)
        because = " (%s)" % reason if reason else ""
        return "pending%s, waiting for %s so far%s" % (because, _dur(wait), requeues), wait
    if state == RUNNING:
        ran = None if now_s is None or row["start_time"] is None else max(0.0, now_s - row["start_time"])
        so_far = "" if ran is None else " for %s so far" % _dur(ran)
        return ("running on %s GPUs%s, after %s in the queue%s" % (row["gpus"], so_far, _dur(row["queue_s"]),
                                                                      requeues), row["queue_s"])
    if state in FINISHED_STATES or state.endswith("?"):
        return (
            "%s: queued %s, ran %s, JCT %s%s"
            % (
                state,
                _dur(row["queue_s"]),
                _dur(row["run_s"]),
                _dur(_sub(row["end_time"], row["submit_time"])),
                requeues,
            ),
            row["queue_s"],
        )
    return "%s%s" % (state, " (%s)" % reason if reason else ""), row["queue_s"]


NUMBER_COLUMNS = ("submit_time", "eligible_time", "start_time", "end_time", "queue_s", "run_s", "predicted_run_s",
                  "gpus", "requested_gpus", "ran_s", "restarts")


def _numbers_checked(row: dict[str, Any]) -> dict[str, Any]:
    """The row with each time, duration and count a finite number >= 0 or None: a history
    edited by hand may hold text or a negative run there (an end before the start), which
    would be shown as a fact."""
    out = dict(row)
    for key in NUMBER_COLUMNS:
        value = out.get(key)
        if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))
                                  or not math.isfinite(value) or value < 0):
            out[key] = None
    if out.get("start_time") is not None and out.get("end_time") is not None and out["end_time"] < out["start_time"]:
        out["end_time"] = out["run_s"] = None
    return out


def _dur(seconds: Optional[float]) -> str:
    from pipeswift_slurm.core.fmt import duration

    return duration(seconds)


def _sub(a: Optional[float], b: Optional[float]) -> Optional[float]:
    return None if a is None or b is None else a - b


def _predicted(
    row: dict[str, Any], decisions: list[Any], bias: float
) -> tuple[Optional[float], Optional[float], Optional[float]]:
    """(predicted start, predicted end, predicted run s): actual times where known."""
    last = next((r.decision for r in reversed(decisions) if r.decision.predicted_start_s is not None), None)
    start = row["start_time"] if row["start_time"] is not None else (last.predicted_start_s if last else None)
    run_s = row["predicted_run_s"] * bias if row["predicted_run_s"] is not None else None
    if row["end_time"] is not None:
        return start, row["end_time"], run_s
    end = last.predicted_end_s if last and last.predicted_end_s is not None else None
    if row["start_time"] is not None and run_s is not None:
        end = row["start_time"] + run_s
    if end is None and start is not None and run_s is not None:
        end = start + run_s
    return start, end, run_s


def explain_job(
    store: Any, job_id: int, gpu: Any, gpus_per_node: Optional[int] = None, top: int = 8,
    own_layout_first: bool = False,
) -> Explanation:
    """Explain one job from the history database.

    Args:
        store: a Store (read only).
        job_id: the Slurm job id.
        gpu: the GpuType to predict on, or a function of the job's partition that gives it
            (a mixed cluster).
        gpus_per_node: GPUs per node (default: from the last tick snapshot, else 8).
        top: candidate configs listed (the chosen and requested ones are always kept).
        own_layout_first: the site's ``[calibration] own_layout_first`` (the candidates are
            chosen as the controller chooses them).

    Raises:
        UnknownJob: the id is not in the database.
    """
    row = reads.job_row(store, job_id)
    if row is None:
        raise UnknownJob(job_id)
    row = _numbers_checked(row)
    if callable(gpu):
        gpu = gpu(row["partition"] or "")
    cluster = _cluster(store, gpus_per_node)
    decisions = store.decisions_for(job_id)
    calibration = {k: v[0] for k, v in store.calibration().items()}
    profile, error = _profile(row, store.profile_texts([job_id]).get(job_id), cluster)
    chosen, applied, chosen_reason = _chosen(decisions)
    now_s = history_now_s(store)
    summary, wait_s = _summary(row, now_s)
    start, end, run_s = _predicted(row, decisions, calibration.get(row["job_class"] or "", 1.0))
    candidates: list[Candidate] = []
    if profile is not None:
        candidates = _candidates(
            profile,
            _estimator(gpu, cluster, calibration, own_layout_first),
            chosen or profile.requested,
            top,
            cluster.free_gpus if row["state"] == PENDING else None,
        )
    return Explanation(
        job_id,
        row["state"],
        row["state_reason"],
        row["user"],
        row["name"],
        row["partition"],
        bool(row["opted_in"]),
        row["job_class"],
        row["gpus"],
        row["requested_gpus"],
        row["submit_time"],
        row["start_time"],
        row["end_time"],
        now_s,
        wait_s,
        row["run_s"],
        summary,
        start,
        end,
        run_s,
        chosen.short() if chosen else (profile.requested.short() if profile else None),
        applied,
        _why(row, decisions, chosen, chosen_reason, profile),
        len(decisions),
        decisions[-1].at if decisions else None,
        error,
        profile.gpu_range if profile else None,
        gpu.name,
        cluster.gpus_per_node,
        candidates,
    )


def _estimator(gpu: Any, cluster: _Cluster, calibration: dict[str, float], own_layout_first: bool) -> Any:
    from pipeswift_slurm.core.costmodel import CostModel
    from pipeswift_slurm.core.estimator import Estimator

    return Estimator(CostModel(gpu), cluster.gpus_per_node, calibration, own_layout_first=own_layout_first)


def _why(
    row: dict[str, Any],
    decisions: list[Any],
    chosen: Optional[ExecConfig],
    chosen_reason: str,
    profile: Optional[JobProfile],
) -> str:
    """Why the job has its config and place: the controller's own reasons."""
    if not row["opted_in"] and not decisions:
        return ("not opted in (no psbatch profile): the controller never changes this job; "
                "Slurm schedules it as is")
    if not decisions:
        return "no decision recorded yet: it keeps the user's config" if profile else "no decision recorded"
    latest = decisions[-1].decision.reason
    parts = []
    if chosen is not None:
        parts.append("config %s chosen: %s" % (chosen.short(), chosen_reason or "(no reason recorded)"))
    else:
        parts.append("the user's config is kept")
    if latest and latest != chosen_reason:
        parts.append("latest decision: %s" % latest)
    return "; ".join(parts)
