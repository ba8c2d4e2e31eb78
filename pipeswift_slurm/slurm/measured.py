"""The controller's side of the launcher's measurements (``submit/iterlog.py``): read each
job's report from the site's spool folder, accept it only as a claim about that job, and
turn the accepted ones into calibration observations of the layout that ran.

Why a user cannot use this channel to change other users' predictions:
  * a report counts only for the job it is named after, and only when the file (a plain
    file, not a link) belongs to that job's user (the folder is sticky: nobody replaces
    another user's file; a file named after someone else's job is skipped unread, and
    cannot take the name of that job's report either: the launcher adds a random part,
    ``iterlog.report_name``);
  * its layout must be the controller's decision for the job where that decision is valid
    for the job's allocation (the launcher runs exactly that one; 'not the decided layout'
    otherwise: no user can claim a run in a layout the site never ran, and so have it
    counted as measured for other users' jobs); where there is none (Slurm started the job
    before a tick decided, and its launcher planned), any layout the job could have run;
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
import re
import stat
from collections import Counter
from dataclasses import fields
from typing import Any, Callable, Container, Iterable, Mapping, Optional

from pipeswift_slurm.core.calibration import Observation
from pipeswift_slurm.core.layout_fit import layout_features
from pipeswift_slurm.core.megatron_rules import config_for_allocation
from pipeswift_slurm.core.model import ExecConfig, Job, JobProfile

log = logging.getLogger(__name__)

MEASURE_BOUND = 3.0  # accepted: prediction / 3 <= measured <= prediction x 3
ELAPSED_SLACK = 1.05  # iterations x measured may exceed the elapsed time by 5 % (rounding)
MAX_REPORT_BYTES = 65536
MAX_COUNT = 1 << 40  # no layout field or iteration count of a real run comes near it
MAX_FILES_PER_JOB = 64  # a job writes one report per run: requeues and restarts stay far below
OK = "ok"


def _uid(user: str) -> Optional[int]:
    """The uid of ``user`` on this host (None: no such user, so no file is theirs)."""
    try:
        return pwd.getpwnam(user).pw_uid
    except KeyError:
        return None


def folder_problem(folder: str) -> Optional[str]:
    """What keeps ``folder`` from working as the launchers' spool (None: nothing): it must
    exist, and like /tmp be writable by every user and sticky (mode 1777), or no job can
    report, or one user could replace another's reports."""
    try:
        st = os.stat(folder)
    except OSError as exc:
        return "cannot use the measure folder %s (%s): no job can report its iteration times; create it with" \
            " mode 1777" % (folder, exc.strerror or exc)
    if not stat.S_ISDIR(st.st_mode):
        return "the measure folder %s is not a folder" % folder
    if st.st_mode & 0o1777 != 0o1777:
        return "the measure folder %s has mode %o, not 1777 (writable by all, sticky, as /tmp): jobs cannot report" \
            " or could replace each other's reports; chmod 1777 it" % (folder, st.st_mode & 0o7777)
    return None


# a report's name: the job id, and the random part of ``iterlog.report_name`` (none: a
# launcher of an earlier release)
REPORT_NAME = re.compile(r"(\d{1,19})(?:\.[0-9a-f]{16})?\.json")


def reports_in(folder: str, wanted: Optional[Container[int]] = None) -> dict[int, list[str]]:
    """Job id -> the report files named after it in ``folder``, for the jobs ``wanted`` (None:
    all), at most ``MAX_FILES_PER_JOB`` each (one listing per tick: a job's reports cannot be
    found by name, since that is random, ``iterlog.report_name``). Anyone may name files
    after any job there: the cap keeps what a flood costs a tick bounded (a warning names the
    jobs), and ``read_report`` reads only the files of the job's own user."""
    out: dict[int, list[str]] = {}
    crowded: set[int] = set()
    try:
        with os.scandir(folder) as entries:
            for entry in entries:
                got = REPORT_NAME.fullmatch(entry.name)
                if not got or (wanted is not None and int(got.group(1)) not in wanted):
                    continue
                paths = out.setdefault(int(got.group(1)), [])
                if len(paths) < MAX_FILES_PER_JOB:
                    paths.append(entry.path)
                else:
                    crowded.add(int(got.group(1)))
    except OSError as exc:
        log.warning("cannot list the measure folder %s (%s): no reports read", folder, exc.strerror or exc)
    if crowded:
        log.warning("the measure folder %s holds over %d files named after job(s) %s (a job writes one per run):"
                    " only %d of each are looked at; clear the folder as /tmp, and see who wrote them",
                    folder, MAX_FILES_PER_JOB, ", ".join(map(str, sorted(crowded)[:10])), MAX_FILES_PER_JOB)
    return out


def read_report(paths: Iterable[str], job: Job) -> Optional[tuple[dict[str, Any], str, float]]:
    """(report, '', mtime) of ``job`` from the newest of its user's files among ``paths``
    (its candidates, ``reports_in``), ({}, why refused, mtime), or None when there is none.
    Files of other users are not its user's claims: skipped unread, as if absent (anyone may
    put a file named after any job there, with any mtime; were it recorded, its mtime would
    hide the job's own later report). A link or anything else not a plain file is refused."""
    uid, mine = _uid(job.user), []
    for path in paths:
        try:
            st = os.lstat(path)
        except OSError:
            continue
        if uid is not None and st.st_uid == uid:
            mine.append((st.st_mtime, path, st))
    if not mine:
        return None
    mtime, path, st = max(mine, key=lambda m: (m[0], m[1]))
    if not stat.S_ISREG(st.st_mode):
        return {}, "not a plain file", mtime
    try:
        # non-blocking and checked again once open: a file swapped for a FIFO after the
        # lstat must not hang the tick
        with os.fdopen(os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK), "rb") as fh:
            opened = os.fstat(fh.fileno())
            if not stat.S_ISREG(opened.st_mode) or opened.st_uid != uid:
                return {}, "not a plain file of its user", mtime
            data = json.loads(fh.read(MAX_REPORT_BYTES + 1)[:MAX_REPORT_BYTES])
        if not isinstance(data, dict) or data.get("job_id") != job.job_id:
            return {}, "not this job's report", mtime
        return data, "", mtime
    except (OSError, ValueError, RecursionError):
        return {}, "unreadable report", mtime


def _count(value: Any) -> Optional[int]:
    """A report's whole number (a JSON integer in 0..``MAX_COUNT``), else None: a report is
    a claim, and a float, a bool, null or an integer of 400 digits is no layout field or
    iteration count."""
    return value if type(value) is int and 0 <= value <= MAX_COUNT else None


def _seconds(value: Any) -> Optional[float]:
    """A report's positive, finite number of seconds, else None."""
    if type(value) is int:  # (bool is not: True is no time)
        return float(value) if 0 < value <= MAX_COUNT else None
    return value if type(value) is float and math.isfinite(value) and value > 0 else None


def report_config(data: Mapping[str, Any]) -> Optional[ExecConfig]:
    """The layout a report names, or None when it does not name a valid one: every field
    present is a whole number (the uneven-split fields may be null)."""
    raw = data.get("config")
    if not isinstance(raw, dict):
        return None
    optional = {"decoder_first_pipeline_num_layers", "decoder_last_pipeline_num_layers"}
    values: dict[str, Optional[int]] = {}
    for f in fields(ExecConfig):
        if f.name in raw:
            values[f.name] = _count(raw[f.name])
            if values[f.name] is None and not (f.name in optional and raw[f.name] is None):
                return None
    try:
        return ExecConfig(**values)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return None


def within_bound(predicted: float, measured: float) -> bool:
    """Whether a measured time is within ``MEASURE_BOUND`` of its prediction: the bound on
    what one run, reported or timed by Slurm, may teach the calibration."""
    return predicted / MEASURE_BOUND <= measured <= predicted * MEASURE_BOUND


def judge(data: Mapping[str, Any], job: Job, profile: Optional[JobProfile],
          iter_time_s: Callable[[JobProfile, ExecConfig], float]) -> tuple[Optional[ExecConfig], float, str]:
    """(layout, predicted s per iteration, status) of one report: status 'ok' or why refused.
    A report must name the iterations it measured over (the check against Slurm's elapsed
    time at the job's end multiplies by them)."""
    cfg = report_config(data)
    if profile is None:
        return cfg, math.nan, "no profile"
    nodes = max(1, job.num_nodes)
    valid, _why = config_for_allocation(cfg, profile, nodes, job.gpus // nodes) if cfg else (None, "")
    if valid is None:
        return cfg, math.nan, "invalid layout"
    decided = config_for_allocation(job.config, profile, nodes, job.gpus // nodes)[0] if job.config else None
    if decided is not None and valid != decided:  # the launcher ran the decision (valid for this allocation)
        return valid, math.nan, "not the decided layout"
    predicted = iter_time_s(profile, valid)
    measured = _seconds(data.get("median_iter_s"))
    if measured is None or not predicted > 0:
        return valid, predicted, "no value"
    if not _count(data.get("iterations")):
        return valid, predicted, "no iterations"
    if not within_bound(predicted, measured):
        return valid, predicted, "out of bounds"
    return valid, predicted, OK


def ingest(folder: str, jobs: Iterable[Job], profile_of: Callable[[Job], Optional[JobProfile]],
           iter_time_s: Callable[[JobProfile, ExecConfig], float], store: Any) -> Counter[str]:
    """Record the report of every started job in ``jobs`` that has a new one (written since
    the one recorded: ``reported_at`` is the file's mtime), in one transaction; the
    statuses counted."""
    from pipeswift_slurm.store.queries import MeasurementEntry

    started = [job for job in jobs if job.start_time is not None and job.opted_in]
    listing = reports_in(folder, {job.job_id for job in started})
    found = {job.job_id: (job, got) for job in started
             if job.job_id in listing and (got := read_report(listing[job.job_id], job)) is not None}
    known = {m.job_id: m.reported_at for m in store.measurements(list(found))} if found else {}
    counts: Counter[str] = Counter()
    entries = []
    for job_id, (job, (data, why, mtime)) in sorted(found.items()):
        if mtime <= known.get(job_id, -math.inf):
            continue
        try:
            profile = profile_of(job) if not why else None
            cfg, predicted, status = (None, math.nan, why) if why else judge(data, job, profile, iter_time_s)
        except (ArithmeticError, TypeError, ValueError) as exc:  # a claim no check foresaw: refused
            log.debug("job %d: report refused (%s)", job_id, exc)
            profile, cfg, predicted, status = None, None, math.nan, "invalid report"
        counts[status] += 1
        feats = dict(layout_features(cfg, profile.requested if profile is not None else None)) \
            if cfg is not None else {}
        entries.append(MeasurementEntry(
            job_id, job.user, getattr(profile, "job_class", None), cfg.short() if cfg else None, feats.get("tp"),
            feats.get("pp"), feats.get("mbs"), feats.get("vp"), _seconds(data.get("median_iter_s")),
            predicted if math.isfinite(predicted) else None, _count(data.get("iterations")), status, mtime,
            own_layout=feats.get("own")))
    if entries:
        store.save_measurements(entries)
    refused = {k: v for k, v in counts.items() if k != OK}
    if refused:
        log.warning("measured iteration times refused: %s", ", ".join("%s %d" % kv for kv in sorted(refused.items())))
    return counts


def within_elapsed(m: Any, run_s: float) -> bool:
    """Whether iterations x measured s per iteration fits in Slurm's elapsed ``run_s`` (a
    report without a positive count of iterations cannot be checked, so it does not)."""
    return bool(m.iterations and m.iterations > 0) and m.iterations * (m.iter_s or 0.0) <= run_s * ELAPSED_SLACK


def observation(finished: Any, m: Any) -> Optional[Observation]:
    """The observation of a finished job's accepted measurement (None: not usable)."""
    if m is None or m.status != OK or not m.iter_s or not m.predicted_iter_s or not within_elapsed(m, finished.run_s):
        return None
    features = (("tp", m.tp), ("pp", m.pp), ("mbs", m.micro_batch_size), ("vp", m.vp or 1))
    if m.own_layout is not None:  # recorded before this release: no own term
        features += (("own", m.own_layout),)
    return Observation(finished.job_class, m.predicted_iter_s, m.iter_s, finished.end_time, m.user or "",
                       features if None not in (m.tp, m.pp, m.micro_batch_size) else ())
