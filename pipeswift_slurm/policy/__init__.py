"""The Policy seam and the registry of policies by name.

A policy is pure: ``decide(view, profiles, estimator) -> decisions``. It reads the frozen
ClusterView, the profiles of opted-in jobs (map from job_id to JobProfile) and the
Estimator; it never does I/O, never reads the wall clock (``view.now``), and never
mutates its inputs. It acts only through the levers an admin has on Slurm: the size of a
pending job, its SiteFactor, its time limit, and (where enabled) requeue.

``scheduler`` names the Slurm scheduler behaviour the policy is meant to run under
("backfill" or "builtin"); the simulator configures its backend from it, as a site
would configure slurm.conf.
"""

from __future__ import annotations

import importlib
import inspect
from typing import Any, ClassVar, Mapping, Protocol

from pipeswift_slurm.core.model import ClusterView, Decision, JobProfile


class Policy(Protocol):
    name: ClassVar[str]
    scheduler: ClassVar[str]

    def decide(self, view: ClusterView, profiles: Mapping[int, JobProfile],
               estimator: Any) -> list[Decision]: ...


_REGISTRY = {
    "fifo": "pipeswift_slurm.policy.fifo:FifoPolicy",
    "slurm": "pipeswift_slurm.policy.slurm:SlurmPolicy",
    "sjf": "pipeswift_slurm.policy.sjf:SjfPolicy",
    "tiresias": "pipeswift_slurm.policy.tiresias:TiresiasPolicy",
    "pipeswift": "pipeswift_slurm.policy.pipeswift:PipeSwiftPolicy",
}


# Named knob sets: the label "BASE:NAME" runs policy BASE with these knobs (``pipeswift
# simulate --policy``, the demo, the benches). Any other "BASE:NAME" is BASE under that label.
PRESETS: dict[str, dict[str, Any]] = {
    # the switch-cost-gated levers on running jobs, as a site that allows requeue would run it
    "pipeswift:preempt": {"preempt": True, "reshape_running": True},
    # ablations: queue order and the wait bound only (the users' configs) ...
    "pipeswift:order": {"reconfigure": False},
    # ... and the best config at the user's GPU count (no resizing)
    "pipeswift:config": {"resize": False},
}


def policy_names() -> list[str]:
    return list(_REGISTRY)


def _policy_class(name: str) -> Any:
    module_name, _, attr = _REGISTRY[name].partition(":")
    return getattr(importlib.import_module(module_name), attr)


def knob_defaults(name: str) -> dict[str, Any]:
    """The knobs registered policy ``name`` takes, with their defaults."""
    params = inspect.signature(_policy_class(name)).parameters.values()
    return {p.name: p.default for p in params if p.default is not inspect.Parameter.empty}


def get_policy(name: str, **knobs: Any) -> Policy:
    """Instantiate a registered policy with its knobs.

    Raises:
        KeyError: unknown policy name (message lists the known ones).
    """
    if name not in _REGISTRY:
        raise KeyError("unknown policy %r; known: %s" % (name, ", ".join(_REGISTRY)))
    policy: Policy = _policy_class(name)(**knobs)
    return policy
