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
from dataclasses import asdict
from typing import Any, ClassVar, Mapping, Optional, Protocol

from pipeswift_slurm.core.estimator import EstimatorProtocol
from pipeswift_slurm.core.model import ClusterView, Decision, JobProfile
from pipeswift_slurm.policy.knobs import (KnobError, NoKnobs, PipeSwiftKnobs, SjfKnobs, TiresiasKnobs, knob_fields,
                                          make_knobs, parse_knob)


class Policy(Protocol):
    """What the controller and the simulator need of a policy.

    ``site_factor_max``: the highest SiteFactor it sets (0 when it sets none);
    ``preempts``: whether it may requeue running jobs (the simulator then keeps ticking).
    """

    name: ClassVar[str]
    scheduler: ClassVar[str]

    @property
    def site_factor_max(self) -> int: ...

    @property
    def preempts(self) -> bool: ...

    def decide(self, view: ClusterView, profiles: Mapping[int, JobProfile],
               estimator: EstimatorProtocol) -> list[Decision]: ...


# name -> ("module:Class", its knob dataclass)
_REGISTRY: dict[str, tuple[str, type]] = {
    "fifo": ("pipeswift_slurm.policy.fifo:FifoPolicy", NoKnobs),
    "slurm": ("pipeswift_slurm.policy.slurm:SlurmPolicy", NoKnobs),
    "sjf": ("pipeswift_slurm.policy.sjf:SjfPolicy", SjfKnobs),
    "tiresias": ("pipeswift_slurm.policy.tiresias:TiresiasPolicy", TiresiasKnobs),
    "pipeswift": ("pipeswift_slurm.policy.pipeswift:PipeSwiftPolicy", PipeSwiftKnobs),
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


def _known(name: str) -> tuple[str, type]:
    if name not in _REGISTRY:
        raise KeyError("unknown policy %r; known: %s" % (name, ", ".join(_REGISTRY)))
    return _REGISTRY[name]


def _policy_class(name: str) -> Any:
    module_name, _, attr = _known(name)[0].partition(":")
    return getattr(importlib.import_module(module_name), attr)


def knob_class(name: str) -> type:
    """The knob dataclass of registered policy ``name``."""
    return _known(name)[1]


def knob_defaults(name: str) -> dict[str, Any]:
    """The knobs registered policy ``name`` takes, with their defaults (its dataclass's fields)."""
    return asdict(knob_class(name)())


def make_policy_knobs(name: str, values: Mapping[str, Any]) -> Any:
    """Policy ``name``'s knob dataclass with ``values`` over the defaults, each checked.

    Raises:
        KeyError: unknown policy name.
        KnobError: unknown knob, or a value of the wrong type or range (names the knob).
    """
    cls = knob_class(name)
    try:
        return make_knobs(cls, values)
    except KnobError as exc:
        raise KnobError("%s %s" % (name, exc)) from None


def parse_policy_knob(name: str, knob: str, text: str) -> Any:
    """Knob ``knob`` of policy ``name`` from command-line text, checked (``parse_knob``)."""
    return parse_knob(knob_class(name), knob, text)


def wait_bound_of(policy: Any) -> Optional[float]:
    """The wait bound (seconds) a policy keeps: its knob ``wait_bound_s``; None for a policy
    whose knobs have none (it promises no bound)."""
    bound = getattr(getattr(policy, "knobs", None), "wait_bound_s", None)
    return float(bound) if isinstance(bound, (int, float)) else None


def get_policy(name: str, **knobs: Any) -> Policy:
    """Instantiate a registered policy with its knobs (checked by ``make_policy_knobs``).

    Raises:
        KeyError: unknown policy name (message lists the known ones).
        KnobError: a knob it does not have, or a bad value.
    """
    policy: Policy = _policy_class(name)(make_policy_knobs(name, knobs))
    return policy


__all__ = ["KnobError", "PRESETS", "Policy", "get_policy", "knob_class", "knob_defaults", "knob_fields",
           "make_policy_knobs", "parse_policy_knob", "policy_names", "wait_bound_of"]
