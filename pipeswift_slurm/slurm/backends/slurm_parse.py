"""Pure parsers of Slurm command output: ``squeue --json`` (22.05 and 24.11+ dialects),
``scontrol -d -o show node`` text, the ``nodes`` list of
``sinfo --json``/``scontrol --json show node``, ``sprio``, and a batched ``scontrol``'s
stderr; with the small pieces they share (hostlists, GRES/TRES specs, durations, decision
tokens).

Owns: turning that text into ``model.py`` types (Job, Node, GpuRequest, ExecConfig). The
functions take text and return values: they run no command and keep no state. Jobs are read
only from JSON: their names, comments and paths are user text, and a ``key=value`` line
cannot tell a user's ``x JobId=777 AdminComment=...`` job name from the real fields; the
``key=value`` parser reads only what admins write (node records).
``slurm_cli`` and ``pyslurm_`` build on this module, never the other way round. Must not
import subprocess, pyslurm, SQLAlchemy or any policy module.
"""

from __future__ import annotations

import json
import logging
import re
from dataclasses import replace
from typing import Any, Iterable, Mapping, Optional

from pipeswift_slurm.core.fmt import digits
from pipeswift_slurm.core import token
from pipeswift_slurm.core.gres import GPU_FIELDS, gres_gpu, job_gpus
from pipeswift_slurm.core.model import FINISHED_STATES, PENDING, ExecConfig, GpuRequest, Job, Node
from pipeswift_slurm.slurm.backends import BackendError

log = logging.getLogger(__name__)

_NO_VAL = 0xFFFFFFFE  # 32-bit NO_VAL / INFINITE (and above) mean "not set"


# ------------------------------------------------------------------------------------ small parsers
def _num(value: Any) -> Optional[int]:
    """A whole number from 22.05 (int/null) or 24.11+ ({"set","infinite","number"}) JSON;
    None for unset, and for what no Slurm field holds (negative, NaN, infinite, a string of
    other than a few ASCII digits: an export edited by hand)."""
    if isinstance(value, dict):
        if not value.get("set", True) or value.get("infinite", False):
            return None
        value = value.get("number")
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, (int, float)):
        return int(value) if 0 <= value < _NO_VAL else None  # (NaN compares false)
    text = str(value).strip()  # digits as text: the same bounds as a number
    return _num(int(text)) if digits(text) and len(text) < 20 else None


def _time(value: Any) -> Optional[float]:
    """Epoch seconds, or None for 0/unset (Slurm's 'not happened')."""
    number = _num(value)
    return float(number) if number else None


def _state(value: Any) -> str:
    """Base job state from ``"PENDING"`` (22.05) or ``["PENDING", "REQUEUED"]`` (24.11+)."""
    if isinstance(value, (list, tuple)):
        value = value[0] if value else ""
    return str(value or "").split("+")[0].upper()


def _text(value: Any) -> str:
    return "" if value in (None, "(null)") else str(value)


# The same readers for the other parsers of Slurm's JSON (``sim/sacct.py``: sacct --json).
json_int, json_state, json_text = _num, _state, _text


def parse_gres(spec: str) -> Optional[GpuRequest]:
    """The GPU item of a TRES/GRES spec (``core.gres.gres_gpu``); None if it has none.
    The returned ``field`` is left at its default; callers set it."""
    item = gres_gpu(_text(spec))
    return None if item is None else GpuRequest(count=item[0], gpu_type=item[1], slash=item[2])


def gpu_request_of(fields: Mapping[str, Any]) -> GpuRequest:
    """The job's GPU request from its ``tres_per_*`` fields (the first one naming a GPU, in
    ``core.gres.GPU_FIELDS`` order)."""
    for name in GPU_FIELDS:
        req = parse_gres(_text(fields.get(name)))
        if req is not None:
            return replace(req, field=name)
    return GpuRequest(count=0)


def _requested_gpus(req: GpuRequest, num_nodes: int, num_tasks: Optional[int]) -> int:
    """The GPUs the job asks for, by the rule psbatch sizes its profile with (``core.gres``)."""
    asked = job_gpus({req.field: req.count}, num_nodes, num_tasks)
    return asked[1] if asked else 0


def _gpus_in(details: Iterable[str]) -> int:
    total = 0
    for spec in details:
        req = parse_gres(spec)
        total += req.count if req else 0
    return total


def expand_hostlist(text: str) -> tuple[str, ...]:
    """Expand a Slurm hostlist (``node[1-3,5],gpu[01-02]``) into node names."""
    names: list[str] = []
    for prefix, ranges, suffix in re.findall(r"([^,\[\]]*)(?:\[([^\]]*)\])?([^,\[\]]*),?", _text(text)):
        if not ranges:
            if prefix + suffix:
                names.append(prefix + suffix)
            continue
        for part in ranges.split(","):
            lo, _, hi = part.partition("-")
            width = len(lo)
            for i in range(int(lo), int(hi or lo) + 1):
                names.append("%s%0*d%s" % (prefix, width, i, suffix))
    return tuple(names)


def decision_config(admin_comment: str, job_id: int) -> Optional[ExecConfig]:
    """The ExecConfig of a decision token in ``admin_comment``; None if absent or malformed."""
    if token.DECISION_PREFIX not in admin_comment:
        return None
    try:
        return token.decode_decision(admin_comment)[0]
    except token.TokenError as exc:
        log.debug("job %d: ignoring malformed decision token: %s", job_id, exc)
        return None


# ------------------------------------------------------------------------------------ squeue --json
JSON_REPORTED = "squeue --json reported: "


def _json_errors(data: Mapping[str, Any]) -> list[str]:
    errors = data.get("errors") or []
    if not isinstance(errors, list):
        errors = [errors]
    return [(e.get("description") or e.get("error") or str(e)) if isinstance(e, dict) else str(e)
            for e in errors]


def parse_squeue_json(text: str) -> list[Job]:
    """Parse ``squeue --json`` (22.05 openapi v0.0.38 or 24.11+ data_parser) into Jobs.

    Pending array meta-records (``123_[5-9]``: ``array_task_string`` set, no task id) are
    kept for the policy's view but never opted in, so they are never modified. One record
    that cannot be read (a field of the wrong type) is left out with one log line; every
    other job is read as usual.

    Raises:
        BackendError: not JSON, not the shape ``{"jobs": [...]}``, or Slurm reported
            errors (e.g. slurmctld unreachable).
    """
    try:
        data = json.loads(text)
    except (ValueError, RecursionError) as exc:
        raise BackendError("squeue --json gave no JSON: %s" % str(exc)[:200]) from None
    if not isinstance(data, dict) or not isinstance(data.get("jobs", []), list):
        raise BackendError("squeue --json gave JSON without a list of jobs (a %s); not acting on it"
                           % type(data.get("jobs") if isinstance(data, dict) else data).__name__)
    errors = _json_errors(data)
    if errors:
        raise BackendError("%s%s" % (JSON_REPORTED, "; ".join(errors)))
    jobs = []
    for rec in data.get("jobs") or []:
        try:
            job = _job_from_json(rec) if isinstance(rec, dict) else None
        except (TypeError, ValueError, AttributeError, ArithmeticError) as exc:
            log.warning("job %s: squeue --json record left out (cannot read it: %s)",
                        str(rec.get("job_id"))[:20], str(exc)[:200])
            continue
        if job is not None:
            jobs.append(job)
    return jobs


def _job_from_json(rec: Mapping[str, Any]) -> Optional[Job]:
    job_id = _num(rec.get("job_id"))
    if job_id is None:
        return None
    state = _state(rec.get("job_state"))
    num_nodes = _num(rec.get("node_count")) or 1
    req = gpu_request_of(rec)
    tasks = _num(rec.get("tasks")) or _num(rec.get("num_tasks"))
    gpus = _requested_gpus(req, num_nodes, tasks)
    if state != PENDING:
        used = _gpus_in(rec.get("gres_detail") or []) or _tres_gpus(_text(rec.get("tres_alloc_str")))
        gpus = used or gpus
    is_meta = bool(_text(rec.get("array_task_string"))) and _num(rec.get("array_task_id")) is None
    comment, admin = _text(rec.get("comment")), _text(rec.get("admin_comment"))
    limit_min = _num(rec.get("time_limit"))
    return Job(
        job_id=job_id, state=state, submit_time=_time(rec.get("submit_time")) or 0.0,
        num_nodes=num_nodes, gpus=gpus, priority=_num(rec.get("priority")) or 0,
        user=_text(rec.get("user_name")), name=_text(rec.get("name")),
        partition=_text(rec.get("partition")), state_reason=_text(rec.get("state_reason")),
        eligible_time=_time(rec.get("eligible_time")),
        start_time=None if state == PENDING else _time(rec.get("start_time")),
        end_time=_time(rec.get("end_time")) if state in FINISHED_STATES else None,
        time_limit_s=limit_min * 60 if limit_min else None,
        opted_in=token.carries_profile(comment) and not is_meta,
        comment=comment, admin_comment=admin,
        node_list=expand_hostlist(_text(rec.get("nodes"))) if state != PENDING else (),
        gpu_request=req, config=decision_config(admin, job_id),
        restarts=_num(rec.get("restart_cnt")) or 0,
        account=_text(rec.get("account")), qos=_text(rec.get("qos")))


def _tres_gpus(tres: str) -> int:
    """GPU count in a TRES string such as ``cpu=2,mem=2G,gres/gpu=4,gres/gpu:a100=4``."""
    for item in tres.split(","):
        key, _, value = item.partition("=")
        if key == "gres/gpu" and digits(value):
            return int(value)
    return 0


# ------------------------------------------------------------------------------------ scontrol text (admin fields)
_KEY = re.compile(r"^([A-Za-z][A-Za-z0-9_/:]*)=(.*)$", re.S)


def parse_kv_line(line: str) -> dict[str, str]:
    """Split one ``scontrol -o`` record into ``{Key: value}``; a word without ``Key=`` (spaces
    inside a value, e.g. ``OS=Linux 6.1 #1 SMP``) belongs to the previous value. Only for
    records users cannot write into (nodes, partitions): never for jobs."""
    fields: dict[str, str] = {}
    last = None
    for word in line.split(" "):
        match = _KEY.match(word)
        if match and ";" not in match.group(1):
            last = match.group(1)
            fields[last] = match.group(2)
        elif last is not None and word:
            fields[last] = (fields[last] + " " + word).strip()
    return fields


def parse_duration_s(value: str) -> Optional[int]:
    """Slurm duration ``[D-]HH:MM:SS`` / ``MM:SS`` / ``D-HH[:MM]`` / minutes to seconds;
    None if UNLIMITED, or not a duration (ASCII digits only, at most 32 characters: ``²`` or
    a 400-digit count of minutes is no duration Slurm prints)."""
    value = value.strip()
    if len(value) > 32 or not value.isascii():
        return None
    match = re.fullmatch(r"(?:(\d+)-)?(?:(\d+):)?(\d+):(\d+)", value)
    if match:
        days, hours, minutes, seconds = (int(g or 0) for g in match.groups())
        if match.group(1) is not None and match.group(2) is None:  # D-HH:MM
            days, hours, minutes, seconds = days, minutes, seconds, 0
        return ((days * 24 + hours) * 60 + minutes) * 60 + seconds
    match = re.fullmatch(r"(\d+)-(\d+)", value)  # D-HH
    if match:
        return (int(match.group(1)) * 24 + int(match.group(2))) * 3600
    return int(value) * 60 if digits(value) else None


# ------------------------------------------------------------------------------------ nodes, sprio
def parse_scontrol_nodes(text: str) -> list[Node]:
    """Parse ``scontrol -d -o show node``: GPUs configured (``Gres=gpu[:type]:N``, else
    ``CfgTRES`` gres/gpu) and allocated (``GresUsed``, else ``AllocTRES``) per node."""
    nodes = []
    for line in text.splitlines():
        if not line.startswith("NodeName="):
            continue
        kv = parse_kv_line(line)
        cfg = parse_gres(kv.get("Gres", ""))
        used = parse_gres(kv.get("GresUsed", ""))
        nodes.append(Node(
            name=kv["NodeName"],
            gpus=cfg.count if cfg else _tres_gpus(kv.get("CfgTRES", "")),
            gpus_alloc=used.count if used else _tres_gpus(kv.get("AllocTRES", "")),
            state=kv.get("State", "UNKNOWN").upper(),
            gpu_type=(cfg.gpu_type or "") if cfg else "",
            partitions=tuple(p for p in _text(kv.get("Partitions")).split(",") if p)))
    return nodes


def parse_nodes_json(text: str) -> list[Node]:
    """Parse the ``nodes`` list of ``sinfo --json`` (22.05) or ``scontrol --json show node``
    (24.11+): ``gres``/``gres_used`` strings, ``state`` as a string or a list of flags."""
    data = json.loads(text)
    errors = _json_errors(data)
    if errors:
        raise BackendError("node query reported: %s" % "; ".join(errors))
    nodes = []
    for rec in data.get("nodes") or []:
        cfg, used = parse_gres(_text(rec.get("gres"))), parse_gres(_text(rec.get("gres_used")))
        state = rec.get("state")
        state = "+".join(state) if isinstance(state, list) else _text(state)
        nodes.append(Node(name=_text(rec.get("name")), gpus=cfg.count if cfg else 0,
                          gpus_alloc=used.count if used else 0, state=state.upper() or "UNKNOWN",
                          gpu_type=(cfg.gpu_type or "") if cfg else "",
                          partitions=tuple(rec.get("partitions") or ())))
    return nodes


def parse_sprio(text: str) -> dict[int, int]:
    """Map job_id to its SiteFactor from ``sprio -h -o '%i|%Y|%S'`` (pending, not held jobs
    only; array task ids such as ``7_1`` are skipped)."""
    factors: dict[int, int] = {}
    for line in text.splitlines():
        parts = [p.strip() for p in line.split("|")]
        if len(parts) >= 3 and digits(parts[0]):
            try:
                factors[int(parts[0])] = int(float(parts[2]))
            except ValueError:
                continue
    return factors


# ------------------------------------------------------------------------------------ batched scontrol
# 22.05 reports a failed update on stderr as "<why> for job N" (N may carry "_task");
# client-side parse errors ("scontrol: error: ...", "Request aborted") name no job.
_JOB_ERROR = re.compile(r"^(?P<why>.*\S) for job (?P<job_id>\d+)(?:_\S*)?\s*$")


def parse_batch_errors(stderr: str) -> tuple[dict[int, str], list[str]]:
    """Split a batched ``scontrol``'s stderr into errors naming a job and the rest.

    Returns:
        (map from job_id to its error lines joined by "; ", error lines naming no job).
    """
    by_job: dict[int, list[str]] = {}
    loose: list[str] = []
    for line in (stderr or "").splitlines():
        line = line.strip()
        if not line:
            continue
        match = _JOB_ERROR.match(line)
        if match:
            by_job.setdefault(int(match.group("job_id")), []).append(match.group("why"))
        else:
            loose.append(line)
    return {job_id: "; ".join(whys) for job_id, whys in by_job.items()}, loose
