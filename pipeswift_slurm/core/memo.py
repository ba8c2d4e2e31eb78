"""Memoisation per profile object: work derived from a JobProfile (a plan key, a memo of
estimates) done once per profile object rather than once per call. Pure; imports only
``core.model``."""

from __future__ import annotations

import weakref
from typing import Any, Callable, TypeVar

from pipeswift_slurm.core.model import JobProfile

V = TypeVar("V")


def per_profile(memo: dict[int, tuple[Any, V]], profile: JobProfile, make: Callable[[JobProfile], V]) -> V:
    """``make(profile)``, worked out once per profile object: ``memo`` is keyed by its id
    (hashing nested dataclasses on every call is slow) and holds a weak reference to it, so
    an id is never mistaken for another object's, and the entry goes when the profile does
    (a controller that runs for weeks, or a simulation of many ticks, makes new profiles at
    every tick: kept, they were memory that only grew)."""
    key = id(profile)
    hit = memo.get(key)
    if hit is None or hit[0]() is not profile:

        def forget(dead: Any) -> None:
            if key in memo and memo[key][0] is dead:
                del memo[key]

        hit = memo[key] = (weakref.ref(profile, forget), make(profile))
    return hit[1]
