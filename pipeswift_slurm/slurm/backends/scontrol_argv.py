"""What a Decision becomes as ``scontrol`` commands: the move to another partition and the
resize fields in the job's own GRES spelling (one RPC), the update with its decision token,
requeue, hold and release in a safe order, and the stdin text of a batch of them. Pure: builds argv lists, runs nothing; every value is one
argv word (whitespace is refused), so no user text ever reaches a shell.
"""

from __future__ import annotations

import dataclasses
import logging
import re
from typing import Mapping, Optional, Sequence

from pipeswift_slurm.core import token
from pipeswift_slurm.core.model import Decision, ExecConfig, GpuRequest, Job
from pipeswift_slurm.slurm.backends import BackendError

log = logging.getLogger(__name__)


def gres_value(req: GpuRequest, count: int) -> str:
    """``gres:gpu[:type]:count`` in the job's own spelling family (``gres/`` for 24.11+ jobs);
    the type is kept because 22.05 rejects switching between typed and untyped GRES."""
    kind = "gpu" if not req.gpu_type else "gpu:" + req.gpu_type
    return "%s%s:%d" % ("gres/" if req.slash else "gres:", kind, count)


def resize_fields(config: ExecConfig, job: Job) -> list[str]:
    """``NumNodes=a-a`` (always min-max: 22.05 rejects a bare count above the old maximum) and
    the GPU request in the job's own field (per node, or per job for ``--gpus`` jobs).

    Raises:
        BackendError: the job asks for no GPUs (it is never given any), the config has no
            per-node GPU count, or the job asks GPUs per task or per socket (those requests
            are not resized).
    """
    if job.gpu_request.count <= 0:
        raise BackendError("job %d asks for no GPUs; it is never given any (not resized to %s)"
                           % (job.job_id, config.short()))
    nodes = max(1, config.num_nodes)
    per_node = config.gpus_per_node or (config.gpus // nodes if config.gpus % nodes == 0 else 0)
    if per_node <= 0:
        raise BackendError("job %d: config %s has no whole GPU count per node" % (job.job_id, config.short()))
    req = job.gpu_request
    if req.field == "tres_per_job":
        gpu_field = "TresPerJob=" + gres_value(req, nodes * per_node)
    elif req.field == "tres_per_node":
        gpu_field = "TresPerNode=" + gres_value(req, per_node)
    else:
        raise BackendError("job %d asks GPUs via %s; only per-node or per-job requests are resized"
                           % (job.job_id, req.field))
    return ["NumNodes=%d-%d" % (nodes, nodes), gpu_field]


def check_move(decision: Decision, job: Job, gres_types: Mapping[str, str]) -> None:
    """Refuse to move (``decision.partition``) a job that asked for a GPU type
    (``gpu:a100:4``) to a partition whose nodes report another one (``gres_types``: map from
    partition to its one GRES type, ``partition_check.partition_gres_types``; a partition
    missing there has none or several). The user asked for that hardware; and Slurm 22.05
    leaves a pending job whose GRES type was changed never runnable (BadConstraints, seen
    live), so a request is never retyped.

    Raises:
        BackendError: the job asks for typed GPUs that ``partition`` does not have.
    """
    asked, partition = job.gpu_request.gpu_type, decision.partition
    if partition is not None and asked and gres_types.get(partition) != asked:
        raise BackendError("job %d asks for gpu:%s GPUs and partition %s's nodes report %s; not moved"
                           % (job.job_id, asked, partition, gres_types.get(partition) or "no one GPU type"))


def size_fields(decision: Decision, job: Job) -> list[str]:
    """The fields of one ``scontrol update`` that set where and on how much the job runs:
    ``Partition=P`` for a move, then the resize (``resize_fields``). Slurm 22.05 and 24.11
    apply the partition before the size in one update (a size valid only in the new
    partition is taken; seen live on both).

    Raises:
        BackendError: an odd partition name, or as ``resize_fields``.
    """
    fields = []
    if decision.partition is not None:
        try:
            names = token.partition_names(decision.partition, "partition")
        except token.TokenError as exc:
            raise BackendError("job %d: %s; not moved" % (job.job_id, exc)) from None
        if len(names) != 1:
            raise BackendError("job %d: a job is moved to one partition, not %r" % (job.job_id, decision.partition))
        fields.append("Partition=" + names[0])
    if decision.config is not None:
        fields += resize_fields(decision.config, job)
    return fields


def _argv_value(name: str, value: str) -> str:
    if not value or any(ch.isspace() for ch in value):
        raise BackendError("refusing %s value with whitespace or empty: %r" % (name, value))
    return "%s=%s" % (name, value)


# Slurm refuses a longer AdminComment (job_mgr's 1024-character string check).
ADMIN_COMMENT_MAX_CHARS = 1024
_OUR_WORD = re.compile(r"(?:^|\s)%s\S*" % re.escape(token.DECISION_PREFIX))


def admin_comment_value(existing: str, ours: str, job_id: int) -> str:
    """The AdminComment to write: our decision token ``ours`` (first, so readers find it
    first) and the text of ``existing`` that is not ours (other admins' notes), unchanged.
    Other text is dropped, with a log line, when it holds control characters (it could
    not travel as one argv word) or when both together pass ``ADMIN_COMMENT_MAX_CHARS``."""
    others = _OUR_WORD.sub("", existing).strip()
    if not others:
        return ours
    if not others.isprintable():
        log.warning("job %d: AdminComment text that is not ours holds control characters; replaced by our token",
                    job_id)
        return ours
    merged = "%s %s" % (ours, others)
    if len(merged) > ADMIN_COMMENT_MAX_CHARS:
        log.warning("job %d: AdminComment would pass Slurm's %d characters; kept our token, dropped the other "
                    "%d characters: %.80r", job_id, ADMIN_COMMENT_MAX_CHARS, len(others), others)
        return ours
    return merged


def without_hold_mark(existing: str, job_id: int) -> Optional[str]:
    """``existing`` with our decision token's hold mark removed (None: no mark to remove)."""
    match = _OUR_WORD.search(existing)
    if match is None or not token.held_by_controller(existing):
        return None
    word = match.group().strip()
    unmarked = ";".join(item for item in word.split(";") if item != "hold=1")
    return admin_comment_value(existing, unmarked, job_id)


def _admin_comment_field(value: str) -> str:
    if not value or not value.isprintable():
        raise BackendError("refusing AdminComment value that is empty or holds control characters: %r" % value)
    return "AdminComment=" + value


def update_argv(decision: Decision, job: Job, now: float, held: Optional[bool] = None,
                site_factor: bool = True) -> Optional[list[str]]:
    """The ``scontrol update JobId=N ...`` argv for a decision, or None if it changes nothing
    an update can (a requeue alone). ``now`` (epoch s) stamps the decision token; ``held``
    is the hold mark the token carries (default: whether the decision holds the job);
    ``site_factor`` False leaves the SiteFactor to a later command. The token replaces only
    our own word of the job's AdminComment (``admin_comment_value``)."""
    fields = size_fields(decision, job)
    if decision.time_limit_s is not None:
        fields.append("TimeLimit=%d" % max(1, -(-int(decision.time_limit_s) // 60)))
    if decision.site_factor is not None and site_factor:
        fields.append("SiteFactor=%d" % int(decision.site_factor))
    if token.first_look_pending(job, now):
        fields.append("StartTime=now")  # the first look is done: psbatch's begin time goes
    if decision.config is not None:
        mark = bool(decision.hold) if held is None else held
        ours = token.decision_token(decision.config, int(now), mark, job.admin_comment, job.gpus)
        fields.append(_admin_comment_field(admin_comment_value(job.admin_comment, ours, job.job_id)))
    return ["scontrol", "update", "JobId=%d" % job.job_id, *fields] if fields else None


def requeue_argv(job_id: int) -> list[str]:
    """``scontrol requeue N``: stop a running job and put it back in the queue."""
    return ["scontrol", "requeue", str(int(job_id))]


def apply_argvs(decision: Decision, job: Job, now: float) -> list[list[str]]:
    """Every command a decision needs, in order. A requeue comes first (the job must be
    pending again before it can be resized). A hold is one update that marks the job as
    ours (``hold=1`` in the token) and holds it (``Priority=0``: an admin hold, Reason
    JobHeldAdmin, the same RPC as ``scontrol hold``), so a held job always carries the mark
    and the controller can always release it. A release keeps the mark until the job is
    released: resize (mark kept), ``scontrol release``, then the SiteFactor (Slurm refuses
    priority changes on a held job) and the token without the mark.

    Raises:
        BackendError: a hold with nothing to mark it with (no config, no token of ours).
    """
    argvs = [requeue_argv(job.job_id)] if decision.requeue else []
    if decision.hold:
        if decision.config is None:
            raise BackendError("job %d: a hold needs the decision's config to mark it as the controller's; "
                               "not held" % job.job_id)
        update = update_argv(decision, job, now, held=True)
        assert update is not None
        return argvs + [update + ["Priority=0"]]
    if decision.hold is False:
        first = update_argv(_without_site_factor(decision), job, now, held=True)
        argvs += [first] if first else []
        argvs.append(["scontrol", "release", str(int(job.job_id))])
        last = update_argv(_only_mark(decision), job, now, held=False)
        if decision.config is None:
            unmarked = without_hold_mark(job.admin_comment, job.job_id)
            last = (last or ["scontrol", "update", "JobId=%d" % job.job_id]) + (
                [_admin_comment_field(unmarked)] if unmarked else [])
        argvs += [last] if last and len(last) > 3 else []
        return argvs
    update = update_argv(decision, job, now)
    return argvs + ([update] if update else [])


def _without_site_factor(decision: Decision) -> Decision:
    return dataclasses.replace(decision, site_factor=None)


def _only_mark(decision: Decision) -> Decision:
    """The part of a release that follows ``scontrol release``: SiteFactor and the token."""
    return Decision(decision.job_id, config=decision.config, site_factor=decision.site_factor)


def batchable(argv: Sequence[str]) -> bool:
    """Whether ``argv`` can be a line of ``batch_text`` (no word holds whitespace; an
    AdminComment that keeps another admin's note with spaces runs as its own command)."""
    return all(w and not any(c.isspace() for c in w) for w in argv[1:])


SCONTROL_BATCH_ARGV = ["scontrol"]
BATCH_MAX_LINES = 1000  # commands per scontrol process: bounds a batch's run time and re-runs
# scontrol processes fed at once: slurmctld serialises the updates, but each client spends
# as long again on its own side (credential, connect), which runs in parallel (measured on
# 22.05: 500 updates take about half as long with 4 processes as with 1).
BATCH_PROCESSES = 4


def batch_text(argvs: Sequence[list[str]]) -> str:
    """The stdin of one ``scontrol`` process running ``argvs`` (each ``["scontrol", ...]``),
    one command a line. Our values never hold whitespace (``_argv_value`` refuses it), so a
    line splits back into exactly the argv it came from.

    Raises:
        BackendError: an argv is not an ``scontrol`` command, or a word holds whitespace.
    """
    lines = []
    for argv in argvs:
        if argv[:1] != ["scontrol"] or any(not w or any(c.isspace() for c in w) for w in argv[1:]):
            raise BackendError("cannot batch %r" % (argv,))
        lines.append(" ".join(argv[1:]))
    return "".join(line + "\n" for line in lines)


