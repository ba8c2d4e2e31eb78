"""``pipeswift-launch -- <training command>``: inside a Slurm allocation, choose the Megatron
layout for exactly that allocation, rewrite the command's Megatron and torchrun arguments,
and exec it.

Owns: reading the controller's decision from the admin-only ``AdminComment`` (the
user-editable ``Comment`` only ever supplies a *request*: GPU range, minimum micro-batch,
allowed pp, class); checking the decision with ``megatron_rules.config_for_allocation``, as
the history does; otherwise planning the best config itself with the estimator; the
emulation mode for test clusters. The command is exec'd as an argv list: no user string is
ever given to a shell. A job it cannot plan for runs its command as written. Must not
import SQLAlchemy, the store, click or any backend. The allocation is read by
``submit/allocation.py``.
"""

from __future__ import annotations

import json
import logging
import math
import os
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, replace
from typing import Callable, Mapping, Optional, Sequence

from pipeswift_slurm.core.fmt import digits
from pipeswift_slurm.core.megatron import MegatronArgError
from pipeswift_slurm.core.megatron_render import render_args
from pipeswift_slurm.core.megatron_rules import config_for_allocation
from pipeswift_slurm.core.model import ExecConfig, JobProfile
from pipeswift_slurm.core.request import MAX_GPUS
from pipeswift_slurm.core.switch import switch
from pipeswift_slurm.core.token import ProfileRequest, TokenError, decode_decision, decode_profile
from pipeswift_slurm.submit.allocation import Allocation, LaunchError, allocation_from_env
from pipeswift_slurm.submit.iterlog import MEASURE_DIR_ENV, run_measured
from pipeswift_slurm.submit.iterlog import say as _say
from pipeswift_slurm.submit.layout import LayoutError, Rewritten, Target, set_processes

log = logging.getLogger(__name__)

Runner = Callable[[Sequence[str]], str]
DEFAULT_EMULATE_SCALE = 0.001
MAX_EMULATE_SCALE = 1000.0
MAX_EMULATED_S = 366 * 86400.0  # no emulated run sleeps longer (a time limit ends it sooner)


# ---------------------------------------------------------------- the job record


def subprocess_runner(argv: Sequence[str]) -> str:
    """Run a Slurm command; its stdout ("" on failure, which means "no decision")."""
    try:
        # errors="replace": 22.05 lists every job even with -j, and another user's job name
        # that is not UTF-8 must not stop this job's launch
        done = subprocess.run(list(argv), capture_output=True, text=True, errors="replace", timeout=30,
                              check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        log.warning("%s failed: %s", argv[0], exc)
        return ""
    if done.returncode:
        log.warning("%s exited %d: %s", " ".join(argv), done.returncode, done.stderr.strip())
    return done.stdout


def read_job_comments(job_id: int, run: Runner) -> tuple[str, str]:
    """(AdminComment, Comment) of a job, from Slurm's structured JSON.

    The one-line ``scontrol -o show job`` text is not used for the decision: a user can
    write ``AdminComment=...`` into the job name, work dir or comment, and that text is
    indistinguishable from the real field when no admin comment is set. ``squeue --json``
    keeps the fields apart (22.05 lists every job even with ``-j``; we pick ours).
    """
    text = run(["squeue", "--json", "-j", str(job_id)])
    try:
        jobs = json.loads(text).get("jobs", []) if text.strip() else []
    except (ValueError, AttributeError, RecursionError):
        log.warning("squeue --json output is not JSON; no decision")
        return "", ""
    if not isinstance(jobs, list):
        log.warning("squeue --json output has no list of jobs; no decision")
        return "", ""
    for job in jobs:
        if isinstance(job, dict) and job.get("job_id") == job_id:
            return str(job.get("admin_comment") or ""), str(job.get("comment") or "")
    return "", ""


def read_request(comment: str) -> ProfileRequest:
    """The profile request psbatch left in the Comment (a request only); empty if none."""
    try:
        return decode_profile(comment)
    except TokenError as exc:
        if "pswift1;" in comment:
            log.warning("ignoring the profile request in the job comment: %s", exc)
        return ProfileRequest(argv=())


# ---------------------------------------------------------------- choosing the config


def job_profile(command: Sequence[str], request: ProfileRequest, alloc: Allocation) -> JobProfile:
    """The job's profile from its own command line, limited to exactly this allocation.

    The user's layout need not fit the allocation (the controller may have resized the
    job): when it does not, the shape and plan are read at the user's own size.

    Raises:
        MegatronArgError: the Megatron arguments are invalid whatever the size.
    """
    from pipeswift_slurm.core.request import request_profile

    return request_profile(replace(request, argv=tuple(command)), world_size=alloc.gpus,
                           gpus_per_node=alloc.gpus_per_node, allocated=True)


# What a claim says about the work (``TrainingPlan`` fields): with the model shape, what the
# controller predicts run times from.
CLAIM_PLAN_FIELDS = ("global_batch_size", "train_iters", "train_samples", "rampup_batch_size")


def claim_mismatch(profile: JobProfile, request: ProfileRequest, alloc: Allocation) -> str:
    """What differs between the command the job runs (``profile``) and the request in its
    Comment, which the controller planned from: the model shape, the global batch and the
    training length ('' when they agree, or when there is no request to compare). A job
    claiming ``--train-iters 1`` in its request while its command trains for 100,000 would
    otherwise be planned, and ranked, as a tiny job."""
    if not request.argv:
        return ""
    try:
        claimed = job_profile(request.argv, request, alloc)
    except MegatronArgError:
        return ""  # the controller could not plan from it either: it made no decision
    diffs = []
    if claimed.shape != profile.shape:
        diffs += ["%s %s in the request, %s in the command" % (f, getattr(claimed.shape, f), getattr(profile.shape, f))
                  for f in type(profile.shape).__dataclass_fields__
                  if getattr(claimed.shape, f) != getattr(profile.shape, f)]
    diffs += ["%s %s in the request, %s in the command" % (f, getattr(claimed.plan, f), getattr(profile.plan, f))
              for f in CLAIM_PLAN_FIELDS if getattr(claimed.plan, f) != getattr(profile.plan, f)]
    return "; ".join(diffs)


def check_decision(admin_comment: str, profile: JobProfile, alloc: Allocation) -> tuple[Optional[ExecConfig], str]:
    """The controller's decision when it is valid for this allocation, else (None, why not)."""
    if "pswift-decision1;" not in admin_comment:
        return None, "no decision"
    try:
        cfg, decided_at = decode_decision(admin_comment)
    except TokenError as exc:
        return None, "malformed decision (%s)" % exc
    when = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(decided_at))
    cfg, problem = config_for_allocation(cfg, profile, alloc.num_nodes, alloc.gpus_per_node)
    if cfg is None:
        kind, _, detail = problem.partition(": ")
        return None, "%s decision from %s (%s)" % (kind, when, detail)
    return cfg, "decision from controller at %s" % when


def best_config(profile: JobProfile, alloc: Allocation, estimator) -> Optional[ExecConfig]:  # type: ignore[no-untyped-def]
    """The fastest valid config that fits in memory; else any valid one; else None."""
    est = estimator.best(profile, alloc.gpus)
    if est is not None:
        return est.config  # type: ignore[no-any-return]
    from pipeswift_slurm.core.megatron_rules import enumerate_configs

    return next(enumerate_configs(profile, alloc.gpus, alloc.gpus_per_node), None)


# ---------------------------------------------------------------- the command


def rewrite_command(command: Sequence[str], cfg: ExecConfig, profile: JobProfile, alloc: Allocation,
                    host: str = "localhost") -> Rewritten:
    """The command with Megatron's layout flags for ``cfg``, starting one process per GPU of
    the allocation (``layout.set_processes``).

    Raises:
        LayoutError: the command starts its processes in a way that cannot be set.
    """
    target = Target(alloc.num_nodes, alloc.gpus_per_node, host, alloc.job_id)
    return set_processes(render_args(list(command), cfg, profile), target)


# ---------------------------------------------------------------- entry point


@dataclass(frozen=True)
class Options:
    """Launcher options: emulate instead of training; local mode with N GPUs (no Slurm)."""

    command: tuple[str, ...]
    emulate: bool = False
    local_gpus: Optional[int] = None


def emulate_env(env: Mapping[str, str]) -> bool:
    """Whether ``PIPESWIFT_EMULATE`` asks for an emulated run: 1, true, yes or on. Any other
    value runs the training (an emulation in place of a real run is the mistake that loses a
    job's work); one that is not 0, false, no, off or empty says so on stderr."""
    text = env.get("PIPESWIFT_EMULATE", "")
    on = switch(text)
    if on is None and text.strip():
        _say("warning: PIPESWIFT_EMULATE=%r is not 1/true/yes/on or 0/false/no/off; running the training" % text)
    return bool(on)


def emulate_scale(env: Mapping[str, str]) -> float:
    """``PIPESWIFT_EMULATE_SCALE``: a number in 0..``MAX_EMULATE_SCALE``, else the default (with a
    warning when it is set to something else)."""
    text = env.get("PIPESWIFT_EMULATE_SCALE") or ""
    try:
        scale = float(text) if text else DEFAULT_EMULATE_SCALE
    except ValueError:
        scale = math.nan
    if not 0 <= scale <= MAX_EMULATE_SCALE:
        _say("warning: PIPESWIFT_EMULATE_SCALE=%r is not a number in 0..%g; using %g"
             % (text, MAX_EMULATE_SCALE, DEFAULT_EMULATE_SCALE))
        scale = DEFAULT_EMULATE_SCALE
    return scale


def parse_options(argv: Sequence[str], env: dict[str, str]) -> Options:
    """``[--emulate] [--local-gpus N] -- COMMAND...``.

    Raises:
        LaunchError: unknown option or no command.
    """
    emulate = emulate_env(env)
    local, i = None, 0
    while i < len(argv) and argv[i].startswith("-") and argv[i] != "--":
        flag, eq, value = argv[i].partition("=")
        if flag == "--emulate":
            emulate = True
        elif flag == "--local-gpus":
            if not eq:
                i += 1
                value = argv[i] if i < len(argv) else ""
            if not (digits(value) and 1 <= int(value) <= MAX_GPUS):
                raise LaunchError("--local-gpus needs an integer from 1 to %d (got %r)" % (MAX_GPUS, value[:40]))
            local = int(value)
        else:
            raise LaunchError("unknown option %s (usage: pipeswift-launch [--emulate] [--local-gpus N]"
                              " -- COMMAND...)" % argv[i])
        i += 1
    command = tuple(argv[i + 1:] if i < len(argv) and argv[i] == "--" else argv[i:])
    if not command:
        raise LaunchError("no command given (usage: pipeswift-launch [--emulate] [--local-gpus N] -- COMMAND...)")
    return Options(command, emulate, local)


def choose(command: Sequence[str], alloc: Allocation, env: dict[str, str],
           run: Runner) -> tuple[Optional[ExecConfig], Optional[JobProfile], str]:
    """(config, profile, why) for this allocation; config None means "run unchanged"."""
    admin, comment = read_job_comments(alloc.job_id, run) if alloc.job_id else ("", "")
    request = read_request(comment)
    try:
        profile = job_profile(command, request, alloc)
    except MegatronArgError as exc:
        return None, None, "cannot read the Megatron arguments (%s); running the command unchanged" % exc
    differs = claim_mismatch(profile, request, alloc)
    if differs:
        return None, profile, ("warning: the command is not what the job's request says (%s): the controller planned"
                               " from the request, so no decision is applied; running the command unchanged"
                               % differs)
    cfg, why = check_decision(admin, profile, alloc)
    if cfg is not None:
        return cfg, profile, why
    from pipeswift_slurm.core.estimator import job_side_estimator

    estimator, basis = job_side_estimator(env, alloc.gpus_per_node)
    best = best_config(profile, alloc, estimator)
    if best is None:
        return None, profile, "%s and no valid config on %d GPUs; running the command unchanged" % (why, alloc.gpus)
    return best, profile, "%s: best for the allocation by %s" % (why, basis)


def launch(argv: Sequence[str], env: dict[str, str], run: Runner = subprocess_runner,
           execvp: Callable[[str, list[str]], object] = os.execvp,
           sleep: Callable[[float], object] = time.sleep) -> int:
    """Choose the config, print it, then exec the rewritten command (or emulate it). Only a
    usage error stops here (``LaunchError`` from ``parse_options``): a job whose allocation
    or request cannot be read, or that cannot be planned, runs its command as written."""
    opts = parse_options(argv, env)
    command = list(opts.command)
    alloc: Optional[Allocation] = None
    cfg, profile = None, None  # type: Optional[ExecConfig], Optional[JobProfile]
    try:
        alloc = Allocation(1, opts.local_gpus, None, "--local-gpus") if opts.local_gpus else allocation_from_env(env)
        cfg, profile, why = choose(opts.command, alloc, env, run)
    except LaunchError as exc:
        why = "warning: %s; running the command unchanged" % exc
    except Exception as exc:  # what no check foresaw must not cost the job its run
        log.debug("planning failed", exc_info=True)
        why = "warning: cannot plan this job (%s: %s); running the command unchanged" % (
            type(exc).__name__, str(exc)[:200])
    if cfg is not None and profile is not None and alloc is not None:
        try:
            rewritten = rewrite_command(command, cfg, profile, alloc, socket.gethostname())
            command = rewritten.command
            _say("running %s (%s); %s" % (cfg.short(), why, rewritten.how))
        except LayoutError as exc:
            # The Megatron layout is only valid with one process per GPU: without control of
            # the processes, the user's own command is the only safe thing to run.
            cfg = None
            _say("warning: %s; running the command unchanged" % exc)
    else:
        _say(why)
    log.debug("command: %s", command)
    if opts.emulate:
        return _emulate(cfg, profile, alloc, env, sleep)
    measure_dir = env.get(MEASURE_DIR_ENV, "")
    try:
        if measure_dir and cfg is not None and alloc is not None and alloc.job_id:
            return run_measured(command, measure_dir, alloc.job_id, cfg)  # Megatron's iteration times
        execvp(command[0], command)
    except OSError as exc:  # the command cannot be started (a shell's 127)
        _say("error: cannot run %s: %s" % (command[0], exc))
        return 127
    return 0


def _emulate(cfg: Optional[ExecConfig], profile: Optional[JobProfile], alloc: Optional[Allocation],
             env: dict[str, str], sleep: Callable[[float], object]) -> int:
    """Sleep for the predicted run time x PIPESWIFT_EMULATE_SCALE instead of training."""
    scale = emulate_scale(env)
    if cfg is None or profile is None or alloc is None:
        _say("emulating: no config to predict; finishing at once")
        return 0
    from pipeswift_slurm.core.estimator import job_side_estimator

    run_s = job_side_estimator(env, alloc.gpus_per_node, learned=False)[0].run_time_s(profile, cfg)
    _say("emulating: predicted %.1f s x scale %g = sleeping %.3f s" % (run_s, scale, run_s * scale))
    sleep(min(max(0.0, run_s * scale), MAX_EMULATED_S))
    return 0


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Console entry point of ``pipeswift-launch``."""
    # in the job's log beside the training's own lines: each of ours names the launcher
    logging.basicConfig(level=logging.DEBUG if os.environ.get("PIPESWIFT_DEBUG") else logging.WARNING,
                        stream=sys.stderr, format="pipeswift-launch: %(message)s")
    try:
        return launch(sys.argv[1:] if argv is None else list(argv), dict(os.environ))
    except LaunchError as exc:
        _say("error: %s" % exc)
        return 2


if __name__ == "__main__":
    sys.exit(main())
