"""``psbatch``: a drop-in for ``sbatch`` that opts Megatron pipeline jobs into PipeSwift.

Owns: the submission. It reads the script as sbatch would (``--wrap``, the script file or
stdin); decides whether and how to enrich a Megatron job (``plan.plan_job``: validating its
arguments, recording its profile request in its Comment and routing its training command
through ``pipeswift-launch``);
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
from typing import Callable, Mapping, NamedTuple, Optional, Sequence

from pipeswift_slurm.submit.plan import CHECK, Source, describe, plan_job, read_source
from pipeswift_slurm.submit.sbatch_args import PsbatchUsageError, scan_argv, strip_own_options

NO_SBATCH = "sbatch not found (set PIPESWIFT_SBATCH or PATH)"
# where the compiled front end (``fast/psbatch.c``) that started this process is: not an sbatch
# either; removed from the environment before sbatch runs, so no job inherits it
FRONT_ENV = "PIPESWIFT_PSBATCH_FRONT"
# the argv positions (1-based, comma-separated) of the own options and their values the front
# end found, "!" after them when one took the script as its value: for the bootstrap's own
# fallback (``fast/build.py``), which cannot read sbatch's options; removed like FRONT_ENV
DROP_ENV = "PIPESWIFT_PSBATCH_DROP"


def find_sbatch(environ: Mapping[str, str]) -> Optional[str]:
    """The real sbatch: ``$PIPESWIFT_SBATCH``, else the first ``sbatch`` on PATH; never
    psbatch itself (it would run itself for ever)."""
    wanted = environ.get("PIPESWIFT_SBATCH") or "sbatch"
    me = {os.path.realpath(p) for p in (sys.argv[0] if sys.argv else "", environ.get(FRONT_ENV, "")) if p}

    def ok(path: str) -> bool:
        return os.path.isfile(path) and os.access(path, os.X_OK) and os.path.realpath(path) not in me

    if os.sep in wanted:
        return wanted if ok(wanted) else None
    return next((path for folder in environ.get("PATH", os.defpath).split(os.pathsep)
                 if ok(path := os.path.join(folder or ".", wanted))), None)


def warning_line(message: str) -> str:
    """The one line psbatch writes when it submits a job unchanged."""
    return "psbatch: warning: %s; submitted unchanged\n" % message


def _warn(message: str) -> None:
    sys.stderr.write(warning_line(message))
    sys.stderr.flush()


def _private_folder(environ: Mapping[str, str]) -> str:
    """A new folder only this user can read, for the rewritten script (``tempfile`` costs a
    few milliseconds of imports on every submission; this is what it would do): in
    ``$TMPDIR``, else (unset, or no folder can be made there) in /tmp.

    Raises:
        OSError: no folder can be made in either.
    """
    why = ""
    for base in dict.fromkeys((environ.get("TMPDIR") or "/tmp", "/tmp")):
        for _ in range(8):
            folder = os.path.join(base, "psbatch-" + os.urandom(8).hex())
            try:
                os.mkdir(folder, 0o700)
                return folder
            except FileExistsError:
                continue
            except OSError as exc:
                why = "%s: %s" % (base, exc.strerror or exc)
                break
    raise OSError("no folder for it (%s)" % (why or "no free name"))


class ScriptNotWritten(Exception):
    """The rewritten script could not be written; nothing has run yet."""


def _run(sbatch: str, argv: list[str], stdin: Optional[bytes], script: Optional[tuple[int, str, str]],
         environ: Mapping[str, str]) -> int:
    """Run sbatch with stdout/stderr passed through; exec it when nothing needs cleanup.
    Otherwise spawn it (``os.posix_spawn``: no ``subprocess`` import on the submit path),
    feed its stdin, wait, and remove the script file."""
    if stdin is None and script is None:
        os.execv(sbatch, ["sbatch"] + argv)  # argv[0] as typed: sbatch's messages name it
    folder = None
    try:
        if script is not None:
            index, name, text = script
            try:
                folder = _private_folder(environ)
                path = os.path.join(folder, name)
                with open(path, "wb") as fh:
                    fh.write(text.encode("utf-8", "surrogateescape"))
            except OSError as exc:
                raise ScriptNotWritten(str(exc)) from None
            argv = argv[:index] + [path] + argv[index + 1:]
        actions, pipe = [], None
        if stdin is not None:
            pipe = os.pipe()
            actions = [(os.POSIX_SPAWN_DUP2, pipe[0], 0), (os.POSIX_SPAWN_CLOSE, pipe[1])]
        pid = os.posix_spawn(sbatch, ["sbatch"] + argv, dict(os.environ), file_actions=actions)
        if pipe is not None:
            os.close(pipe[0])
            with open(pipe[1], "wb") as fh:
                try:
                    fh.write(stdin or b"")
                except BrokenPipeError:
                    pass  # sbatch stopped reading (it reports why)
        rc = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
        return rc if rc >= 0 else 128 - rc  # killed by a signal: as a shell reports it
    finally:
        if folder:
            for entry in os.listdir(folder):
                os.unlink(os.path.join(folder, entry))
            os.rmdir(folder)


class Action(NamedTuple):
    """What psbatch does, decided before anything runs: sbatch's argv (no argv[0]), the
    bytes to give it on stdin (None: stdin as it is), the script to write to a temporary
    file (argv index, file name, text) and a warning for stderr (``warning_line``).
    ``check``: no submission, but ``--pipeswift=check``'s report (``submit.check``).
    ``error``: no submission, this line on stderr and exit 2 (a bad own option that must
    not be guessed at: ``PsbatchUsageError``)."""

    argv: list[str]
    stdin: Optional[bytes]
    script: Optional[tuple[int, str, str]]
    warning: Optional[str]
    check: bool = False
    error: Optional[str] = None


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
        elif pairs or source.why:
            warning = "Megatron job not opted in to PipeSwift: %s" % (source.why or "cannot read the job script")
    except PsbatchUsageError as exc:
        return Action(argv, None, None, None, error=str(exc))
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
    if action.error:
        sys.stderr.write("psbatch: error: %s; nothing submitted\n" % action.error)
        return 2
    sbatch = find_sbatch(environ)
    if sbatch is None:
        sys.stderr.write("psbatch: error: %s\n" % NO_SBATCH)
        return 127
    if action.warning:
        _warn(action.warning)
    try:
        return _run(sbatch, action.argv, action.stdin, action.script, environ)
    except ScriptNotWritten as exc:  # nothing ran yet: the job goes as written, own options removed
        _warn("Megatron job not opted in to PipeSwift: cannot write the rewritten script: %s" % exc)
        return _run(sbatch, strip_own_options(raw)[0], None, None, environ)


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Console entry point: ``psbatch [sbatch options] [--pipeswift-*] [script [args]]``."""
    environ = dict(os.environ)
    os.environ.pop(FRONT_ENV, None)  # sbatch and the job never see it
    os.environ.pop(DROP_ENV, None)
    try:
        return submit(sys.argv[1:] if argv is None else argv, environ, sys.stdin)
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
