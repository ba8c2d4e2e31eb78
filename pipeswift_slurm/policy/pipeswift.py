"""``pipeswift``: joint queue order and execution config, for job completion time.

Each tick (pure; only ``view.now`` as the clock):
1. Options: for every pending opted-in job and every GPU count it allows, the fastest
   valid config and its predicted run time (the planner, through the Estimator).
2. Order: shortest predicted run time first, each job's run on a count the queue can have
   soon (``common.reachable_run_s``). Starving jobs go ahead, oldest first:
   those that have waited past ``promote_fraction`` x ``wait_bound_s``, and those *at
   risk*: the earliest they could start, were they first in the queue (on whole nodes, as
   the running jobs' predicted ends free them, node by node), would come after
   ``risk_fraction`` x ``wait_bound_s`` of waiting (a job behind multi-day jobs must get
   its reservation before its bound is already lost); but only while the starving jobs
   ahead need at most ``starve_share`` of the GPUs together (the oldest always goes
   first): starvation control is a bounded share, not a switch to submit order. An
   optional credit of ``aging`` seconds per second waited lowers a job's key.
3. Walk the order over a free-GPU timeline built from the running jobs' predicted ends (count-level, exact
   node placement only for "now"). For each job compare starting now on GPUs free now (the best config for
   that count; fragments included) with waiting for a count that frees up later; pick the earlier predicted
   completion, with a margin ``start_margin`` in favour of starting now (predictions err), and for a job
   that waits, in favour of the size it has (``common.kept_size``). A job that waits reserves its GPUs from
   its predicted start, and later jobs may only use what does not delay that reservation. Only the first
   ``plan_depth`` jobs are planned; the rest keep their size and just get their place in the order.
4. Levers: each pending job gets its SiteFactor from its rank, and when its chosen size or config differs, a
   resize (nodes x GPUs), the decision token and a time limit scaled by the predicted run-time ratio.
   Running jobs are never touched unless ``reshape_running`` is on (off by default; needs requeue allowed),
   and then only when no pending job waits, into GPUs left idle beyond ``expand_reserve_fraction`` of the
   cluster, in a shape that fits now, for jobs that checkpoint, and when the predicted gain exceeds the
   switch cost (a restart and the work since the last checkpoint) by ``reshape_margin``
   (``running.reshapes``). It gives back their GPUs to multi-day jobs that a crowded queue started small.
   With ``reshape_waiting`` (on by default) a running job also grows while jobs wait, shortest remaining
   first, into GPUs idle after this tick's starts, when its new remaining run is shorter than every waiting
   job's best run time (what shortest-remaining-first would give those GPUs to) and its gain also pays for
   the waiting its extra GPU-seconds cause the queue (``running.reshapes``).
A requeued job is planned on the work it has left from its last checkpoint
(``common.remaining_iterations``), not as if it started over. Preemption (``preempt``, off by default; needs
requeue allowed at the site): a long running job is requeued when the waiting saved by it exceeds what it
loses (until the shorter jobs that start at once on its GPUs end, plus its restart and the work since its
last checkpoint) by ``preempt_margin`` (``running.preemptions``). The waiting saved is those jobs' predicted
waits, plus, for every other queued job, its share of the freed GPU-seconds (a saturated queue drains that
much sooner). Only jobs that save and resume checkpoints are ever requeued, never a multi-node one that once
starved, and never past their own share of the wait bound.
Lending: a job gets more GPUs than it asked for only where it would use them at least
``lend_efficiency`` as well as its best count (``common.lends_poorly``); a long one
(predicted over ``short_lane_max_s``) only while the GPUs lent to long runs stay within
``borrow_share`` of the cluster: nothing gives them back before the job ends. Short-job
lane (``short_lane_fraction`` > 0): jobs predicted to run longer than ``short_lane_max_s``
may hold at most (1 - fraction) of the GPUs, whether or not a short job is about at the
moment (a long job keeps what it takes for hours; the short jobs that come meanwhile need
the lane). A long job never grows into the lane; one that would enter it at its own size is
held (Slurm's hold, marked in the decision token; its decision says so) until long jobs
have ended enough for it to fit; when it needs whole nodes, that room is promised to it: a
longer long job later in the order may not take it. A long job bigger than that share,
which never fits beside the lane, is held only while short jobs are about (one runs or
waits), until it starves. With ``preempt`` (long jobs can be requeued) the lane is kept
only while short jobs are about. A starving job closes the lane only briefly: it enters it
when the long jobs' share has room for it within ``short_lane_max_s``; otherwise it is held
for that room, which the starving jobs take oldest first (issue 24: starving multi-day jobs
skipping the lane held every GPU for days). Slurm's backfill starts a job planned to wait
if it fits now, so such long jobs meet the same test (``policy/lane.py``). Jobs past the
wait bound are never held. While short jobs are about, a starving job that can start now
on a count that fits beside the lane takes the fastest such count, not a faster one in it
(a multi-day job keeps the lane for days; issue 24, 11cb48 day 70 with expert layouts).
A GPU count that is free now but barred by the expand reserve is never planned as a wait:
the job resized to it would fit, and Slurm would start it at once.
Mixed clusters (``move_partitions``, on by default): a job that allows several partitions
is moved to the one where it is predicted to finish first (``policy/partitions.py``).
Ablation knobs: ``resize=False`` keeps every job's GPU count (config still chosen);
``reconfigure=False`` also keeps the user's config (order and waiting only).
"""

from __future__ import annotations

import bisect
import math
from dataclasses import replace
from typing import Any, ClassVar, Collection, Mapping, Optional

from pipeswift_slurm.core.estimator import EstimatorProtocol
from pipeswift_slurm.core.model import ClusterView, Decision, Job, JobProfile
from pipeswift_slurm.policy.common import (Option, Plan, Timeline, best_run_s, current_config, decision_for, fits_now,
                                           free_by_node, job_options, kept_size, least_gpu_s, lends_poorly,
                                           predicted_end_s, rank_factors, reachable_run_s, remaining_iterations)
from pipeswift_slurm.policy.earliest_fit import EarliestFit
from pipeswift_slurm.policy.knobs import PipeSwiftKnobs
from pipeswift_slurm.policy.lane import breaks_promise, hold_backfill_over_lane, long_share
from pipeswift_slurm.policy.running import idle_reserve, preemptions, reshapes


class PipeSwiftPolicy:
    name: ClassVar[str] = "pipeswift"
    scheduler: ClassVar[str] = "backfill"

    def __init__(self, knobs: PipeSwiftKnobs = PipeSwiftKnobs()):
        self.knobs = knobs
        self._options: dict[int, tuple[JobProfile, tuple[int, int], tuple[Option, ...], Any, Optional[int]]] = {}
        self._shared: tuple[Any, dict[object, tuple[Option, ...]]] = (None, {})  # one tick's: jobs of one shape

    @property
    def promote_s(self) -> float:
        """Queue time from which a job starves by age (``PipeSwiftKnobs.promote_s``)."""
        return self.knobs.promote_s

    @property
    def site_factor_max(self) -> int:
        return self.knobs.site_factor_max

    @property
    def preempts(self) -> bool:
        """Whether it may requeue running jobs (the simulator then keeps ticking)."""
        return self.knobs.preempt

    @property
    def moves_partitions(self) -> bool:
        """Whether a job that allows several partitions goes where it finishes first
        (``policy/partitions.py``)."""
        return self.knobs.move_partitions

    # ------------------------------------------------------------ options and order
    def options(self, job: Job, profile: JobProfile, estimator: EstimatorProtocol,
                cluster: tuple[int, int]) -> tuple[Option, ...]:
        """Cached per job (the profile and estimator objects, the cluster's (GPUs,
        nodes) and, for a requeued job, the iterations it has left must match: a
        calibration refit brings a new estimator)."""
        left = remaining_iterations(job, profile, estimator)
        hit = self._options.get(job.job_id)
        if hit is None or hit[0] is not profile or hit[1] != cluster or hit[3] is not estimator or hit[4] != left:
            hit = (profile, cluster, self._job_options(profile, estimator, cluster, left), estimator, left)
            self._options[job.job_id] = hit
        return hit[2]

    def _job_options(self, profile: JobProfile, estimator: EstimatorProtocol, cluster: tuple[int, int],
                     iterations: Optional[int] = None) -> tuple[Option, ...]:
        """All counts and best configs (run times of ``iterations``, what a requeued job
        has left, when given); ablations keep the user's count (no resize) or the user's
        config (no reconfigure)."""
        user = profile.requested
        if not self.knobs.reconfigure:
            full = estimator.run_time_s(profile, user)
            return (Option(user.gpus, user, full if iterations is None else estimator.run_time_s(profile, user, iterations),
                           None if iterations is None else full),)
        if not self.knobs.resize:
            profile = profile.with_range(user.gpus, user.gpus)
        if self._shared[0] is not estimator:
            self._shared = (estimator, {})
        return job_options(profile, estimator, *cluster, iterations=iterations, shared=self._shared[1])

    def starving(self, pending: list[Job], opts: Mapping[int, tuple[Option, ...]], now: float,
                 earliest_fit: Optional[EarliestFit] = None) -> set[int]:
        """Jobs that go first, in submit order: waited past ``promote_fraction`` of the
        bound, or at risk (``earliest_fit`` given and ``risk_fraction`` > 0): even first in
        the queue, the earliest any of their GPU counts could start would leave them
        waiting ``risk_fraction`` of the bound or more."""
        risk_s = self.knobs.risk_fraction * self.knobs.wait_bound_s
        out = set()
        for job in pending:
            queued_s = job.queued_s(now)
            if queued_s >= self.promote_s:
                out.add(job.job_id)
            elif earliest_fit is not None and 0 < risk_s <= queued_s + earliest_fit.latest_s - now and \
                    queued_s + min((earliest_fit(o.config) for o in opts[job.job_id]), default=math.inf) - now >= risk_s:
                out.add(job.job_id)
        return out

    def order(self, pending: list[Job], opts: Mapping[int, tuple[Option, ...]], now: float,
              starving_ids: Collection[int], total_gpus: Optional[int] = None,
              reach_gpus: float = math.inf) -> list[Job]:
        """Starving jobs (``starving_ids``) first, in submit order, as long as together
        they need at most ``starve_share`` of the ``total_gpus`` (counting each at its
        fewest GPUs; the oldest always goes first, so every job gets its turn); then
        everyone else, starving jobs past that share included, by predicted run time on at
        most ``reach_gpus`` (``reachable_run_s``) less the aging credit. Without
        ``total_gpus``, every starving job goes first."""
        starving = sorted((j for j in pending if j.job_id in starving_ids), key=lambda j: (j.submit_time, j.job_id))
        budget = math.inf if total_gpus is None else self.knobs.starve_share * total_gpus
        front: list[Job] = []
        for job in starving:
            need = min((o.gpus for o in opts[job.job_id]), default=job.gpus)
            if not front or need <= budget:
                front.append(job)
                budget -= need
        first = {j.job_id for j in front}
        rest = [j for j in pending if j.job_id not in first]

        def key(job: Job) -> tuple[float, float, int]:
            return reachable_run_s(opts[job.job_id], reach_gpus) - self.knobs.aging * job.queued_s(now), \
                job.submit_time, job.job_id

        return front + sorted(rest, key=key)

    # ------------------------------------------------------------ planning
    def _plan(self, job: Job, options: tuple[Option, ...], free: list[int], timeline: Timeline,
              now: float, starving: bool, user_gpus: int) -> Plan:
        """Start now or wait, and on how many GPUs (see the module's step 3). A job that is
        not starving never waits for a start that would take its wait past
        ``risk_fraction`` of the bound while it has another choice; with none, it waits
        for the earliest start, as a starving job does."""
        nows: list[tuple[bool, Option]] = []  # (whether it enters the lane, option) per count that starts now
        late: Optional[tuple[float, Option]] = None  # the earliest start past that point
        deadline_s = math.inf if starving or self.knobs.risk_fraction <= 0 else \
            now + self.knobs.risk_fraction * self.knobs.wait_bound_s - job.queued_s(now)
        reserve = self.knobs.expand_reserve_fraction * self._total
        lane_wait: set[int] = set()  # GPU counts that wait for the short-job lane
        waits: list[tuple[float, Option]] = []  # (predicted end; start if starving, option) per count
        never: Optional[Option] = None  # a count the lane never has room for
        fewest_gpu_s = least_gpu_s(options)  # lent GPUs must pay
        # a starving job may close the lane only briefly: when the long jobs' share has room
        # for it within short_lane_max_s; else it waits for that room, in its turn among the
        # starving (``_share``). Exempt: one past its bound (holding it would only grow the
        # longest wait), and any while no short job is about
        share_turn = starving and self._short_about and job.queued_s(now) < self.knobs.wait_bound_s
        for opt in options:
            long_job = opt.run_s > self.knobs.short_lane_max_s
            over = long_job and self._long_busy + opt.gpus > self._long_cap
            room_s = now  # a starving job's room in the long jobs' share
            if starving:
                # (a count bigger than the share never fits beside the lane: exempt too)
                lane_full = share_turn and over and opt.gpus <= self._long_cap
                if lane_full and opt.gpus <= user_gpus:
                    room_s = self._share.earliest(opt.gpus, opt.run_s)
                    lane_full = room_s - now > self.knobs.short_lane_max_s
            else:
                # a long job bigger than the long jobs' share never fits beside the lane: at
                # its own size (not grown) it may take the lane while no short job is about
                lane_full = long_job and (over or breaks_promise(self._promised, self._long_ends, self._long_cap,
                                                                 now, opt)) \
                    and (self._short_about or opt.gpus <= self._long_cap or opt.gpus > user_gpus)
            if lane_full and opt.gpus > user_gpus:
                continue  # a long job grows only while the short-job lane stays free
            if lends_poorly(opt, user_gpus, fewest_gpu_s, self.knobs.lend_efficiency):
                continue
            if long_job and opt.gpus > user_gpus and self._borrowed + opt.gpus - user_gpus > self._borrow_cap:
                continue  # GPUs lent for a long run are bounded: the jobs still to come need them
            start = timeline.earliest(opt.gpus, opt.run_s)
            expands = opt.gpus > user_gpus and sum(free) - opt.gpus < reserve
            if lane_full and self.knobs.short_lane_fraction > 0:
                lane_wait.add(opt.gpus)
                start = max(start, room_s if starving else self._lane_room_s(opt.gpus, now))
                if start == math.inf and (never is None or opt.gpus < never.gpus):
                    never = opt
            elif start == now and expands:
                # barred though free now: no plan may wait for it, since resizing the job to a
                # count that fits now makes Slurm start it at once, the bar ignored
                continue
            elif start == now and fits_now(free, opt.config) is not None:
                nows.append((over, opt))
                continue
            if start > deadline_s and start < math.inf:
                if late is None or start < late[0]:
                    late = (start, opt)
            elif start < math.inf:
                waits.append((start if starving else start + opt.run_s, opt))
        # the fastest start now; a starving job, while short jobs are about, enters the lane
        # only when it cannot start beside it
        beside_first = starving and self._short_about
        best_now = min(nows, key=lambda n: (beside_first and n[0], n[1].run_s), default=(False, None))[1]
        best_wait = min(waits, key=lambda w: w[0], default=None)
        if best_wait is not None and not starving:
            best_wait = kept_size(waits, best_wait, job.gpus, now, self.knobs.start_margin)
        if best_now is None and best_wait is None and late is not None:
            starving, best_wait = True, late
        if best_now is not None:
            wait_jct = float("inf") if best_wait is None else (
                best_wait[0] if not starving else best_wait[0] + best_wait[1].run_s) - now
            if starving or best_now.run_s <= wait_jct * (1 + self.knobs.start_margin):
                nodes = fits_now(free, best_now.config) or []
                for node in nodes:
                    free[node] -= best_now.config.gpus_per_node
                timeline.take(now, now + best_now.run_s, best_now.gpus)
                if best_now.run_s > self.knobs.short_lane_max_s:
                    self._share.take(now, now + best_now.run_s, best_now.gpus)
                    self._long_busy += best_now.gpus
                    self._borrowed += max(0, best_now.gpus - user_gpus)
                    bisect.insort(self._long_ends, (now + best_now.run_s, best_now.gpus))
                return Plan(best_now, now, "start now on %d GPUs" % best_now.gpus)
        if best_wait is None and never is not None:
            return Plan(never, None, "held for the short-job lane: a %.1f h job on %d GPUs would put long jobs on "
                        "%d of the %.0f GPUs they may hold (short_lane_fraction %g)"
                        % (never.run_s / 3600, never.gpus, self._long_busy + never.gpus, self._long_cap,
                           self.knobs.short_lane_fraction), held=True)
        if best_wait is None:
            return Plan(None, None, "no GPU count fits in the predicted future")
        opt = best_wait[1]
        start = best_wait[0] - (0 if starving else opt.run_s)
        if self._reserved < self.knobs.reservations:
            timeline.take(start, start + opt.run_s, opt.gpus)
            self._reserved += 1
        if starving and opt.run_s > self.knobs.short_lane_max_s:
            self._share.take(start, start + opt.run_s, opt.gpus)
        if opt.gpus in lane_wait:
            if start > now and opt.config.num_nodes > 1:
                self._promised.append((start, opt.gpus, opt.run_s))
            return Plan(opt, start, "held for the short-job lane: wait for %d GPUs (predicted start in %.0f s)"
                        % (opt.gpus, start - now), held=True)
        if start - now < 1:  # when whole nodes free up is not foreseen: no start now
            return Plan(opt, None, "wait for %d GPUs (free now, but not on enough whole nodes)" % opt.gpus)
        return Plan(opt, start, "wait for %d GPUs (predicted start in %.0f s)" % (opt.gpus, start - now))

    def _lane_room_s(self, gpus: int, now: float) -> float:
        """When long jobs (running, or started by this tick's plan) will have ended enough
        for ``gpus`` more long-job GPUs to fit the lane's cap (inf: never)."""
        busy = self._long_busy
        for end_s, used in self._long_ends:
            busy -= used
            if busy + gpus <= self._long_cap:
                return max(end_s, now)
        return math.inf

    @staticmethod
    def _hold(job: Job, plan: Plan) -> Optional[bool]:
        """The short-job lane: hold a long job that waits while long jobs fill their share
        of the cluster (Slurm would otherwise start it as soon as it fits); release it
        once the plan starts it now or the lane has room. None: leave as is."""
        if plan.held and plan.option is not None:
            return None if job.held else True
        return False if job.held else None

    def decide(self, view: ClusterView, profiles: Mapping[int, JobProfile], estimator: EstimatorProtocol) -> list[Decision]:
        now = view.now
        pending = [j for j in view.pending if j.job_id in profiles]
        live = {j.job_id for j in pending}
        for gone in [k for k in self._options if k not in live]:
            del self._options[gone]
        if not pending:
            return reshapes(self.knobs, view, profiles, estimator, free_by_node(view), idle_reserve(self.knobs, view)) \
                if self.knobs.reshape_running else []
        total = self._total = view.total_gpus
        cluster = (total, sum(1 for n in view.nodes if n.usable))
        self._shared = (estimator, {})
        opts = {j.job_id: self.options(j, profiles[j.job_id], estimator, cluster) for j in pending}
        ends = {r.job_id: predicted_end_s(r, profiles, estimator, now) for r in view.running}
        free = free_by_node(view)
        starving = self.starving(pending, opts, now, EarliestFit(view, free, ends) if self.knobs.risk_fraction > 0 else None)
        # the queue can have soon the GPUs no running job holds past short_lane_max_s from now
        # (with ``preempt``, all: a long job can be requeued for shorter ones)
        reach = total if self.knobs.preempt else \
            total - sum(r.gpus for r in view.running if ends[r.job_id] - now > self.knobs.short_lane_max_s)
        ordered = self.order(pending, opts, now, starving, total, reach)
        timeline = Timeline(now, sum(free), [(ends[r.job_id], r.gpus) for r in view.running])
        self._reserved = 0
        # (start, GPUs, run) of long jobs on whole nodes held for the lane: their room is
        # promised against longer long jobs later in the order (``lane.breaks_promise``)
        self._promised: list[tuple[float, int, float]] = []
        self._long_ends = sorted((ends[r.job_id], r.gpus) for r in view.running
                                 if ends[r.job_id] - (now if r.start_time is None else r.start_time)
                                 > self.knobs.short_lane_max_s)
        # the lending cap holds while short jobs are about (one runs or waits): where none
        # come, it would only leave GPUs idle
        short_about = self._short_about = len(self._long_ends) < len(view.running) or \
            any(best_run_s(opts[j.job_id]) <= self.knobs.short_lane_max_s for j in pending)
        self._long_busy = sum(gpus for _, gpus in self._long_ends)
        # GPUs beyond their request that running jobs hold for long (a decision of an
        # earlier tick: today's policy never gives them back), against the lending cap
        self._borrow_cap = (self.knobs.borrow_share if short_about else 1.0) * total
        self._borrowed = sum(max(0, r.gpus - profiles[r.job_id].requested.gpus) for r in view.running
                             if r.job_id in profiles and ends[r.job_id] - now > self.knobs.short_lane_max_s)
        # The lane holds whether or not short jobs are about now (see the module's text);
        # with ``preempt`` (long jobs can be requeued) only while they are.
        lane_on = short_about or not self.knobs.preempt
        self._long_cap = (1.0 - (self.knobs.short_lane_fraction if lane_on else 0.0)) * total
        # the long jobs' share over time: running long jobs to their predicted ends, those this
        # tick starts, and each starving long job as planned, oldest first, so the next one's
        # room comes after theirs
        self._share = long_share(now, self._long_cap, self._long_busy, self._long_ends)
        plans: dict[int, Plan] = {}
        for job in ordered[:self.knobs.plan_depth]:
            plans[job.job_id] = self._plan(job, opts[job.job_id], free, timeline, now, job.job_id in starving,
                                           profiles[job.job_id].requested.gpus)
        plans.update(hold_backfill_over_lane(ordered, plans, list(free), self._long_busy, self._long_ends,
                                             self._long_cap, self.knobs.short_lane_max_s, self.knobs.wait_bound_s,
                                             self._short_about, now))
        # Jobs planned to start now go first: they fit, so Slurm starts them before it
        # reserves for the first job that waits (the timeline already checked that they
        # do not delay the planned reservations).
        preempted: list[Decision] = []
        if self.knobs.preempt:
            preempted = preemptions(self.knobs, view, profiles, estimator, ordered, plans, free)
        starting = [j for j in ordered if j.job_id in plans and plans[j.job_id].start_s == now]
        started = {j.job_id for j in starting}
        final = starting + [j for j in ordered if j.job_id not in started]
        factors = rank_factors([j.job_id for j in final], self.knobs.site_factor_max)
        out = []
        for rank, job in enumerate(final):
            plan = plans.get(job.job_id)
            if plan is None:
                out.append(Decision(job.job_id, site_factor=factors[job.job_id], reason="queued (rank %d)" % rank))
                continue
            profile = profiles[job.job_id]
            option = plan.option
            hold = self._hold(job, plan)
            if hold is None and option is not None and option.config == current_config(job, profile) \
                    and job.config is not None:
                option = None
            decision = decision_for(job, profile, option, factors[job.job_id], plan.reason, estimator, plan.start_s)
            out.append(replace(decision, hold=hold) if hold is not None and decision.config is not None else decision)
        out += preempted
        nobody_waits = len(plans) == len(ordered) and all(p.start_s == now for p in plans.values())
        if self.knobs.reshape_running and nobody_waits:
            out += reshapes(self.knobs, view, profiles, estimator, free, idle_reserve(self.knobs, view))
        elif self.knobs.reshape_running and self.knobs.reshape_waiting and sum(free) > 0:
            # shortest remaining first: a running job grows into GPUs idle now only when it
            # would then end before any waiting job could run (with no reserve kept: the
            # queue is what those GPUs would be kept for)
            waiting = [j for j in ordered if j.job_id not in plans or plans[j.job_id].start_s != now]
            waiting_best = min((best_run_s(opts[j.job_id]) for j in waiting), default=math.inf)
            out += reshapes(self.knobs, view, profiles, estimator, free, 0, shorter_than_s=waiting_best,
                            skip={d.job_id for d in preempted}, queued=len(waiting),
                            queued_gpu_s=sum(least_gpu_s(opts[j.job_id]) for j in waiting if opts[j.job_id]))
        return out
