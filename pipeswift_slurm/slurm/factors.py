"""Stable SiteFactors: the controller turns the order a policy's SiteFactors express into
factors that change as few pending jobs as possible from tick to tick (each change is
one ``scontrol update``). A controller concern, not a policy's: every policy that ranks
jobs gets it, in cron and in the simulator alike. Pure.
"""

from __future__ import annotations

import bisect
from typing import Mapping, Optional, Sequence

from pipeswift_slurm.policy.common import RANK_STEP

MIN_FACTOR_GAP = 2_000  # > 2x PriorityWeightAge's default reach, so age cannot swap neighbours


def longest_descending(order: Sequence[int], current: Mapping[int, int]) -> set[int]:
    """Job ids of a longest chain along ``order`` whose current factors strictly decrease
    by at least MIN_FACTOR_GAP (patience sorting on negated factors, O(n log n))."""
    tails: list[int] = []  # tails[k] = smallest negated factor ending a chain of length k+1
    tail_ids: list[int] = []
    parent: dict[int, Optional[int]] = {}
    for job_id in order:
        if job_id not in current:
            continue
        value = -current[job_id]
        k = bisect.bisect_left(tails, value - MIN_FACTOR_GAP + 1)
        while k > 0 and tails[k - 1] > value - MIN_FACTOR_GAP:
            k -= 1
        parent[job_id] = tail_ids[k - 1] if k > 0 else None
        if k == len(tails):
            tails.append(value)
            tail_ids.append(job_id)
        elif value < tails[k]:
            tails[k], tail_ids[k] = value, job_id
    chain: set[int] = set()
    node = tail_ids[-1] if tail_ids else None
    while node is not None:
        chain.add(node)
        node = parent[node]
    return chain


def stable_factors(order: Sequence[int], current: Mapping[int, int], top: int) -> dict[int, int]:
    """SiteFactors that realise ``order`` (first = highest) while changing as few jobs as
    possible: jobs whose current factors are already in order keep them, the others are
    spread into the gaps; when a gap is too narrow, every job gets fresh rank factors.
    Fewer changes mean fewer ``scontrol update`` calls per tick."""
    keep = longest_descending(order, current)
    out: dict[int, int] = {}
    upper, pending_ids = top + MIN_FACTOR_GAP, []
    for job_id in [*order, None]:
        if job_id is not None and job_id not in keep:
            pending_ids.append(job_id)
            continue
        lower = current[job_id] if job_id is not None else -MIN_FACTOR_GAP
        if pending_ids:
            gap = (upper - lower) // (len(pending_ids) + 1)
            if gap < MIN_FACTOR_GAP:
                return centred_factors(order, top)
            for i, pid in enumerate(pending_ids):
                out[pid] = upper - gap * (i + 1)
            pending_ids = []
        if job_id is not None:
            out[job_id] = current[job_id]
            upper = current[job_id]
    if any(v < 0 or v > top for v in out.values()):
        return centred_factors(order, top)
    return out


def centred_factors(order: Sequence[int], top: int) -> dict[int, int]:
    """Fresh factors RANK_STEP apart, centred in [0, top] so later insertions above and
    below the block fit without renumbering it."""
    step = min(RANK_STEP, max(1, top // (len(order) + 1)))
    first = min(top, top // 2 + step * len(order) // 2)
    return {job_id: max(0, first - i * step) for i, job_id in enumerate(order)}
