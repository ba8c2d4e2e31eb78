"""A stand-in for the parts of pyslurm 25.11's documented API that PyslurmBackend uses:
``Jobs.load()``/``Nodes.load()`` (dicts of id/name -> object), ``Job(id).modify(
JobSubmitDescription(**kw))``, ``Job(id).requeue()``, ``RPCError``. Attribute names follow
pyslurm's docstrings (``id``, ``state``, ``num_nodes``, ``gres_per_node`` dict, ``time_limit``
in minutes, ``admin_comment``, ``configured_gres``/``allocated_gres`` dicts ...).

Build one with ``make_fake(jobs, nodes)``; the returned module-like object records calls in
``.calls`` and can be told to fail with ``.fail_with = "message"``.
"""

from __future__ import annotations

import types
from typing import Any, Optional


class RPCError(Exception):
    """pyslurm.RPCError: a Slurm API call failed."""


def fake_job(job_id: int, state: str = "PENDING", **kw: Any) -> types.SimpleNamespace:
    base = dict(id=job_id, name="job%d" % job_id, user_name="alice", state=state, state_reason="Priority",
                priority=1000, partition="gpu", submit_time=1_700_000_000, eligible_time=1_700_000_000,
                start_time=None, end_time=None, time_limit=60, num_nodes=1, allocated_nodes=None,
                comment=None, admin_comment=None, gres_per_node={}, array_id=None, array_task_id=None,
                array_tasks_waiting=None, requeue_count=0)
    base.update(kw)
    return types.SimpleNamespace(**base)


def fake_node(name: str, gpus: int = 8, used: int = 0, gpu_key: str = "gpu", **kw: Any) -> types.SimpleNamespace:
    base = dict(name=name, state="IDLE" if not used else "MIXED", partitions=["gpu"],
                configured_gres={gpu_key: gpus}, allocated_gres={gpu_key: used} if used else {})
    base.update(kw)
    return types.SimpleNamespace(**base)


def make_fake(jobs: list[Any], nodes: list[Any], older: Optional[dict[str, dict[Any, dict[str, Any]]]] = None) -> Any:
    """``older``: {"job": {id: dict}, "node": {name: dict}} gives the module pyslurm's older
    ``job().get()`` / ``node().get()`` API (absent otherwise, as in a pyslurm without it)."""
    mod = types.SimpleNamespace(RPCError=RPCError, calls=[], fail_with=None, __version__="25.11.2")

    def check(what: str) -> None:
        mod.calls.append(what)
        if mod.fail_with:
            raise RPCError(mod.fail_with)

    class JobSubmitDescription:
        def __init__(self, **kwargs: Any) -> None:
            self.kwargs = kwargs

    class Job:
        def __init__(self, job_id: int) -> None:
            self.id = job_id

        def modify(self, changes: JobSubmitDescription) -> None:
            check("modify %d %s" % (self.id, sorted(changes.kwargs.items())))

        def requeue(self, hold: bool = False) -> None:
            check("requeue %d" % self.id)

        def release(self) -> None:
            check("release %d" % self.id)

        def hold(self, mode: Optional[str] = None) -> None:
            check("hold %d" % self.id if mode is None else "hold %d mode=%s" % (self.id, mode))

    class Jobs(dict):
        @classmethod
        def load(cls, preload_passwd_info: bool = False) -> "Jobs":
            check("Jobs.load")
            return cls({j.id: j for j in jobs})

    class Nodes(dict):
        @classmethod
        def load(cls) -> "Nodes":
            check("Nodes.load")
            return cls({n.name: n for n in nodes})

    mod.Job, mod.Jobs, mod.Nodes, mod.JobSubmitDescription = Job, Jobs, Nodes, JobSubmitDescription
    for kind, table in (older or {}).items():
        setattr(mod, kind, _older_api(kind, table, check))
    return mod


def _older_api(kind: str, table: dict[Any, dict[str, Any]], check: Any) -> Any:
    class Older:
        def get(self) -> dict[Any, dict[str, Any]]:
            check("%s().get" % kind)
            return table

    return Older


def fail(mod: Any, message: Optional[str]) -> None:
    mod.fail_with = message
