"""Memoisation per profile object: work derived from a JobProfile (a plan key, a memo of
estimates) done once per profile object rather than once per call. Pure; imports only
``core.model``."""

from __future__ import annotations

from typing import Callable, TypeVar

from pipeswift_slurm.core.model import JobProfile

V = TypeVar("V")


def per_profile(memo: dict[int, tuple[JobProfile, V]], profile: JobProfile,
                make: Callable[[JobProfile], V]) -> V:
    """``make(profile)``, worked out once per profile object: ``memo`` is keyed by its id and
    keeps the profile, so the id cannot be reused (hashing nested dataclasses on every
    call is slow)."""
    hit = memo.get(id(profile))
    if hit is None or hit[0] is not profile:
        hit = memo[id(profile)] = (profile, make(profile))
    return hit[1]
