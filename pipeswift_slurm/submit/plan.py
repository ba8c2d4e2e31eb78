"""What psbatch would do with a job, decided without running anything: reading the script
as sbatch would (``read_source``), finding and validating a Megatron training command
(``plan_job``, with the one rule in ``core.request``), the profile token it records, and
the warning a job that cannot be enriched gets (``describe``).

Shared by the submission (``psbatch``) and ``--pipeswift=check`` (``check``); imports
neither. Must not import logging, SQLAlchemy, click, the store or any backend.
"""

from __future__ import annotations

import os
import stat
from typing import TYPE_CHECKING, Mapping, NamedTuple, Optional, Sequence

from pipeswift_slurm.submit.jobscript import Command, read_header
from pipeswift_slurm.submit.sbatch_args import NO_STDIN, OwnOptions, PsbatchError, Scan, effective_options
from pipeswift_slurm.submit.sbatch_args import gpu_count, job_partitions, own_options, requested_world, scan_argv
from pipeswift_slurm.submit.training import (LAUNCHER, find_training_command, megatron_words, prefix_problem,
                                             rewrite_lines, routed)

if TYPE_CHECKING:
    from pipeswift_slurm.core.model import JobProfile

MAX_SCRIPT_BYTES = 1 << 20  # bigger scripts go through unchanged (bounded effort)
# The first look: an opted-in job waits this long (a begin time) for the controller's first
# decision, which clears it, so the controller sizes it before Slurm may start it; a
# controller that does not come delays the job by that much at most.
FIRST_LOOK_ENV = "PIPESWIFT_FIRST_LOOK_S"
FIRST_LOOK_DEFAULT_S = 60
MAX_FIRST_LOOK_S = 3600


def first_look_s(values: Mapping[str, Optional[str]], environ: Mapping[str, str]) -> int:
    """Seconds psbatch's begin time gives the controller (0: none): ``$PIPESWIFT_FIRST_LOOK_S``
    (0 to 3600; default 60), none for a job its user holds, schedules (``--begin``) or
    submits as an array (the controller never changes an array's tasks).

    Raises:
        PsbatchError: the variable is not a whole number of seconds from 0 to 3600.
    """
    if {"begin", "hold", "array"} & set(values) or environ.get("SBATCH_BEGIN") or environ.get("SBATCH_HOLD") \
            or environ.get("SBATCH_ARRAY_INX"):
        return 0
    text = (environ.get(FIRST_LOOK_ENV) or "").strip()
    if not text:
        return FIRST_LOOK_DEFAULT_S
    from pipeswift_slurm.core.fmt import digits  # a Megatron job's path: the core is loaded

    if not digits(text) or int(text) > MAX_FIRST_LOOK_S:
        raise PsbatchError("%s=%r is not a whole number of seconds from 0 to %d; fix it or unset it (default %d)"
                           % (FIRST_LOOK_ENV, text[:40], MAX_FIRST_LOOK_S, FIRST_LOOK_DEFAULT_S))
    return int(text)


def build_request(words: Sequence[str], values: dict[str, Optional[str]], own: OwnOptions,
                  environ: Mapping[str, str], first_look: bool = False) -> tuple[str, "JobProfile"]:
    """Validate the training command with the core: the profile token, and the profile
    as validated.

    Raises:
        megatron.MegatronArgError: the Megatron arguments are invalid for this job.
        PsbatchUsageError: the partitions it names cannot be recorded (``job_partitions``).
    """
    from pipeswift_slurm.core.request import request_profile
    from pipeswift_slurm.core.token import ProfileRequest, encode_profile

    world, per_node = requested_world(values)
    parts = job_partitions(values, own)
    asked = ProfileRequest(tuple(words), own.gpus, own.min_micro_batch_size, own.allowed_pp, own.job_class,
                           partitions=parts)
    profile = request_profile(asked, world_size=world,
                              gpus_per_node=per_node or gpu_count(environ.get("PIPESWIFT_GPUS_PER_NODE")) or 8)
    # The token records the size the job was submitted with, for the history's replay; the
    # controller reads that size from Slurm and its own AdminComment (``asked=``), never
    # from this field, which the user can edit.
    request = ProfileRequest(tuple(megatron_words(words)), own.gpus, own.min_micro_batch_size, own.allowed_pp,
                             own.job_class, profile.requested.gpus, parts, first_look)
    return encode_profile(request), profile


# ---------------------------------------------------------------- submission

# A job whose text holds none of these (and no --pipeswift option) is never enriched: the
# compiled front end (fast/psbatch.c) passes such jobs straight to sbatch from this table.
MARKERS = ("--num-layers", "pretrain_", "#PSWIFT")
CHECK = ("", "check")  # --pipeswift=check: say what psbatch would do, submit nothing


class Plan(NamedTuple):
    """What to hand sbatch: its argv (no argv[0]) and the script text, when rewritten;
    and what that came from: the training command and its profile as validated."""

    argv: list[str]
    text: Optional[str]
    command: Command
    profile: "JobProfile"


def plan_job(argv: Sequence[str], pairs: Sequence[tuple[str, str]], text: str,
             environ: Mapping[str, str]) -> Optional[Plan]:
    """Enrich a Megatron job; None when the job is not one (or opted out).

    Raises:
        PsbatchError, megatron.MegatronArgError: the job says it is a Megatron job but
            psbatch cannot enrich it (the caller submits it unchanged with a warning).
    """
    if not pairs and not any(m in text for m in MARKERS):
        return None
    scan = scan_argv(argv)
    if "\r\n" in text and not any(o.name == "wrap" for o in scan.opts):
        raise PsbatchError("the script has DOS line breaks (\\r\\n), which sbatch refuses; convert it"
                           " (dos2unix)")
    lines = text.split("\n")
    script = read_header(lines)
    own = own_options(list(script.own) + list(pairs))
    if own.off:
        return None
    cmd = find_training_command(lines, environ)
    if scan.components > 1 or len(script.header) > 1:
        if own.declared or cmd:
            raise PsbatchError("heterogeneous jobs are not opted in to PipeSwift")
        return None
    if cmd is None:
        if own.declared:
            raise PsbatchError("no Megatron training command found in the script")
        return None
    if not routed(cmd) and (why := prefix_problem(cmd)):
        raise PsbatchError("cannot put %s before the training command on line %d: %s; write it as a"
                           " simple command (or route it yourself: %s -- torchrun ...)"
                           % (LAUNCHER, cmd.line + 1, why, LAUNCHER))
    if script.version_dependent:
        raise PsbatchError("an #SBATCH line has a backslash before a blank, which Slurm 22.05 and 24.11 "
                           "read differently; put that value in quotes")
    values = effective_options(scan.opts, script.header[0], environ)
    look_s = first_look_s(values, environ)
    token, profile = build_request(cmd.words, values, own, environ, look_s > 0)
    # psbatch's token first: the controller and the launcher read the first one, so a
    # token-like word of the user's own comment cannot stand in for the one checked here
    comment = token + " " + values["comment"] if values.get("comment") else token
    from pipeswift_slurm.core.token import MAX_TOKEN_CHARS

    if len(comment) > MAX_TOKEN_CHARS:
        if values.get("comment"):
            raise PsbatchError("the job's comment and its profile token are %d characters, over the %d the"
                               " controller reads; shorten --comment" % (len(comment), MAX_TOKEN_CHARS))
        raise PsbatchError("the profile token of the training command on line %d is %d characters, over the %d"
                           " the controller reads; pass fewer arguments there"
                           % (cmd.line + 1, len(comment), MAX_TOKEN_CHARS))
    new_text = text if routed(cmd) else "\n".join(rewrite_lines(lines, cmd))
    return Plan(_with_options(argv, scan, comment, new_text, look_s), new_text, cmd, profile)


def _with_options(argv: Sequence[str], scan: Scan, comment: str, text: str, look_s: int = 0) -> list[str]:
    """argv with every ``--comment`` (and ``--wrap``) replaced by one new one, in front, and
    the first look's begin time (``look_s`` seconds ahead; none when 0)."""
    drop = {i for o in scan.opts if o.name in ("comment", "wrap") for i in range(o.start, o.end)}
    front = ["--comment=" + comment]
    if any(o.name == "wrap" for o in scan.opts):
        front.append("--wrap=" + text)
    front += ["--begin=now+%d" % look_s] if look_s else []
    return front + [a for i, a in enumerate(argv) if i not in drop]


class Source(NamedTuple):
    """Where the job's script comes from: its text, and stdin bytes psbatch consumed."""

    text: Optional[str]
    stdin: Optional[bytes]
    why: str = ""  # why a script that looks like a Megatron job was not read
    too_big: bool = False  # over MAX_SCRIPT_BYTES (a submission says so only where it looks like one)


TOO_BIG = "the job script is over %d bytes, more than psbatch reads" % MAX_SCRIPT_BYTES


def _too_big(data: bytes, stdin: Optional[bytes] = None) -> Source:
    """A script over ``MAX_SCRIPT_BYTES``: a submission says so where its start looks like a
    Megatron job (a plain job goes as written without a word)."""
    head = data[:MAX_SCRIPT_BYTES].decode("utf-8", "replace")
    return Source(None, stdin, TOO_BIG if any(m in head for m in MARKERS) else "", too_big=True)


def read_source(argv: Sequence[str], stdin: object) -> Source:
    """Read the script as sbatch would: ``--wrap``, the script file, or stdin.

    Stdin is read only when sbatch would read it too and it is not a terminal.
    """
    scan = scan_argv(argv)
    wraps = [o.value for o in scan.opts if o.name == "wrap"]
    if wraps:
        return Source(wraps[-1] or "", None)
    if scan.script_index is not None:
        try:  # a plain file only, else not even opened: a pipe's bytes (``<(...)``, a FIFO) are sbatch's
            if not stat.S_ISREG(os.stat(argv[scan.script_index]).st_mode):
                return Source(None, None)
            with open(argv[scan.script_index], "rb") as fh:
                data = fh.read(MAX_SCRIPT_BYTES + 1)
        except OSError:
            return Source(None, None)  # sbatch reports it
        if len(data) > MAX_SCRIPT_BYTES:
            return _too_big(data)
        return Source(data.decode("utf-8", "surrogateescape"), None)
    if scan.unknown or any(o.name in NO_STDIN for o in scan.opts) or stdin is None or stdin.isatty():  # type: ignore[attr-defined]
        return Source(None, None)
    data = stdin.buffer.read()  # type: ignore[attr-defined]
    if len(data) > MAX_SCRIPT_BYTES:
        return _too_big(data, data)
    return Source(data.decode("utf-8", "surrogateescape"), data)


def describe(exc: Exception) -> str:
    """What an exception from enriching a job means, as the warning line says it."""
    from pipeswift_slurm.core.megatron import MegatronArgError

    if isinstance(exc, MegatronArgError):
        what = "a model PipeSwift does not plan" if exc.not_modelled else "invalid Megatron arguments"
        return "Megatron job not opted in to PipeSwift: %s (%s)" % (what, exc)
    if isinstance(exc, PsbatchError):
        return "Megatron job not opted in to PipeSwift: %s" % exc
    return "psbatch internal error (%s: %s)" % (type(exc).__name__, exc)
