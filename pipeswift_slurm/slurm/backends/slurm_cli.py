"""Slurm through its commands: ``squeue``/``scontrol``/``sprio`` argv builders, the runner
that executes them, and ``SlurmCliBackend`` which joins them with the pure parsers of
``slurm_parse``.

Owns: reading jobs (``squeue --json`` in the 22.05 and 24.11+ dialects, and only that: job
names, comments and paths are user text, so a Slurm without ``--json`` stops the tick rather
than have the controller parse ``key=value`` text a user can forge), nodes (``scontrol -d -o show node``) and site factors (``sprio``), and
running the ``scontrol`` commands a Decision becomes (``scontrol_argv``). Many updates go to one ``scontrol`` process
on stdin (``apply_many``): one process per job is the slowest part of a tick with hundreds of
pending jobs. Commands run without a shell, each argument one argv item (on stdin, one
command a line). Parsing their output is ``slurm_parse``'s job. Must not import pyslurm,
SQLAlchemy or any policy module.
"""

from __future__ import annotations

import logging
import os
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from typing import Callable, Iterable, Mapping, Optional, Sequence

from pipeswift_slurm.core.model import ClusterView, Decision, Job
from pipeswift_slurm.slurm.backends import BackendError, JobGone, OutcomeUnknown, applicable
from pipeswift_slurm.slurm.backends.scontrol_argv import BATCH_MAX_LINES, BATCH_PROCESSES, SCONTROL_BATCH_ARGV
from pipeswift_slurm.slurm.backends.scontrol_argv import apply_argvs, batch_text, batchable, check_move, update_argv
from pipeswift_slurm.slurm.backends.site_limits import LimitsReader, with_caps
from pipeswift_slurm.slurm.backends.slurm_parse import JSON_REPORTED, parse_batch_errors
from pipeswift_slurm.slurm.backends.slurm_parse import parse_scontrol_nodes
from pipeswift_slurm.slurm.backends.slurm_parse import parse_sprio, parse_squeue_json
from pipeswift_slurm.policy.partitions import partition_gres_types

log = logging.getLogger(__name__)

Runner = Callable[[list[str]], str]


@dataclass(frozen=True)
class CommandResult:
    """Exit status and output of a command that was fed text on stdin."""

    returncode: int
    stdout: str
    stderr: str


# Runs one argv with text on stdin; returns its result whatever the exit status (per-line
# errors are parsed by the caller); raises BackendError only when the command could not run.
InputRunner = Callable[[list[str], str], CommandResult]

# --states=all: 24.11 lists only pending and running jobs without it, so a job that ended
# between two ticks was never seen ending (22.05 lists every job the controller still holds
# either way; it ignores squeue's filters under --json).
SQUEUE_JSON_ARGV = ["squeue", "--json", "--states=all"]
NODES_ARGV = ["scontrol", "-d", "-o", "show", "node"]
SPRIO_ARGV = ["sprio", "-h", "-o", "%i|%Y|%S"]
PING_ARGV = ["scontrol", "ping"]

# scontrol answers meaning the job is no longer a PENDING job we may change (22.05 wording)
_GONE_PATTERNS = ("invalid job id", "already finished", "no longer pending", "is pending execution",
                  "job is completing", "not supported on this system")


# ------------------------------------------------------------------------------------ runner
@dataclass(frozen=True)
class SubprocessRunner:
    """Run one Slurm command without a shell and return its stdout.

    Output that is not UTF-8 (a job named ``caf\\xe9``) is decoded with U+FFFD in place of
    the bad bytes: users name jobs, and one name must not stop the tick. ``env`` (if given) replaces the environment, e.g. to point ``SLURM_CONF`` elsewhere.
    """

    timeout_s: float = 60.0
    env: Optional[Mapping[str, str]] = None

    def __call__(self, argv: list[str]) -> str:
        try:
            proc = subprocess.run(argv, capture_output=True, text=True, errors="replace", timeout=self.timeout_s,
                                  env=dict(self.env) if self.env is not None else None, check=False)
        except FileNotFoundError:
            raise BackendError("%s: command not found (is the Slurm client installed?)" % argv[0]) from None
        except subprocess.TimeoutExpired:
            raise OutcomeUnknown("%s timed out after %.0f s" % (" ".join(argv[:2]), self.timeout_s)) from None
        if proc.returncode != 0:
            raise BackendError("%s failed (exit %d): %s" % (" ".join(argv[:2]), proc.returncode,
                                                            _first_line(proc.stderr or proc.stdout)))
        return proc.stdout

    def feed(self, argv: list[str], stdin_text: str) -> CommandResult:
        """Run ``argv`` with ``stdin_text`` on its stdin; a non-zero exit is returned, not raised.

        ``scontrol`` reads commands through readline even from a pipe: ``TERM=dumb`` and an
        empty ``INPUTRC`` keep a site's key bindings and terminal escapes out of it.

        Raises:
            BackendError: the command is missing or ran past ``timeout_s``.
        """
        env = dict(self.env) if self.env is not None else dict(os.environ)
        env.update(TERM="dumb", INPUTRC="/dev/null")
        try:
            proc = subprocess.run(argv, input=stdin_text, capture_output=True, text=True, errors="replace",
                                  timeout=self.timeout_s, env=env, check=False)
        except FileNotFoundError:
            raise BackendError("%s: command not found (is the Slurm client installed?)" % argv[0]) from None
        except subprocess.TimeoutExpired:
            raise OutcomeUnknown("%s (%d commands on stdin) timed out after %.0f s"
                               % (argv[0], stdin_text.count("\n"), self.timeout_s)) from None
        return CommandResult(proc.returncode, proc.stdout, proc.stderr)


subprocess_runner = SubprocessRunner()


def _first_line(text: str) -> str:
    lines = [line.strip() for line in (text or "").splitlines() if line.strip()]
    return lines[0] if lines else "no output"


# Slurm 24.11 refuses about a third of partition changes of a pending job at random with
# "Resource temporarily unavailable" (EAGAIN; measured on 24.11.5: of 25 moves, 11 needed 1 to
# 4 retries; TimeLimit updates of the same jobs never failed; 22.05 never refused one), and
# now and then with "Interrupted system call" (EINTR: once in CI, on a move, failing the
# tick). Both say "try again". An update sets absolute values, so it is simply sent again.
TRANSIENT = ("resource temporarily unavailable", "interrupted system call")
TRANSIENT_TRIES = 8


def transient(message: str) -> bool:
    """Whether Slurm's answer ``message`` refused an update only for now (TRANSIENT)."""
    text = message.lower()
    return any(p in text for p in TRANSIENT)


def run_update(run: Runner, argv: list[str]) -> str:
    """``run(argv)``, sent again (up to TRANSIENT_TRIES in all) while Slurm answers TRANSIENT.

    Raises:
        BackendError: as ``run`` (the last answer, when every try was refused).
    """
    for attempt in range(1, TRANSIENT_TRIES + 1):
        try:
            return run(argv)
        except BackendError as exc:
            if not transient(str(exc)) or attempt == TRANSIENT_TRIES:
                raise
            log.debug("%s: %s; sending it again", " ".join(argv[1:3]), exc)
    raise AssertionError("unreachable")


def classify_error(exc: BackendError, job_id: int) -> BackendError:
    """Map a failed scontrol call on one job to JobGone (job no longer changeable) or keep it."""
    text = str(exc).lower()
    if isinstance(exc, JobGone) or any(p in text for p in _GONE_PATTERNS):
        return JobGone("job %d is gone or no longer pending: %s" % (job_id, exc))
    return exc


@dataclass(frozen=True)
class _Update:
    """One job's ``scontrol update`` inside a batch, and where its outcome goes."""

    index: int
    job_id: int
    argv: list[str]


# ------------------------------------------------------------------------------------ backend
def in_partitions(names: Iterable[str], wanted: Optional[frozenset[str]]) -> bool:
    """Whether a job or node in the partitions ``names`` is managed: ``wanted`` is None
    (all) or names one of them. A job pending in several shows them as ``a,b``: pass
    ``job.partition.split(",")``, so it is managed when any of them is."""
    return wanted is None or bool(wanted.intersection(names))


def read_site_factors(run: Runner) -> dict[int, int]:
    """Pending jobs' SiteFactor from one ``sprio`` call (job id -> factor). An empty queue
    or a failing sprio reads as no factors (logged); an unreachable slurmctld raises.

    Raises:
        BackendError: slurmctld could not be contacted.
    """
    try:
        return parse_sprio(run(list(SPRIO_ARGV)))
    except BackendError as exc:
        if "unable to find jobs" in str(exc).lower():
            return {}
        if "contact" in str(exc).lower():
            raise
        log.warning("sprio failed, site factors read as 0: %s", exc)
        return {}


class SlurmCliBackend:
    """Backend over the Slurm commands.

    Args:
        run: runs one argv and returns stdout, raising BackendError with one line on failure.
        partitions: manage only jobs and nodes of these partitions (None: all).
        clock: epoch seconds (the snapshot's ``now`` and the token stamp).
        job_source: "json" or "auto" (the same: ``squeue --json``; there is no text source,
            user-written fields are never parsed as ``key=value`` text).
        read_site_factors: also call ``sprio`` once per snapshot to fill ``Job.site_factor``.
        feed: runs one argv with text on stdin, for ``apply_many`` (default: ``run.feed``
            when the runner has one; without it ``apply_many`` runs one command per job).
        batch_processes: how many ``scontrol`` processes ``apply_many`` feeds at once.
        read_limits: also read the site's partition, QOS and association limits once per
            snapshot (``site_limits``) and set them on each opted-in job's ``caps``.
    """

    name = "cli"

    def __init__(self, run: Runner = subprocess_runner, partitions: Optional[Iterable[str]] = None,
                 clock: Callable[[], float] = time.time, job_source: str = "auto",
                 read_site_factors: bool = True, feed: Optional[InputRunner] = None,
                 batch_processes: int = BATCH_PROCESSES, read_limits: bool = True) -> None:
        if job_source not in ("auto", "json"):
            raise BackendError("job_source must be auto or json, not %r: jobs are read only from "
                               "squeue --json (job names and comments are user text)" % job_source)
        self._run = run
        self._partitions = frozenset(partitions) if partitions else None
        self._clock = clock
        self._job_source = job_source
        self._read_site_factors = read_site_factors
        self._feed: Optional[InputRunner] = feed if feed is not None else getattr(run, "feed", None)
        self._batch_processes = max(1, batch_processes)
        self._limits = LimitsReader(run) if read_limits else None
        self._gres_types: dict[str, str] = {}  # partition -> its GRES type, from the last snapshot

    def snapshot(self) -> ClusterView:
        """Read jobs, nodes and site factors with one command each, and the site's limits
        with three (``site_limits``).

        Raises:
            BackendError: a command failed (e.g. slurmctld not answering).
        """
        now = self._clock()
        jobs = self._read_jobs()
        nodes = parse_scontrol_nodes(self._run(list(NODES_ARGV)))
        factors = self._site_factors()
        jobs = [replace(j, site_factor=factors.get(j.job_id, 0)) for j in jobs
                if in_partitions(j.partition.split(","), self._partitions)]
        if self._limits is not None:
            jobs = with_caps(jobs, self._limits.read())
        self._gres_types = partition_gres_types(nodes)
        nodes = [n for n in nodes if in_partitions(n.partitions, self._partitions)]
        log.debug("snapshot: %d jobs, %d nodes", len(jobs), len(nodes))
        return ClusterView(now=now, nodes=tuple(nodes), jobs=tuple(jobs))

    def _read_jobs(self) -> list[Job]:
        """Jobs from ``squeue --json``; there is no fallback: a Slurm without it stops the tick.

        Raises:
            BackendError: squeue failed, printed no JSON or JSON of another shape.
        """
        try:
            return parse_squeue_json(self._run(list(SQUEUE_JSON_ARGV)))
        except BackendError as exc:
            if str(exc).startswith(JSON_REPORTED) or _CTLD_UNREACHABLE in str(exc):
                self._ping(exc)
            if _json_unsupported(str(exc)):
                raise BackendError("%s; pipeswift reads jobs only from squeue --json (names and comments "
                                   "are user text): install Slurm's JSON plugins (openapi or data_parser)"
                                   % exc) from None
            raise

    def _ping(self, cause: BackendError) -> None:
        """22.05's ``squeue --json`` exits 0 with only "Failed while looking for jobs" when
        slurmctld is down; ``scontrol ping`` (fast, no retries) says so clearly.

        Raises:
            BackendError: slurmctld does not answer the ping.
        """
        try:
            self._run(list(PING_ARGV))
        except BackendError as exc:
            why = str(exc).partition("): ")[2] or str(exc)
            raise BackendError("slurmctld is not answering: %s (%s)" % (why, cause)) from None

    def _site_factors(self) -> dict[int, int]:
        return read_site_factors(self._run) if self._read_site_factors else {}

    def apply(self, decision: Decision, job: Job) -> None:
        """Change one job as decided: resize and annotate a PENDING job, set its SiteFactor
        and time limit, or requeue a running one when asked. Nothing is read first; a
        non-opted-in job is never changed (logged and skipped).

        Raises:
            JobGone: the job finished, started or vanished since the snapshot.
            BackendError: slurmctld did not answer or refused the change.
        """
        if not applicable(decision, job):
            return
        check_move(decision, job, self._gres_types)
        for argv in apply_argvs(decision, job, self._clock()):
            log.info("job %d: %s", job.job_id, " ".join(argv[1:]))
            try:
                run_update(self._run, argv)
            except BackendError as exc:
                raise classify_error(exc, job.job_id) from exc

    def apply_many(self, items: Sequence[tuple[Decision, Job]]) -> list[Optional[BackendError]]:
        """Apply many decisions: their ``scontrol update``s go, one command a line, to the
        stdin of ``batch_processes`` scontrol processes running side by side (at most
        BATCH_MAX_LINES lines each). Same rules as ``apply``; requeues still run one job
        at a time (rare, and ordered per job).

        An error line naming its job is that job's outcome. When a batch fails with an
        error that names no job, the jobs not yet accounted for are re-run in halves
        until each error has its job (updates set absolute values, so re-running one
        that succeeded changes nothing). If slurmctld stops answering mid-batch, the
        batch ends at the runner's timeout and every job in it gets OutcomeUnknown (some
        lines may have been applied: the next tick records each job by what Slurm shows).

        Returns:
            One outcome per item, in order: None (applied, or nothing to do), JobGone (the
            job finished, started or vanished since the snapshot) or BackendError.
        """
        results: list[Optional[BackendError]] = [None] * len(items)
        now = self._clock()
        batch: list[_Update] = []
        for i, (decision, job) in enumerate(items):
            if self._feed is None or decision.requeue or decision.hold is not None or not job.opted_in:
                results[i] = self._apply_one(decision, job)
                continue
            try:
                applicable(decision, job)  # (opted in: raises JobGone for a job no longer PENDING)
                check_move(decision, job, self._gres_types)
                argv = update_argv(decision, job, now)
            except BackendError as exc:
                results[i] = exc
                continue
            if argv is not None and not batchable(argv):  # another admin's note with spaces
                results[i] = self._apply_one(decision, job)
            elif argv is not None:
                log.info("job %d: %s", job.job_id, " ".join(argv[1:]))
                batch.append(_Update(i, job.job_id, argv))
        size = min(BATCH_MAX_LINES, max(1, -(-len(batch) // self._batch_processes)))
        chunks = [batch[start:start + size] for start in range(0, len(batch), size)]
        if len(chunks) <= 1:
            self._run_batch(batch, results)
        else:  # each chunk writes only its own jobs' slots of ``results``
            with ThreadPoolExecutor(max_workers=min(len(chunks), self._batch_processes)) as pool:
                list(pool.map(lambda chunk: self._run_batch(chunk, results), chunks))
        return results

    def _apply_one(self, decision: Decision, job: Job) -> Optional[BackendError]:
        try:
            self.apply(decision, job)
        except BackendError as exc:
            return exc
        return None

    def _run_batch(self, batch: list[_Update], results: list[Optional[BackendError]],
                   tries_left: int = TRANSIENT_TRIES - 1) -> None:
        """Run ``batch`` in one scontrol and store each job's outcome in ``results``; the
        updates Slurm refused for now (``transient``: on their job's line, or in a batch
        whose one unaccounted job got a line naming no job) run again in a batch of their own."""
        if not batch:
            return
        assert self._feed is not None
        try:
            done = self._feed(list(SCONTROL_BATCH_ARGV), batch_text([u.argv for u in batch]))
        except BackendError as exc:  # could not run (none applied), or timed out (OutcomeUnknown: the
            for u in batch:            # next tick reads each job back and records what Slurm shows)
                results[u.index] = type(exc)(str(exc))
            return
        if done.returncode == 0 and not done.stderr.strip():
            return
        by_job, loose = parse_batch_errors(done.stderr)
        again = [u for u in batch if transient(by_job.get(u.job_id, ""))] if tries_left > 0 else []
        if again:
            log.debug("batch of %d: %d update(s) refused for now; sending them again", len(batch), len(again))
            self._run_batch(again, results, tries_left - 1)
        for u in batch:
            if u.job_id in by_job and u not in again:
                results[u.index] = classify_error(BackendError("scontrol update: " + by_job[u.job_id]), u.job_id)
        if done.returncode == 0 or (by_job and not loose):
            return  # exit 0: lines naming no job were warnings
        rest = [u for u in batch if u.job_id not in by_job]
        message = "; ".join(loose) or "exit %d" % done.returncode
        if len(rest) == 1 and transient(message) and tries_left > 0:
            self._run_batch(rest, results, tries_left - 1)  # the refusal named no job: it is this one's
        elif len(rest) == 1:
            results[rest[0].index] = classify_error(BackendError("scontrol update: " + message), rest[0].job_id)
        elif rest:
            log.debug("batch of %d: %d error line(s) name no job; re-running %d in halves",
                      len(batch), len(loose), len(rest))
            half = len(rest) // 2
            self._run_batch(rest[:half], results)
            self._run_batch(rest[half:], results)


_CTLD_UNREACHABLE = "Unable to contact slurm controller"  # 24.11's squeue --json, exit 1


def _json_unsupported(message: str) -> bool:
    text = message.lower()
    return any(p in text for p in ("unrecognized option", "invalid option", "no json", "not supported",
                                   "gave no json", "plugin"))
