"""Backend over pyslurm 25.11's documented API (``Jobs.load()``, ``Nodes.load()``,
``Job(id).modify(JobSubmitDescription(...))``, ``Job(id).requeue()``).

The only module that touches pyslurm, and only lazily (or through an injected ``module``):
``import pyslurm`` without a reachable slurm.conf kills the interpreter. pyslurm's modify
ignores node counts, so the resize (``NumNodes=a-a`` plus the GPU request, in one RPC so the
job can never start half-resized) goes through ``scontrol update`` with the same runner and
argv builders as the CLI backend. ``pyslurm.RPCError`` is caught here and nowhere else.
"""

from __future__ import annotations

import importlib
import logging
import time
from dataclasses import replace
from typing import Any, Callable, Iterable, Optional

from pipeswift_slurm.core import token
from pipeswift_slurm.core.model import FINISHED_STATES, PENDING, ClusterView, Decision, GpuRequest, Job, Node
from pipeswift_slurm.slurm.backends import BackendError, applicable
from pipeswift_slurm.slurm.backends.slurm_cli import Runner, classify_error, read_site_factors, subprocess_runner
from pipeswift_slurm.slurm.backends.slurm_parse import decision_config, expand_hostlist, parse_gres
from pipeswift_slurm.slurm.backends.scontrol_argv import admin_comment_value, resize_fields, without_hold_mark

log = logging.getLogger(__name__)


def gres_dict_request(gres: Optional[dict[str, Any]]) -> GpuRequest:
    """GPU request from pyslurm's ``gres_per_node`` dict (``{"gpu": 2}``, ``{"gpu:a100": 4}``,
    25.11 may keep a ``gres/`` prefix in the key)."""
    for key, value in (gres or {}).items():
        req = parse_gres("%s:%s" % (key, value))
        if req is not None:
            return req
    return GpuRequest(count=0)


def _epoch(value: Any) -> Optional[float]:
    return float(value) if isinstance(value, (int, float)) and value > 0 else None


def job_from_pyslurm(pj: Any) -> Job:
    """Map one ``pyslurm.Job`` to a ``model.Job`` (same policies as the CLI parsers)."""
    state = str(pj.state or "").split("+")[0].upper()
    req = gres_dict_request(getattr(pj, "gres_per_node", None))
    num_nodes = int(pj.num_nodes or 1)
    comment, admin = pj.comment or "", pj.admin_comment or ""
    is_meta = bool(getattr(pj, "array_tasks_waiting", None)) and getattr(pj, "array_task_id", None) is None
    gpus = req.count * num_nodes
    limit_min = pj.time_limit if isinstance(pj.time_limit, int) else None
    return Job(
        job_id=int(pj.id), state=state, submit_time=_epoch(pj.submit_time) or 0.0,
        num_nodes=num_nodes, gpus=gpus, priority=int(pj.priority or 0), user=pj.user_name or "",
        name=pj.name or "", partition=pj.partition or "", state_reason=pj.state_reason or "",
        eligible_time=_epoch(pj.eligible_time),
        start_time=None if state == PENDING else _epoch(pj.start_time),
        end_time=_epoch(pj.end_time) if state in FINISHED_STATES else None,
        time_limit_s=limit_min * 60 if limit_min else None,
        opted_in=token.PROFILE_PREFIX in comment and not is_meta, comment=comment, admin_comment=admin,
        node_list=expand_hostlist(pj.allocated_nodes or "") if state != PENDING else (),
        gpu_request=req, config=decision_config(admin, int(pj.id)),
        restarts=int(getattr(pj, "requeue_count", 0) or 0))


def node_from_pyslurm(pn: Any) -> Node:
    """Map one ``pyslurm.Node``: GPUs from ``configured_gres`` / ``allocated_gres`` dicts."""
    cfg = gres_dict_request(pn.configured_gres)
    used = gres_dict_request(pn.allocated_gres)
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
        ours = token.encode_decision(decision.config, int(now), held=bool(decision.hold) if held is None else held)
        kwargs["admin_comment"] = admin_comment_value(job.admin_comment, ours, job.job_id) if job else ours
    return kwargs


class PyslurmBackend:
    """Backend over pyslurm (optional extra; must match the site's Slurm major.minor).

    Args:
        module: the pyslurm module (tests pass a fake); imported on first use if None.
        run: runner for the ``scontrol update`` resize and ``sprio`` (see SlurmCliBackend).
        partitions: manage only these partitions (None: all).
        clock: epoch seconds.
        read_site_factors: read ``Job.site_factor`` with one ``sprio`` call per snapshot.
    """

    name = "pyslurm"

    def __init__(self, module: Any = None, run: Runner = subprocess_runner,
                 partitions: Optional[Iterable[str]] = None, clock: Callable[[], float] = time.time,
                 read_site_factors: bool = True) -> None:
        self._module = module
        self._run = run
        self._partitions = frozenset(partitions) if partitions else None
        self._clock = clock
        self._read_site_factors = read_site_factors

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
        """One ``Jobs.load()``, one ``Nodes.load()`` (and one ``sprio``).

        Raises:
            BackendError: pyslurm raised RPCError (e.g. slurmctld unreachable).
        """
        now = self._clock()
        jobs = [job_from_pyslurm(pj) for pj in self._call("Jobs.load", self._ps.Jobs.load).values()]
        nodes = [node_from_pyslurm(pn) for pn in self._call("Nodes.load", self._ps.Nodes.load).values()]
        factors = self._site_factors()
        wanted = self._partitions
        jobs = [_with_site_factor(j, factors) for j in jobs
                if wanted is None or wanted.intersection(j.partition.split(","))]
        nodes = [n for n in nodes if wanted is None or wanted.intersection(n.partitions)]
        return ClusterView(now=now, nodes=tuple(nodes), jobs=tuple(jobs))

    def _site_factors(self) -> dict[int, int]:
        return read_site_factors(self._run) if self._read_site_factors else {}

    def apply(self, decision: Decision, job: Job) -> None:
        """Same contract as ``SlurmCliBackend.apply``.

        Raises:
            JobGone: the job finished, started or vanished since the snapshot.
            BackendError: slurmctld did not answer or refused the change.
        """
        if not applicable(decision, job):
            return
        try:
            self._apply(decision, job)
        except BackendError as exc:
            raise classify_error(exc, job.job_id) from exc

    def _apply(self, decision: Decision, job: Job) -> None:
        """Requeue, resize (``scontrol update``), then the rest through ``modify``. Holds as
        the CLI backend: the mark (``hold=1`` in the token) goes on before ``hold()``, and
        comes off only after ``release()``, so a job the controller held always says so
        and is always released by it. Only the admin ``hold()`` is called (a user-mode hold
        crashes pyslurm 24.11)."""
        ps = self._ps
        now = self._clock()
        if decision.requeue:
            self._call("requeue", lambda: ps.Job(job.job_id).requeue())
        if decision.config is not None:
            fields = resize_fields(decision.config, job)
            self._run(["scontrol", "update", "JobId=%d" % job.job_id, *fields])
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


def _with_site_factor(job: Job, factors: dict[int, int]) -> Job:
    return replace(job, site_factor=factors.get(job.job_id, 0))
