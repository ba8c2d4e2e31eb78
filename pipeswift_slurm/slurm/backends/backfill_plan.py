"""Slurm's sched/backfill reservation search, for the sim backend (pure: lists in, answers out).

A backfill pass tests up to ``bf_max_job_test`` blocked jobs; each that cannot start now
reserves whole nodes from its earliest start. Done naively, every job tests every future
time against every reservation made before it in the pass: with thousands of pending jobs
(Philly b436b2 day 42: 6,127 jobs in a week) that is cubic in the queue and a week took
most of an hour. Two exact shortcuts keep the answers and drop the work:

- ``earliest_start`` walks the times in order, and a job's rounded plan only moves later,
  so each reservation is counted on its nodes once, when it starts to overlap the plan,
  and dropped for good once it ends by the plan's start.
- ``Floor``: within one pass nodes only get busier, so a job of the same node shape with a
  limit at least as long as an earlier one's cannot start before that one's earliest start.
"""

from __future__ import annotations

import bisect
import heapq
import math
from operator import itemgetter
from typing import Optional, Sequence

Reservation = tuple[float, float, frozenset[int]]  # (start, end, nodes), rounded to bf_resolution
start_of = itemgetter(0)  # reservations are kept sorted by start


def place(free: Sequence[int], nodes: int, per_node: int,
          allowed: Optional[frozenset[int]] = None) -> Optional[tuple[int, ...]]:
    """Best fit: the ``nodes`` nodes (of ``allowed``; None: any) with the fewest free GPUs
    that still hold ``per_node``; None when too few do."""
    fitting = [i for i, f in enumerate(free) if f >= per_node and (allowed is None or i in allowed)]
    if len(fitting) < nodes:
        return None
    fitting.sort(key=lambda i: (free[i], i))
    return tuple(sorted(fitting[:nodes]))


def unreserved(free: list[int], reserved: Sequence[Reservation], start_s: float, end_s: float) -> list[int]:
    """``free`` with every node that a reservation holds within [start_s, end_s] at 0 (a
    job starting now overlaps a reservation that begins at its end; a planned start,
    rounded, does not: ``earliest_start``; Slurm's two tests differ)."""
    for res_start, res_end, held in reserved:
        if res_start <= end_s and res_end > start_s:
            for node in held:
                free[node] = 0
    return free


def rounded(start_s: float, end_s: float, resolution_s: float) -> tuple[float, float]:
    """A planned start and end rounded down to bf_resolution (none when it is 0)."""
    if not resolution_s:
        return start_s, end_s
    return math.floor(start_s / resolution_s) * resolution_s, math.floor(end_s / resolution_s) * resolution_s


def earliest_start(free_now: Sequence[int], ends: Sequence[tuple[float, int, int, tuple[int, ...]]],
                   reserved: Sequence[Reservation], now: float, limit_s: float, nodes: int, per_node: int,
                   allowed: Optional[frozenset[int]], resolution_s: float, window_s: float,
                   not_before: Optional[float] = None) -> tuple[float, Optional[tuple[int, ...]]]:
    """The earliest time from ``now`` (and from ``not_before``, known not to fit before:
    ``Floor``) within ``window_s`` (bf_window) at which a job of ``nodes`` x ``per_node``
    GPUs and time limit ``limit_s`` fits, and the nodes it gets then; (inf, None) if none.
    ``free_now``: free GPUs by node; ``ends``: running jobs as (end, job id, GPUs per node,
    nodes), sorted, ending at their limits; ``reserved``: this pass's reservations, sorted
    by start (``start_of``; the pass inserts them so)."""
    if not_before == math.inf:
        return math.inf, None
    times = sorted({e[0] for e in ends} | {r[1] for r in reserved if r[1] > now})
    held = [0] * len(free_now)  # reservations holding each node during the plan
    holding: list[tuple[float, int]] = []  # (end, index in reserved) of those counted
    free = list(free_now)
    k = added = 0
    for t in times if not_before is None else times[bisect.bisect_left(times, not_before):]:
        if t - now > window_s:
            break
        while k < len(ends) and ends[k][0] <= t:
            for node in ends[k][3]:
                free[node] += ends[k][2]
            k += 1
        start_s, end_s = rounded(t, t + limit_s, resolution_s)  # Slurm tests the rounded plan
        while added < len(reserved) and reserved[added][0] < end_s:
            if reserved[added][1] > start_s:
                heapq.heappush(holding, (reserved[added][1], added))
                for node in reserved[added][2]:
                    held[node] += 1
            added += 1
        while holding and holding[0][0] <= start_s:
            for node in reserved[heapq.heappop(holding)[1]][2]:
                held[node] -= 1
        placement = place([0 if h else f for f, h in zip(free, held)], nodes, per_node, allowed)
        if placement is not None:
            return t, placement
    return math.inf, None


class Floor:
    """Within one backfill pass, the earliest starts found for jobs of one node shape
    (nodes, GPUs per node, partition), by time limit. Later in the pass nodes only get
    busier (jobs start, reservations are added) and a longer limit overlaps more
    reservations, so a job of that shape whose limit is at least as long cannot start
    before such a start: ``of`` is where its search may begin (inf: it fits nowhere within
    bf_window, as the earlier job did not). Kept as limits rising with starts."""

    def __init__(self) -> None:
        self.limits: list[float] = []
        self.starts: list[float] = []

    def of(self, limit_s: float, now: float) -> float:
        i = bisect.bisect_right(self.limits, limit_s)
        return self.starts[i - 1] if i else now

    def add(self, limit_s: float, start_s: float) -> None:
        i = bisect.bisect_right(self.limits, limit_s)
        if i and self.starts[i - 1] >= start_s:
            return  # implied by an entry already kept
        first = i - 1 if i and self.limits[i - 1] == limit_s else i
        while i < len(self.limits) and self.starts[i] <= start_s:
            i += 1  # longer limits that started no later: implied by this one now
        self.limits[first:i], self.starts[first:i] = [limit_s], [start_s]
