"""Read ``sacct --json`` into a site's history (``replay.History``): one ``RanJob`` per
job that ran on GPUs, for ``pipeswift simulate --sacct``.

Both dialects are read: Slurm 22.05's (openapi dbv0.0.38: numbers are plain, ``state`` is
``{"current": "COMPLETED"}``, the time limit is minutes as a number) and 24.11's
(data_parser v0.0.42: numbers may be ``{"set", "infinite", "number"}``, ``state.current``
is a list). In both, ``time.submission``/``start``/``end`` are epoch seconds, a job's
GPUs are the ``gres``/``gpu`` entries of ``tres.allocated``, its Comment is
``comment.job`` (stored only where slurm.conf has ``AccountingStoreFlags=job_comment``:
without it no job has a profile and every job replays as it ran) and its AdminComment
``comment.administrator``. Job steps are not read.

Input that is not ``sacct --json`` output (not JSON, no list of jobs, a job without its
``time`` record or submit time) is a ``WorkloadError`` naming the file and what to do; a
job that cannot be replayed (it never started, has not ended, holds no GPU) is left out
and counted by reason. Pure but for reading the file.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Mapping, Optional

from pipeswift_slurm.core.files import open_nowait
from pipeswift_slurm.core.fmt import visible
from pipeswift_slurm.sim.replay import History, RanJob
from pipeswift_slurm.sim.workload import WorkloadError
from pipeswift_slurm.slurm.backends.slurm_parse import json_int, json_state, json_text

HOW = "export it with: sacct --json -a -S START -E END > FILE"


def _gpus(tres: Any) -> int:
    """GPUs in ``tres.allocated``: the untyped ``gres``/``gpu`` entry, else the sum of the
    typed ones (``gpu:a100``)."""
    untyped, typed = None, 0
    allocated = tres.get("allocated") if isinstance(tres, Mapping) else None
    for item in allocated if isinstance(allocated, list) else []:
        if not isinstance(item, Mapping) or json_text(item.get("type")) != "gres":
            continue
        name, count = json_text(item.get("name")), json_int(item.get("count")) or 0
        if name == "gpu":
            untyped = count
        elif name.startswith("gpu:"):
            typed += count
    return untyped if untyped is not None else typed


def _version(meta: Any) -> str:
    """'22.05.8' from ``meta.Slurm`` (22.05) or ``meta.slurm`` (24.11); '' when absent."""
    slurm = (meta.get("Slurm") or meta.get("slurm") or {}) if isinstance(meta, Mapping) else {}
    return json_text(slurm.get("release")) if isinstance(slurm, Mapping) else ""


def _job_id(rec: Mapping[str, Any]) -> str:
    job_id = str(json_int(rec.get("job_id")) or "?")
    array = rec.get("array") if isinstance(rec.get("array"), Mapping) else {}
    task = json_int(array.get("task_id"))
    return "%s_%d" % (json_int(array.get("job_id")) or job_id, task) if task is not None else job_id


def _ran_job(rec: Mapping[str, Any], where: str) -> tuple[Optional[RanJob], str]:
    """(the job, '') or (None, why it is left out). Raises WorkloadError on a record that
    is not a sacct job at all."""
    job_id = _job_id(rec)
    times = rec.get("time")
    submit_s = json_int(times.get("submission")) if isinstance(times, Mapping) else None
    if not submit_s:
        raise WorkloadError("%s: job %s has no time.submission: not sacct --json output? %s" % (where, job_id, HOW))
    start_s, end_s = json_int(times.get("start")) or 0, json_int(times.get("end")) or 0
    state = rec.get("state")
    current = json_state(state.get("current") if isinstance(state, Mapping) else state)
    nodes = json_int(rec.get("allocation_nodes")) or 0
    if not start_s or not nodes:
        return None, "never started"
    if not end_s or current in ("RUNNING", "PENDING", "SUSPENDED", "REQUEUED"):
        return None, "not finished"
    if end_s < start_s:
        return None, "ends before it starts"
    gpus = _gpus(rec.get("tres"))
    if gpus <= 0:
        return None, "no GPUs"
    comment = rec.get("comment") if isinstance(rec.get("comment"), Mapping) else {}
    limit_min = json_int(times.get("limit"))
    return RanJob(job_id=job_id, user=json_text(rec.get("user")), name=json_text(rec.get("name")),
                  submit_s=float(submit_s), start_s=float(max(start_s, submit_s)), end_s=float(max(end_s, start_s)),
                  num_nodes=nodes, gpus=gpus, time_limit_s=limit_min * 60 if limit_min else None,
                  comment=json_text(comment.get("job")), admin_comment=json_text(comment.get("administrator")),
                  partition=json_text(rec.get("partition")), state=current), ""


def parse_sacct_json(text: str, where: str = "sacct --json") -> History:
    """The history in ``sacct --json`` output ``text`` (``where`` names it in messages).

    Raises:
        WorkloadError: not JSON, not ``{"jobs": [...]}``, Slurm reported errors, or a job
            without its submit time.
    """
    try:
        data = json.loads(text)
    except (ValueError, RecursionError) as exc:
        raise WorkloadError("%s: not JSON (%s); %s" % (where, str(exc)[:120], HOW)) from None
    if not isinstance(data, Mapping) or not isinstance(data.get("jobs"), list):
        raise WorkloadError("%s: JSON without a list of jobs (no \"jobs\": [...]): not sacct --json output; %s"
                            % (where, HOW))
    raw_errors = data.get("errors") or []
    errors = [e for e in (raw_errors if isinstance(raw_errors, list) else [raw_errors]) if e]
    if errors:
        first = errors[0]
        why = (first.get("description") or first.get("error")) if isinstance(first, Mapping) else first
        raise WorkloadError("%s: sacct reported an error: %s" % (where, visible(str(why)[:200])))
    history = History(source=where, dialect=_version(data.get("meta")))
    for rec in data["jobs"]:
        if not isinstance(rec, Mapping):
            raise WorkloadError("%s: a job record is a %s, not an object: not sacct --json output; %s"
                                % (where, type(rec).__name__, HOW))
        job, why = _ran_job(rec, where)
        history.add(job, why)
    return history


def read_sacct(path: str | Path) -> History:
    """``parse_sacct_json`` of a file.

    Raises:
        WorkloadError: unreadable file, or what ``parse_sacct_json`` raises.
    """
    try:
        with open_nowait(path) as fh:  # a FIFO nobody writes is an empty file, not a hang
            text = fh.read().decode("utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise WorkloadError("%s: cannot read it (%s)" % (path, getattr(exc, "strerror", None) or exc)) from None
    return parse_sacct_json(text, str(path))
