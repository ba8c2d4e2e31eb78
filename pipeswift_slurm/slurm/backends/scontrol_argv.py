"""What a Decision becomes as ``scontrol`` commands: the resize fields in the job's own GRES
spelling, the update with its decision token, requeue, hold and release in a safe order, and
the stdin text of a batch of them. Pure: builds argv lists, runs nothing; every value is one
argv word (whitespace is refused), so no user text ever reaches a shell.
"""

from __future__ import annotations

from typing import Optional, Sequence

from pipeswift_slurm.core import token
from pipeswift_slurm.core.model import Decision, ExecConfig, GpuRequest, Job
from pipeswift_slurm.slurm.backends import BackendError


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


def _argv_value(name: str, value: str) -> str:
    if not value or any(ch.isspace() for ch in value):
        raise BackendError("refusing %s value with whitespace or empty: %r" % (name, value))
    return "%s=%s" % (name, value)


def update_argv(decision: Decision, job: Job, now: float) -> Optional[list[str]]:
    """The ``scontrol update JobId=N ...`` argv for a decision, or None if it changes nothing
    an update can (a requeue alone). ``now`` (epoch s) stamps the decision token."""
    fields: list[str] = []
    if decision.config is not None:
        fields += resize_fields(decision.config, job)
    if decision.time_limit_s is not None:
        fields.append("TimeLimit=%d" % max(1, -(-int(decision.time_limit_s) // 60)))
    if decision.site_factor is not None:
        fields.append("SiteFactor=%d" % int(decision.site_factor))
    if decision.config is not None:
        fields.append(_argv_value("AdminComment", token.encode_decision(decision.config, int(now),
                                                                        held=bool(decision.hold))))
    return ["scontrol", "update", "JobId=%d" % job.job_id, *fields] if fields else None


def requeue_argv(job_id: int) -> list[str]:
    """``scontrol requeue N``: stop a running job and put it back in the queue."""
    return ["scontrol", "requeue", str(int(job_id))]


def apply_argvs(decision: Decision, job: Job, now: float) -> list[list[str]]:
    """Every command a decision needs, in order: requeue first (the job must be pending
    again before it can be resized), then the update."""
    argvs = [requeue_argv(job.job_id)] if decision.requeue else []
    if decision.hold:  # hold before resizing, so the job cannot start in between
        argvs.append(["scontrol", "hold", str(int(job.job_id))])
    update = update_argv(decision, job, now)
    argvs += [update] if update else []
    if decision.hold is False:  # release last: the job becomes eligible at its new size
        argvs.append(["scontrol", "release", str(int(job.job_id))])
    return argvs


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


