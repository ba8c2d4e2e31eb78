"""The simulated Slurm's backfill reservation search (``slurm/backends/backfill_plan.py``):
its two shortcuts give the answers of the plain definition, on random clusters and queues."""

from __future__ import annotations

import math
import random
from typing import Any, Optional

import pytest

from pipeswift_slurm.slurm.backends.backfill_plan import Floor, earliest_start, place, rounded, start_of
from pipeswift_slurm.slurm.backends.sched_settings import SchedulingSettings
from pipeswift_slurm.slurm.backends.sim import SimBackend, SimJob


def by_definition(free_now: list[int], ends: list[tuple[float, int, int, tuple[int, ...]]],
                  reserved: list[tuple[float, float, frozenset[int]]], now: float, limit_s: float, nodes: int,
                  per_node: int, resolution_s: float, window_s: float) -> tuple[float, Optional[tuple[int, ...]]]:
    """The test's oracle: at every candidate time, every reservation tested anew against
    the job's rounded plan (a reservation holds a node when it begins before the plan
    ends and ends after it starts)."""
    for t in sorted({e[0] for e in ends} | {r[1] for r in reserved if r[1] > now}):
        if t - now > window_s:
            break
        free = list(free_now)
        for end_s, _, gpn, held in ends:
            if end_s <= t:
                for node in held:
                    free[node] += gpn
        start_s, end_s = rounded(t, t + limit_s, resolution_s)
        for res_start, res_end, held in reserved:
            if res_start < end_s and res_end > start_s:
                for node in held:
                    free[node] = 0
        placement = place(free, nodes, per_node)
        if placement is not None:
            return t, placement
    return math.inf, None


@pytest.mark.parametrize("seed", range(300))
def test_the_earliest_start_is_the_definitions(seed: int) -> None:
    rng = random.Random(seed)
    num_nodes, gpn = rng.randint(1, 6), rng.choice((4, 8))
    now = 1000.0
    free_now = [rng.randint(0, gpn) for _ in range(num_nodes)]
    ends = sorted((now + rng.choice((0, rng.uniform(0, 20000))), i, rng.randint(1, gpn),
                   tuple(sorted(rng.sample(range(num_nodes), rng.randint(1, num_nodes))))) for i in range(rng.randint(0, 8)))
    resolution_s = rng.choice((0.0, 60.0, 300.0))
    reserved = []
    for _ in range(rng.randint(0, 10)):
        start = now + rng.uniform(0, 30000)
        reserved.append((*rounded(start, start + rng.uniform(0, 20000), resolution_s),
                         frozenset(rng.sample(range(num_nodes), rng.randint(1, num_nodes)))))
    reserved.sort(key=start_of)  # as a pass keeps them
    limit_s, nodes, per_node = rng.uniform(60, 20000), rng.randint(1, num_nodes), rng.randint(1, gpn)
    window_s = rng.choice((86400.0, 5000.0))
    want = by_definition(free_now, ends, reserved, now, limit_s, nodes, per_node, resolution_s, window_s)
    assert earliest_start(free_now, ends, reserved, now, limit_s, nodes, per_node, None, resolution_s,
                          window_s) == want
    if want[0] < math.inf:  # a floor at or before the answer changes nothing
        floor = rng.uniform(now, want[0])
        assert earliest_start(free_now, ends, reserved, now, limit_s, nodes, per_node, None, resolution_s,
                              window_s, floor) == want


def test_a_floor_keeps_limits_rising_with_starts() -> None:
    floor = Floor()
    assert floor.of(600.0, 5.0) == 5.0  # nothing known: from now
    floor.add(600.0, 100.0)
    floor.add(1200.0, 80.0)  # a longer limit that started sooner says nothing new
    assert (floor.limits, floor.starts) == ([600.0], [100.0])
    floor.add(300.0, 50.0)
    floor.add(1800.0, math.inf)
    assert floor.of(299.0, 5.0) == 5.0 and floor.of(300.0, 5.0) == 50.0 and floor.of(1000.0, 5.0) == 100.0
    assert floor.of(1800.0, 5.0) == math.inf
    floor.add(200.0, 120.0)  # a shorter limit that starts later: the longer ones start no sooner
    assert (floor.limits, floor.starts) == ([200.0, 1800.0], [120.0, math.inf])


@pytest.mark.parametrize("seed", range(40))
def test_within_a_pass_a_floor_never_passes_a_jobs_earliest_start(seed: int, monkeypatch: Any) -> None:
    """Whole backfill passes over random queues (few node shapes, so floors are used):
    every search that a floor shortened finds what the full search finds."""
    rng = random.Random(seed)
    calls = []

    def checked(*args: Any) -> tuple[float, Optional[tuple[int, ...]]]:
        got = earliest_start(*args)
        assert earliest_start(*args[:-1]) == got, "a floor of %s skipped a job's earliest start" % args[-1]
        calls.append((args[3], args[-1]))
        return got

    monkeypatch.setattr("pipeswift_slurm.slurm.backends.sim.earliest_start", checked)
    be = SimBackend(rng.randint(2, 6), 8, settings=SchedulingSettings(bf_resolution_s=rng.choice((0.0, 60.0))))
    for i in range(40):
        be.submit(SimJob(i, "j%d" % i, "u", float(i), "", rng.choice((1, 1, 2)), rng.choice((2, 4, 8)),
                         rng.choice((600, 1800, 3600, 7200))))
    now = 0.0
    for _ in range(6):
        be.main_pass(now)
        be.backfill_pass(now)
        for job_id in [j for j in be.running if rng.random() < 0.3]:
            be.finish(job_id, now)
        now += rng.uniform(300, 3000)
    assert any(floor is not None and floor > now_s for now_s, floor in calls)  # floors cut searches short
