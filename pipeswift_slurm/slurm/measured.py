"""The controller's side of the launcher's measurements (``submit/iterlog.py``): read each
job's report from the site's spool folder, accept it only as a claim about that job, and
turn the accepted ones into calibration observations of the layout that ran.

Why a user cannot use this channel to change other users' predictions:
  * a report counts only for the job it is named after, and only when the file (a plain
    file, not a link) belongs to that job's user (the folder is sticky: nobody replaces
    another user's file, and a file a user made for someone else's job id is refused:
    'not its user's file'; at worst it keeps that job from reporting at all);
  * its layout must be one Megatron accepts for that job's allocation, and its value
    within ``MEASURE_BOUND`` of the cost model's prediction for that layout ('out of
    bounds' otherwise: a typo or a lie cannot move a class far);
  * once the job finished, the measured iteration time x the iterations it reports cannot
    exceed Slurm's own elapsed time ('exceeds elapsed');
  * in the fit, one user's runs weigh at most ``layout_fit.USER_CAP_RUNS`` runs per term.
Refused reports are recorded with the reason and counted in the log; never learned from.
"""

from __future__ import annotations

import json
import logging
import math
import os
import pwd
import stat
from collections import Counter
from dataclasses import fields
from typing import Any, Callable, Iterable, Mapping, Optional

from pipeswift_slurm.core.calibration import Observation
from pipeswift_slurm.core.layout_fit import layout_features
from pipeswift_slurm.core.megatron_rules import config_for_allocation
from pipeswift_slurm.core.model import ExecConfig, Job, JobProfile

log = logging.getLogger(__name__)

MEASURE_BOUND = 3.0  # accepted: prediction / 3 <= measured <= prediction x 3
ELAPSED_SLACK = 1.05  # iterations x measured may exceed the elapsed time by 5 % (rounding)
MAX_REPORT_BYTES = 65536
OK = "ok"


def _owner_ok(st: os.stat_result, user: str) -> bool:
    try:
        return st.st_uid == pwd.getpwnam(user).pw_uid
    except KeyError:
        return False


def read_report(folder: str, job: Job) -> Optional[tuple[dict[str, Any], str, float]]:
    """(report, '', mtime) of ``job`` from ``<folder>/<job id>.json``, ({}, why refused,
    mtime), or None when there is none. A link is refused (its owner is not its target's)."""
    path = os.path.join(folder, "%d.json" % job.job_id)
    try:
        st = os.lstat(path)
    except OSError:
        return None
    if not stat.S_ISREG(st.st_mode):
        return {}, "not a plain file", st.st_mtime
    if not _owner_ok(st, job.user):
        return {}, "not its user's file", st.st_mtime
    try:
        # non-blocking and checked again once open: a file swapped for a FIFO after the
        # lstat must not hang the tick
        with os.fdopen(os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK), "rb") as fh:
            opened = os.fstat(fh.fileno())
            if not stat.S_ISREG(opened.st_mode) or not _owner_ok(opened, job.user):
                return {}, "not a plain file of its user", st.st_mtime
            data = json.loads(fh.read(MAX_REPORT_BYTES + 1)[:MAX_REPORT_BYTES])
        if not isinstance(data, dict) or data.get("job_id") != job.job_id:
            return {}, "not this job's report", st.st_mtime
        return data, "", st.st_mtime
    except (OSError, ValueError, RecursionError):
        return {}, "unreadable report", st.st_mtime


def report_config(data: Mapping[str, Any]) -> Optional[ExecConfig]:
    """The layout a report names, or None when it does not name a valid one."""
    raw = data.get("config")
    if not isinstance(raw, dict):
        return None
    names = {f.name for f in fields(ExecConfig)}
    try:
        values = {k: (None if v is None else int(v)) for k, v in raw.items() if k in names}
        return ExecConfig(**values)
    except (TypeError, ValueError):
        return None


def judge(data: Mapping[str, Any], job: Job, profile: Optional[JobProfile],
          iter_time_s: Callable[[JobProfile, ExecConfig], float]) -> tuple[Optional[ExecConfig], float, str]:
    """(layout, predicted s per iteration, status) of one report: status 'ok' or why refused."""
    cfg = report_config(data)
    if profile is None:
        return cfg, math.nan, "no profile"
    nodes = max(1, job.num_nodes)
    valid, _why = config_for_allocation(cfg, profile, nodes, job.gpus // nodes) if cfg else (None, "")
    if valid is None:
        return cfg, math.nan, "invalid layout"
    predicted = iter_time_s(profile, valid)
    measured = data.get("median_iter_s")
    if not isinstance(measured, (int, float)) or not math.isfinite(measured) or not predicted > 0:
        return valid, predicted, "no value"
    if not predicted / MEASURE_BOUND <= measured <= predicted * MEASURE_BOUND:
        return valid, predicted, "out of bounds"
    return valid, predicted, OK


def ingest(folder: str, jobs: Iterable[Job], profile_of: Callable[[Job], Optional[JobProfile]],
           iter_time_s: Callable[[JobProfile, ExecConfig], float], store: Any) -> Counter[str]:
    """Record the report of every started job in ``jobs`` that has a new one (written since
    the one recorded: ``reported_at`` is the file's mtime), in one transaction; the
    statuses counted."""
    from pipeswift_slurm.store.queries import MeasurementEntry

    found = {job.job_id: (job, got) for job in jobs if job.start_time is not None and job.opted_in
             and (got := read_report(folder, job)) is not None}
    known = {m.job_id: m.reported_at for m in store.measurements(list(found))} if found else {}
    counts: Counter[str] = Counter()
    entries = []
    for job_id, (job, (data, why, mtime)) in sorted(found.items()):
        if mtime <= known.get(job_id, -math.inf):
            continue
        profile = profile_of(job) if not why else None
        cfg, predicted, status = (None, math.nan, why) if why else judge(data, job, profile, iter_time_s)
        counts[status] += 1
        feats = dict(layout_features(cfg, profile.requested if profile is not None else None)) \
            if cfg is not None else {}
        measured = data.get("median_iter_s")
        entries.append(MeasurementEntry(
            job_id, job.user, getattr(profile, "job_class", None), cfg.short() if cfg else None, feats.get("tp"),
            feats.get("pp"), feats.get("mbs"), feats.get("vp"),
            float(measured) if isinstance(measured, (int, float)) and math.isfinite(measured) else None,
            predicted if math.isfinite(predicted) else None,
            int(data["iterations"]) if isinstance(data.get("iterations"), int) else None, status, mtime,
            own_layout=feats.get("own")))
    if entries:
        store.save_measurements(entries)
    refused = {k: v for k, v in counts.items() if k != OK}
    if refused:
        log.warning("measured iteration times refused: %s", ", ".join("%s %d" % kv for kv in sorted(refused.items())))
    return counts


def within_elapsed(m: Any, run_s: float) -> bool:
    """Whether iterations x measured s per iteration fits in Slurm's elapsed ``run_s``."""
    return (m.iterations or 0) * (m.iter_s or 0.0) <= run_s * ELAPSED_SLACK


def observation(finished: Any, m: Any) -> Optional[Observation]:
    """The observation of a finished job's accepted measurement (None: not usable)."""
    if m is None or m.status != OK or not m.iter_s or not m.predicted_iter_s or not within_elapsed(m, finished.run_s):
        return None
    features = (("tp", m.tp), ("pp", m.pp), ("mbs", m.micro_batch_size), ("vp", m.vp or 1))
    if m.own_layout is not None:  # recorded before this release: no own term
        features += (("own", m.own_layout),)
    return Observation(finished.job_class, m.predicted_iter_s, m.iter_s, finished.end_time, m.user or "",
                       features if None not in (m.tp, m.pp, m.micro_batch_size) else ())
