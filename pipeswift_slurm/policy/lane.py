"""The short-job lane against Slurm's backfill: a plan to wait is a wish, not a hold.

A job planned to wait (for a reservation ahead of it, or for a better GPU count) is
started by Slurm's backfill as soon as its config fits in GPUs free now, whatever the
plan says: Slurm judges the reservations ahead by time limits, not by our predictions,
and makes none past ``bf_window``. ``_plan`` counts a long job against the long jobs'
share only when it starts it now, so several long jobs that each fit beside the lane,
planned to wait, could all be backfilled at once and fill the lane (issue 24: 11cb48 day
63 at flex 0.5, three multi-day 4-GPU jobs planned to wait 40 h started together, and
1-minute jobs then waited 25 h).
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Mapping

from pipeswift_slurm.core.model import Job
from pipeswift_slurm.policy.common import Option, Plan, Timeline, fits_now


def long_share(now: float, long_cap: float, long_busy: int, long_ends: list[tuple[float, int]]) -> Timeline:
    """The long jobs' share of the GPUs over time: ``long_cap`` GPUs, of which long jobs
    hold ``long_busy`` until their predicted ends (``long_ends``: (end, GPUs))."""
    return Timeline(now, math.floor(long_cap) - long_busy, long_ends)


def breaks_promise(promised: list[tuple[float, int, float]], long_ends: list[tuple[float, int]], long_cap: float,
                   now: float, opt: Option) -> bool:
    """Whether a long job run as ``opt`` from now would take the room promised to a
    shorter long job earlier in the order that waits for the lane on whole nodes
    (``promised``: (start, GPUs, run) each): at each such start before it ends, the long
    jobs still running (``long_ends``: (end, GPUs)), those promised by then and this one
    must fit the long jobs' share (``long_cap``). A job on whole nodes cannot start in the
    fragments that free meanwhile, so without its promise the longer jobs behind it take
    every room the lane frees (issue 24, 2869ce day 63)."""
    for start_s, _, promised_run_s in promised:
        if start_s < now + opt.run_s and opt.run_s > promised_run_s:
            busy = sum(used for end_s, used in long_ends if end_s > start_s)
            held = sum(used for s, used, _ in promised if s <= start_s)
            if busy + held + opt.gpus > long_cap:
                return True
    return False


def hold_backfill_over_lane(waiting: list[Job], plans: Mapping[int, Plan], free: list[int], long_busy: int,
                            long_ends: list[tuple[float, int]], long_cap: float, lane_max_s: float,
                            wait_bound_s: float, short_about: bool, now: float) -> dict[int, Plan]:
    """The plans to turn into lane holds: walk the jobs planned to wait, in Slurm's order
    (``waiting``), over the GPUs still free after this tick's starts (``free``, by node;
    changed in place). Each whose planned config fits takes its GPUs, as backfill would
    start it, and a long one (predicted run over ``lane_max_s``) its room in the long jobs'
    share: ``long_cap`` GPUs, of which running long jobs and this tick's long starts hold
    ``long_busy`` until their predicted ends (``long_ends``). A long one that the share has
    no room for within ``lane_max_s`` of now, for its whole run, is held for the lane
    instead: the rule a starving job meets in ``_plan`` (it may close the lane only
    briefly). Exempt, as there: a job past the wait bound, and a count bigger than the
    share while no short job is about."""
    share = long_share(now, long_cap, long_busy, long_ends)
    held: dict[int, Plan] = {}
    for job in waiting:
        plan = plans.get(job.job_id)
        if plan is None or plan.option is None or plan.held or plan.start_s == now:
            continue
        opt = plan.option
        nodes = fits_now(free, opt.config)
        if nodes is None:
            continue
        long_job = opt.run_s > lane_max_s
        if long_job and job.queued_s(now) < wait_bound_s and (short_about or opt.gpus <= long_cap):
            room_s = share.earliest(opt.gpus, opt.run_s)
            if room_s - now > lane_max_s:
                when = "in %.1f h" % ((room_s - now) / 3600) if room_s < math.inf else "never"
                held[job.job_id] = replace(plan, held=True, reason=(
                    "held for the short-job lane: %d GPUs are free now and Slurm's backfill would start it "
                    "there, but the long jobs' share of %.0f GPUs has room for it %s (%s)"
                    % (opt.gpus, long_cap, when, plan.reason)))
                continue
        for node in nodes:
            free[node] -= opt.config.gpus_per_node
        if long_job:
            share.take(now, now + opt.run_s, opt.gpus)
    return held
