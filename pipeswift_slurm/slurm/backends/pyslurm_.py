"""Backend over pyslurm's API (``Jobs.load()``, ``Nodes.load()``, ``Job(id).modify(
JobSubmitDescription(...))``, ``hold()``/``release()``/``requeue()``), run live against
Slurm 24.11 with pyslurm 24.11.0 (tests/integration/test_backend_pyslurm_live.py).

The only module that touches pyslurm, and only lazily (or through an injected ``module``):
``import pyslurm`` without a reachable slurm.conf kills the interpreter. Each job becomes a
``squeue --json``-shaped record read by the CLI backend's own parser, so both backends map
fields by one rule. What pyslurm cannot do goes through the documented fallback, said once
in the log (the table in docs/slurm-backends.md):

- node counts: pyslurm's modify sets them only at submit (silently does nothing), so the
  resize (``NumNodes=a-a`` plus the GPU request, one RPC so the job never starts
  half-resized) is the CLI backend's ``scontrol update`` argv, run with the same runner;
  a move to another partition goes in that same update (``Partition=``; a job asking a GPU
  type is moved only where the nodes have it), so the size is checked against the
  partition it moves to;
- ``--gpus`` (per-job) requests and a node's used GPUs (``Job`` has only ``gres_per_node``;
  ``Node.allocated_gres`` is empty unless GPUs are tracked as TRES): read with pyslurm's own
  older API (``pyslurm.job().get()``, ``pyslurm.node().get()``: the same load RPCs);
- the site factor: written through modify, read with ``sprio`` (pyslurm cannot read it);
- a hold is always the admin one (``hold(mode="user")`` crashes pyslurm 24.11).

``pyslurm.RPCError`` (and the older API's ValueError) is caught here and nowhere else.
"""

from __future__ import annotations

import importlib
import json
import logging
import time
from dataclasses import replace
from typing import Any, Callable, Iterable, Mapping, Optional

from pipeswift_slurm.core import token
from pipeswift_slurm.core.model import ClusterView, Decision, GpuRequest, Job, Node
from pipeswift_slurm.slurm.backends import BackendError, applicable
from pipeswift_slurm.slurm.backends.slurm_cli import Runner, classify_error, in_partitions
from pipeswift_slurm.slurm.backends.slurm_cli import read_site_factors, run_update, subprocess_runner
from pipeswift_slurm.slurm.backends.slurm_parse import parse_gres, parse_squeue_json
from pipeswift_slurm.slurm.backends.scontrol_argv import admin_comment_value, check_move, size_fields
from pipeswift_slurm.slurm.backends.scontrol_argv import without_hold_mark
from pipeswift_slurm.policy.partitions import partition_gres_types
from pipeswift_slurm.slurm.backends.site_limits import LimitsReader, with_caps

log = logging.getLogger(__name__)

# what pyslurm cannot do, and what is used instead (each said once per process)
FALLBACKS = {
    "resize": "pyslurm cannot change a job's node count (it sets nodes only at submit): "
              "resizing with scontrol update NumNodes=a-a and the GPU request (a move to another "
              "partition, Partition=, in the same RPC)",
    "site_factor": "pyslurm cannot read a job's site factor: reading it with sprio",
    "first_look": "clearing psbatch's first-look begin time with scontrol update StartTime=now",
    "older_api": "pyslurm.Job has no per-job GPU request (--gpus) and Node.allocated_gres is empty "
                 "unless GPUs are TRES: reading both with pyslurm's older job()/node() API",
    "no_older_api": "this pyslurm has no job()/node() API: --gpus requests read as 0 GPUs and "
                    "used GPUs come from allocated_gres only",
}
_said: set[str] = set()


def say_fallback(what: str) -> None:
    """Log the fallback ``what`` (a FALLBACKS key) once per process."""
    if what not in _said:
        _said.add(what)
        log.info("%s", FALLBACKS[what])


def gres_text(gres: Optional[Mapping[str, Any]]) -> str:
    """pyslurm's GRES dict back to Slurm's spelling: ``{"gres/gpu:a100": 2}`` ->
    ``gres/gpu:a100:2`` (an ``IDX`` entry is ``{"count": n, "indexes": ...}``)."""
    items = []
    for key, value in (gres or {}).items():
        count = value.get("count") if isinstance(value, Mapping) else value
        items.append("%s:%s" % (key, count))
    return ",".join(items)


def gres_dict_request(gres: Optional[Mapping[str, Any]]) -> GpuRequest:
    """GPU request from a pyslurm GRES dict (``{"gpu": 2}``, ``{"gres/gpu:a100": 4}``)."""
    return parse_gres(gres_text(gres)) or GpuRequest(count=0)


def job_record(pj: Any, older: Optional[Mapping[str, Any]] = None) -> dict[str, Any]:
    """One ``pyslurm.Job`` as a ``squeue --json`` (22.05 names) record; ``older`` is the
    job's dict from ``pyslurm.job().get()`` (the raw ``tres_per_*`` strings)."""
    rec: dict[str, Any] = dict(
        job_id=pj.id, job_state=pj.state, node_count=pj.num_nodes, priority=pj.priority,
        user_name=pj.user_name, name=pj.name, partition=pj.partition, state_reason=pj.state_reason,
        submit_time=pj.submit_time, eligible_time=pj.eligible_time, start_time=pj.start_time,
        end_time=pj.end_time, time_limit=pj.time_limit, comment=pj.comment, admin_comment=pj.admin_comment,
        nodes=pj.allocated_nodes, array_task_string=pj.array_tasks_waiting, array_task_id=pj.array_task_id,
        restart_cnt=getattr(pj, "requeue_count", 0), account=getattr(pj, "account", None),
        qos=getattr(pj, "qos", None), tasks=getattr(pj, "ntasks", None),
        tres_per_node=gres_text(getattr(pj, "gres_per_node", None)))
    for name in ("tres_per_node", "tres_per_job", "tres_per_task", "tres_per_socket"):
        if older and older.get(name):
            rec[name] = older[name]
    return rec


def job_from_pyslurm(pj: Any, older: Optional[Mapping[str, Any]] = None) -> Job:
    """Map one ``pyslurm.Job`` to a ``model.Job`` with the CLI backend's parser."""
    jobs = parse_squeue_json(json.dumps({"jobs": [job_record(pj, older)]}, default=str))
    if not jobs:
        raise BackendError("pyslurm job %s could not be read" % getattr(pj, "id", "?"))
    return jobs[0]


def node_from_pyslurm(pn: Any, gres_used: Optional[Iterable[str]] = None) -> Node:
    """Map one ``pyslurm.Node``: GPUs from ``configured_gres``; used GPUs from
    ``allocated_gres``, else the older API's ``gres_used`` strings (``gpu:a100:2(IDX:0-1)``)."""
    cfg = gres_dict_request(pn.configured_gres)
    used = gres_dict_request(pn.allocated_gres)
    if not used.count and gres_used:
        used = parse_gres(",".join(gres_used)) or used
    return Node(name=pn.name, gpus=cfg.count, gpus_alloc=used.count,
                state=str(pn.state or "UNKNOWN").upper(), gpu_type=cfg.gpu_type or "",
                partitions=tuple(pn.partitions or ()))


def modify_kwargs(decision: Decision, now: float, job: Optional[Job] = None,
                  held: Optional[bool] = None) -> dict[str, Any]:
    """``JobSubmitDescription`` keywords for what pyslurm can change (all but the size).
    The decision token carries the hold mark ``held`` (default: whether the decision holds
    the job) and replaces only our own word of ``job``'s AdminComment."""
    kwargs: dict[str, Any] = {}
    if decision.time_limit_s is not None:
        kwargs["time_limit"] = max(1, -(-int(decision.time_limit_s) // 60))  # minutes, an int (a str raises)
    if decision.site_factor is not None:
        kwargs["site_factor"] = int(decision.site_factor)
    if decision.config is not None:
        mark = bool(decision.hold) if held is None else held
        ours = token.decision_token(decision.config, int(now), mark, job.admin_comment, job.gpus) if job else \
            token.encode_decision(decision.config, int(now), held=mark)
        kwargs["admin_comment"] = admin_comment_value(job.admin_comment, ours, job.job_id) if job else ours
    return kwargs


class PyslurmBackend:
    """Backend over pyslurm (optional extra; must match the site's Slurm major.minor).

    Args:
        module: the pyslurm module (tests pass a fake); imported on first use if None.
        run: runner for the ``scontrol update`` resize, ``sprio`` and the site limits
            (see SlurmCliBackend).
        partitions: manage only these partitions (None: all).
        clock: epoch seconds.
        read_site_factors: read ``Job.site_factor`` with one ``sprio`` call per snapshot.
        read_limits: read the site's limits once per snapshot (as SlurmCliBackend).
    """

    name = "pyslurm"

    def __init__(self, module: Any = None, run: Runner = subprocess_runner,
                 partitions: Optional[Iterable[str]] = None, clock: Callable[[], float] = time.time,
                 read_site_factors: bool = True, read_limits: bool = True) -> None:
        self._module = module
        self._run = run
        self._partitions = frozenset(partitions) if partitions else None
        self._clock = clock
        self._read_site_factors = read_site_factors
        self._limits = LimitsReader(run) if read_limits else None
        self._gres_types: dict[str, str] = {}  # partition -> its GRES type, from the last snapshot

    @property
    def _ps(self) -> Any:
        if self._module is None:
            self._module = importlib.import_module("pyslurm")
        return self._module

    def _call(self, what: str, fn: Callable[[], Any]) -> Any:
        try:
            return fn()
        except self._ps.RPCError as exc:
            raise BackendError("pyslurm %s: %s" % (what, exc)) from exc

    def snapshot(self) -> ClusterView:
        """``Jobs.load()`` and ``Nodes.load()``, the older API's job and node loads for the
        GPU fields the newer one lacks, one ``sprio`` and the site limits.

        Raises:
            BackendError: pyslurm raised RPCError (e.g. slurmctld unreachable).
        """
        now = self._clock()
        older_jobs, older_nodes = self._older("job"), self._older("node")
        jobs = [job_from_pyslurm(pj, older_jobs.get(pj.id))
                for pj in self._call("Jobs.load", self._ps.Jobs.load).values()]
        nodes = [node_from_pyslurm(pn, (older_nodes.get(pn.name) or {}).get("gres_used"))
                 for pn in self._call("Nodes.load", self._ps.Nodes.load).values()]
        factors = self._site_factors()
        jobs = [replace(j, site_factor=factors.get(j.job_id, 0)) for j in jobs
                if in_partitions(j.partition.split(","), self._partitions)]
        if self._limits is not None:
            jobs = with_caps(jobs, self._limits.read())
        self._gres_types = partition_gres_types(nodes)
        nodes = [n for n in nodes if in_partitions(n.partitions, self._partitions)]
        return ClusterView(now=now, nodes=tuple(nodes), jobs=tuple(jobs))

    def _older(self, kind: str) -> dict[Any, Mapping[str, Any]]:
        """``pyslurm.job().get()`` / ``pyslurm.node().get()`` (id/name -> dict), or {}
        when this pyslurm has no such API."""
        factory = getattr(self._ps, kind, None)
        if factory is None:
            say_fallback("no_older_api")
            return {}
        say_fallback("older_api")
        try:
            return self._call("%s().get" % kind, lambda: factory().get()) or {}
        except ValueError as exc:  # the older API raises ValueError for Slurm errors
            raise BackendError("pyslurm %s().get: %s" % (kind, exc)) from exc

    def _site_factors(self) -> dict[int, int]:
        if not self._read_site_factors:
            return {}
        say_fallback("site_factor")
        return read_site_factors(self._run)

    def apply(self, decision: Decision, job: Job) -> None:
        """Same contract as ``SlurmCliBackend.apply``.

        Raises:
            JobGone: the job finished, started or vanished since the snapshot.
            BackendError: slurmctld did not answer or refused the change.
        """
        if not applicable(decision, job):
            return
        check_move(decision, job, self._gres_types)
        try:
            self._apply(decision, job)
        except BackendError as exc:
            raise classify_error(exc, job.job_id) from exc

    def _apply(self, decision: Decision, job: Job) -> None:
        """Requeue, move and resize (``scontrol update``), then the rest through ``modify``. Holds as
        the CLI backend: the mark (``hold=1`` in the token) goes on before ``hold()``, and
        comes off only after ``release()``, so a job the controller held always says so
        and is always released by it. Only the admin ``hold()`` is called (a user-mode hold
        crashes pyslurm 24.11)."""
        ps = self._ps
        now = self._clock()
        if decision.requeue:
            self._call("requeue", lambda: ps.Job(job.job_id).requeue())
        if decision.config is not None or decision.partition is not None:
            fields = size_fields(decision, job)
            say_fallback("resize")
            run_update(self._run, ["scontrol", "update", "JobId=%d" % job.job_id, *fields])
        if token.first_look_pending(job, now):
            say_fallback("first_look")
            run_update(self._run, ["scontrol", "update", "JobId=%d" % job.job_id, "StartTime=now"])
        if decision.hold is False:
            before = modify_kwargs(replace(decision, site_factor=None), now, job, held=True)
            self._modify(job.job_id, before)
            self._call("release", lambda: ps.Job(job.job_id).release())
            after = modify_kwargs(Decision(job.job_id, config=decision.config, site_factor=decision.site_factor),
                                  now, job, held=False)
            if decision.config is None:
                unmarked = without_hold_mark(job.admin_comment, job.job_id)
                after.update({"admin_comment": unmarked} if unmarked else {})
            self._modify(job.job_id, after)
            return
        if decision.hold and decision.config is None:
            raise BackendError("job %d: a hold needs the decision's config to mark it as the controller's; "
                               "not held" % job.job_id)
        self._modify(job.job_id, modify_kwargs(decision, now, job))
        if decision.hold:
            self._call("hold", lambda: ps.Job(job.job_id).hold())

    def _modify(self, job_id: int, kwargs: dict[str, Any]) -> None:
        if kwargs:
            ps = self._ps
            log.info("job %d: modify %s", job_id, sorted(kwargs))
            self._call("modify", lambda: ps.Job(job_id).modify(ps.JobSubmitDescription(**kwargs)))
