"""``psbatch``: a drop-in for ``sbatch`` that opts Megatron pipeline jobs into PipeSwift.

Owns: the submission. It reads the script as sbatch would (``--wrap``, the script file or
stdin); decides whether and how to enrich a Megatron job (``plan_job``): validating its
arguments (``core.request``), recording its profile request in its Comment
(``token.encode_profile``) and routing its training command through ``pipeswift-launch``;
the whole submission is decided first (``decide``, an ``Action``); then it runs the real
``sbatch`` with stdout, stderr and exit code passed straight through. Reading sbatch's
argv is ``sbatch_args``; reading the script's text is ``jobscript``. Everything it does
not own reaches sbatch unchanged, and any failure of its own logic submits the job
exactly as written, with one warning line.

Must not import logging, SQLAlchemy, click, the store or any backend: psbatch never
touches a database, and it must start fast (the core is imported only for Megatron jobs).
"""

from __future__ import annotations

import os
import sys
from typing import TYPE_CHECKING, Callable, Mapping, NamedTuple, Optional, Sequence

from pipeswift_slurm.submit.jobscript import Command, read_header
from pipeswift_slurm.submit.training import find_training_command, megatron_words, rewrite_lines, routed
from pipeswift_slurm.submit.sbatch_args import NO_STDIN, OwnOptions, PsbatchError, Scan, effective_options
from pipeswift_slurm.submit.sbatch_args import gpu_count, own_options, requested_world, scan_argv
from pipeswift_slurm.submit.sbatch_args import strip_own_options

if TYPE_CHECKING:
    from pipeswift_slurm.core.model import JobProfile

NO_SBATCH = "sbatch not found (set PIPESWIFT_SBATCH or PATH)"
MAX_SCRIPT_BYTES = 1 << 20  # bigger scripts go through unchanged (bounded effort)


def build_request(words: Sequence[str], values: dict[str, Optional[str]], own: OwnOptions,
                  environ: Mapping[str, str]) -> tuple[str, "JobProfile"]:
    """Validate the training command with the core: the profile token, and the profile
    as validated.

    Raises:
        megatron.MegatronArgError: the Megatron arguments are invalid for this job.
    """
    from pipeswift_slurm.core.request import request_profile
    from pipeswift_slurm.core.token import ProfileRequest, encode_profile

    world, per_node = requested_world(values)
    request = ProfileRequest(tuple(megatron_words(words)), own.gpus, own.min_micro_batch_size, own.allowed_pp,
                             own.job_class)
    asked = ProfileRequest(tuple(words), own.gpus, own.min_micro_batch_size, own.allowed_pp, own.job_class)
    profile = request_profile(asked, world_size=world,
                              gpus_per_node=per_node or gpu_count(environ.get("PIPESWIFT_GPUS_PER_NODE")) or 8)
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
    lines = text.split("\n")
    script = read_header(lines)
    own = own_options(list(script.own) + list(pairs))
    if own.off:
        return None
    scan = scan_argv(argv)
    cmd = find_training_command(lines, environ)
    if scan.components > 1 or len(script.header) > 1:
        if own.declared or cmd:
            raise PsbatchError("heterogeneous jobs are not opted in to PipeSwift")
        return None
    if cmd is None:
        if own.declared:
            raise PsbatchError("no Megatron training command found in the script")
        return None
    if script.version_dependent:
        raise PsbatchError("an #SBATCH line has a backslash before a blank, which Slurm 22.05 and 24.11 "
                           "read differently; put that value in quotes")
    values = effective_options(scan.opts, script.header[0], environ)
    token, profile = build_request(cmd.words, values, own, environ)
    comment = values.get("comment")
    new_text = text if routed(cmd) else "\n".join(rewrite_lines(lines, cmd))
    return Plan(_with_options(argv, scan, comment + " " + token if comment else token, new_text), new_text,
                cmd, profile)


def _with_options(argv: Sequence[str], scan: Scan, comment: str, text: str) -> list[str]:
    """argv with every ``--comment`` (and ``--wrap``) replaced by one new one, in front."""
    drop = {i for o in scan.opts if o.name in ("comment", "wrap") for i in range(o.start, o.end)}
    front = ["--comment=" + comment]
    if any(o.name == "wrap" for o in scan.opts):
        front.append("--wrap=" + text)
    return front + [a for i, a in enumerate(argv) if i not in drop]


def find_sbatch(environ: Mapping[str, str]) -> Optional[str]:
    """The real sbatch: ``$PIPESWIFT_SBATCH``, else the first ``sbatch`` on PATH that is
    not psbatch itself."""
    wanted = environ.get("PIPESWIFT_SBATCH") or "sbatch"
    me = os.path.realpath(sys.argv[0]) if sys.argv and sys.argv[0] else ""
    if os.sep in wanted:
        return wanted if os.path.isfile(wanted) and os.access(wanted, os.X_OK) else None
    for folder in environ.get("PATH", os.defpath).split(os.pathsep):
        path = os.path.join(folder or ".", wanted)
        if os.path.isfile(path) and os.access(path, os.X_OK) and os.path.realpath(path) != me:
            return path
    return None


def warning_line(message: str) -> str:
    """The one line psbatch writes when it submits a job unchanged."""
    return "psbatch: warning: %s; submitted unchanged\n" % message


def _warn(message: str) -> None:
    sys.stderr.write(warning_line(message))
    sys.stderr.flush()


def _run(sbatch: str, argv: list[str], stdin: Optional[bytes], script: Optional[tuple[int, str, str]]) -> int:
    """Run sbatch with stdout/stderr passed through; exec it when nothing needs cleanup."""
    if stdin is None and script is None:
        os.execv(sbatch, ["sbatch"] + argv)  # argv[0] as typed: sbatch's messages name it
    import subprocess
    import tempfile

    folder = None
    try:
        if script is not None:
            index, name, text = script
            folder = tempfile.mkdtemp(prefix="psbatch-")
            path = os.path.join(folder, name)
            with open(path, "wb") as fh:
                fh.write(text.encode("utf-8", "surrogateescape"))
            argv = argv[:index] + [path] + argv[index + 1:]
        rc = subprocess.run(["sbatch"] + argv, executable=sbatch, input=stdin, check=False).returncode
        return rc if rc >= 0 else 128 - rc  # killed by a signal: as a shell reports it
    finally:
        if folder:
            for entry in os.listdir(folder):
                os.unlink(os.path.join(folder, entry))
            os.rmdir(folder)


class Source(NamedTuple):
    """Where the job's script comes from: its text, and stdin bytes psbatch consumed."""

    text: Optional[str]
    stdin: Optional[bytes]


def read_source(argv: Sequence[str], stdin: object) -> Source:
    """Read the script as sbatch would: ``--wrap``, the script file, or stdin.

    Stdin is read only when sbatch would read it too and it is not a terminal.
    """
    scan = scan_argv(argv)
    wraps = [o.value for o in scan.opts if o.name == "wrap"]
    if wraps:
        return Source(wraps[-1] or "", None)
    if scan.script_index is not None:
        try:
            with open(argv[scan.script_index], "rb") as fh:
                data = fh.read(MAX_SCRIPT_BYTES + 1)
        except OSError:
            return Source(None, None)  # sbatch reports it
        return Source(None if len(data) > MAX_SCRIPT_BYTES else data.decode("utf-8", "surrogateescape"), None)
    if scan.unknown or any(o.name in NO_STDIN for o in scan.opts) or stdin is None or stdin.isatty():  # type: ignore[attr-defined]
        return Source(None, None)
    data = stdin.buffer.read()  # type: ignore[attr-defined]
    text = data.decode("utf-8", "surrogateescape") if len(data) <= MAX_SCRIPT_BYTES else None
    return Source(text, data)


class Action(NamedTuple):
    """What psbatch does, decided before anything runs: sbatch's argv (no argv[0]), the
    bytes to give it on stdin (None: stdin as it is), the script to write to a temporary
    file (argv index, file name, text) and a warning for stderr (``warning_line``).
    ``check``: no submission, but ``--pipeswift=check``'s report (``submit.check``)."""

    argv: list[str]
    stdin: Optional[bytes]
    script: Optional[tuple[int, str, str]]
    warning: Optional[str]
    check: bool = False


def decide(raw: Sequence[str], environ: Mapping[str, str], read: Callable[[list[str]], Source]) -> Action:
    """Decide the submission: ``raw`` is psbatch's argv, ``read`` gives the script of
    sbatch's argv (own options removed) as ``read_source`` does. Never raises for a job:
    anything psbatch cannot enrich is submitted as written, with a warning."""
    argv, pairs = list(raw), []  # type: list[str], list[tuple[str, str]]
    warning, plan, source = None, None, Source(None, None)
    try:
        argv, pairs = strip_own_options(raw)
        if CHECK in pairs:
            return Action(list(raw), None, None, None, check=True)
        source = read(argv)
        if source.text is not None:
            plan = plan_job(argv, pairs, source.text, environ)
        elif pairs:
            warning = "cannot read the job script"
    except Exception as exc:  # a submission is never lost to psbatch's own bugs
        if environ.get("PIPESWIFT_DEBUG"):
            import traceback

            traceback.print_exc()
        warning = describe(exc)
        plan = None
    if plan is None:
        return Action(argv, source.stdin, None, warning)
    scan = scan_argv(plan.argv)
    text = plan.text or ""
    if any(o.name == "wrap" for o in scan.opts):
        return Action(plan.argv, None, None, warning)
    if scan.script_index is None:
        return Action(plan.argv, text.encode("utf-8", "surrogateescape"), None, warning)
    name = os.path.basename(plan.argv[scan.script_index]) or "script"
    return Action(plan.argv, None, (scan.script_index, name, text), warning)


def submit(raw: Sequence[str], environ: Mapping[str, str], stdin: object = None) -> int:
    """Submit like sbatch, enriching a Megatron job; returns sbatch's exit code."""
    action = decide(raw, environ, lambda argv: read_source(argv, stdin))
    if action.check:
        from pipeswift_slurm.submit.check import report

        return report(raw, environ, lambda argv: read_source(argv, stdin), sys.stdout)
    sbatch = find_sbatch(environ)
    if sbatch is None:
        sys.stderr.write("psbatch: error: %s\n" % NO_SBATCH)
        return 127
    if action.warning:
        _warn(action.warning)
    return _run(sbatch, action.argv, action.stdin, action.script)


def describe(exc: Exception) -> str:
    """What an exception from enriching a job means, as the warning line says it."""
    from pipeswift_slurm.core.megatron import MegatronArgError

    if isinstance(exc, MegatronArgError):
        return "Megatron job not opted in to PipeSwift: invalid Megatron arguments (%s)" % exc
    if isinstance(exc, PsbatchError):
        return "Megatron job not opted in to PipeSwift: %s" % exc
    return "psbatch internal error (%s: %s)" % (type(exc).__name__, exc)


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Console entry point: ``psbatch [sbatch options] [--pipeswift-*] [script [args]]``."""
    try:
        return submit(sys.argv[1:] if argv is None else argv, dict(os.environ), sys.stdin)
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
