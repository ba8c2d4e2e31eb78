"""The Backend seam: what the controller needs from a Slurm-like cluster.

``snapshot()`` returns a frozen ClusterView (one batched query, never a call per job);
``apply(decision, job)`` changes one PENDING job (or requeues a running one when asked),
using the form the job was submitted with. Backends never contain policy names.
Implementations: ``cli`` (Slurm commands), ``pyslurm`` (optional), ``sim`` (in memory).
Each is imported lazily by ``get_backend``; nothing here imports pyslurm.
"""

from __future__ import annotations

import importlib
import logging
from typing import Any, Callable, Protocol

from pipeswift_slurm.core.model import ClusterView, Decision, Job

log = logging.getLogger(__name__)


class BackendError(RuntimeError):
    """The cluster could not be read or changed (e.g. slurmctld not answering)."""


class JobGone(BackendError):
    """The job finished, was cancelled or left PENDING between observe and act."""


class OutcomeUnknown(BackendError):
    """Slurm was asked to change a job but did not say whether it did (the command timed
    out): the controller reads the job back on its next tick and records what it shows."""


def releases_own_hold(decision: Decision) -> bool:
    """A decision that only releases the controller's own hold: allowed whatever the job's
    opt-in says now (a hold the controller set is always its own to release)."""
    return decision.hold is False and decision.config is None and decision.site_factor is None \
        and decision.time_limit_s is None and not decision.requeue and decision.partition is None


def applicable(decision: Decision, job: Job) -> bool:
    """The guard every real backend runs before changing a job: a job that is not opted in
    is never changed (False, logged); resizing or moving a job that is no longer PENDING
    raises.

    Raises:
        JobGone: a resize or a partition move for a job that started or finished since
            the snapshot.
    """
    if not job.opted_in and not releases_own_hold(decision):
        log.warning("job %d is not opted in to pipeswift; not changing it", job.job_id)
        return False
    if (decision.config is not None or decision.partition is not None) and not job.pending \
            and not decision.requeue:
        raise JobGone("job %d is %s, not PENDING: not %s" % (job.job_id, job.state,
                                                               "resized" if decision.config else "moved"))
    return True


class Backend(Protocol):
    name: str

    def snapshot(self) -> ClusterView: ...

    def apply(self, decision: Decision, job: Job) -> None: ...


# name -> "module:factory"; factories take keyword options and return a Backend.
_REGISTRY = {
    "cli": "pipeswift_slurm.slurm.backends.slurm_cli:SlurmCliBackend",
    "pyslurm": "pipeswift_slurm.slurm.backends.pyslurm_:PyslurmBackend",
    "sim": "pipeswift_slurm.slurm.backends.sim:SimBackend",
}


def backend_names() -> list[str]:
    return ["auto", *sorted(_REGISTRY)]


def _load(name: str) -> Callable[..., Any]:
    module_name, _, attr = _REGISTRY[name].partition(":")
    return getattr(importlib.import_module(module_name), attr)  # type: ignore[no-any-return]


def get_backend(name: str = "auto", **options: Any) -> Backend:
    """Build a backend by name. ``auto``: pyslurm when it imports and matches the running
    Slurm, else the Slurm commands when ``squeue`` is on PATH.

    Raises:
        BackendError: unknown name, or no usable backend for ``auto``.
    """
    if name == "auto":
        from pipeswift_slurm.slurm.backends.detect import detect_backend

        name = detect_backend()
    if name not in _REGISTRY:
        raise BackendError("unknown backend %r; choose one of %s" % (name, ", ".join(backend_names())))
    backend: Backend = _load(name)(**options)
    return backend
