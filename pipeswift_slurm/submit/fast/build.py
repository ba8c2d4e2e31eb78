"""Build psbatch's compiled front end (``psbatch.c`` next to this file).

Owns: generating ``psbatch_tables.h`` from the Python modules, so that the C code and
the Python psbatch share one source of truth (sbatch's option table, psbatch's markers
and script size bound, its messages, the interpreter and package to hand Megatron jobs
to); and compiling it with the system C compiler into an installable binary.

Must not import click, SQLAlchemy or anything heavy: ``python -m
pipeswift_slurm.submit.fast.build --print-header`` runs in any build environment.

    python -m pipeswift_slurm.submit.fast.build --print-header
    python -m pipeswift_slurm.submit.fast.build --out /usr/local/bin/psbatch [--cc gcc] [--python PY]
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any, Optional, Sequence

from pipeswift_slurm import __version__
from pipeswift_slurm.submit import jobscript
from pipeswift_slurm.core import megatron
from pipeswift_slurm.submit import psbatch
from pipeswift_slurm.submit import helper as psbatch_helper
from pipeswift_slurm.submit import sbatch_args
from pipeswift_slurm.core import token

SOURCE = Path(__file__).resolve().with_name("psbatch.c")
HEADER = "psbatch_tables.h"
CFLAGS = ("-O2", "-std=c99")
# Linked statically when the C library allows it: the front end then starts without the
# dynamic loader, about a quarter of a millisecond sooner on every submission.
STATIC = ("-static",)
# Preferred when no compiler is named: against musl the static front end is 80 KB, not
# 780 KB, and its exec costs about 0.3 ms less than against glibc, whose start-up
# (IRELATIVE relocations, TLS, more pages to fault in) is most of a static exec here.
MUSL_CC = "musl-gcc"
KINDS = ("PSB_REQUIRED", "PSB_OPTIONAL", "PSB_FLAG")
# megatron.FLAGS kinds, as decide.c names them
MEGATRON_KINDS = {"int": "PSB_MEG_INT", "bool": "PSB_MEG_BOOL", "str": "PSB_MEG_STR", "int3": "PSB_MEG_INT3",
                  "path": "PSB_MEG_PATH"}
SOURCES = ("psbatch.c", "decide.c", "decide.h")


class BuildError(Exception):
    """The front end cannot be built or installed; ``code`` is the exit code to use."""

    def __init__(self, message: str, code: int = 2):
        super().__init__(message)
        self.code = code


def _captured(fn: Any, *args: Any) -> tuple[str, Any]:
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        result = fn(*args)
    return err.getvalue(), result


def package_root() -> str:
    """The folder holding the ``pipeswift_slurm`` package these tables come from."""
    return psbatch_helper.package_root()


def python_argv(root: Optional[str] = None, module: str = psbatch.__name__) -> list[str]:
    """Interpreter flags that run ``module``'s main (default: the Python psbatch) of *this*
    package (argv follows).

    ``-P`` keeps the submit directory off ``sys.path``; the package root goes first, so
    the code that runs is the one the C tables were generated from.
    """
    code = "import sys;sys.path.insert(0,%r);from %s import main;sys.exit(main())" % (
        root or package_root(), module)
    return ["-P", "-c", code]


def tables() -> dict[str, Any]:
    """Everything the C front end needs from the Python modules."""
    long_kind = {}
    for kind, names in enumerate((sbatch_args._LONG_REQUIRED, sbatch_args._LONG_OPTIONAL,
                                  sbatch_args._LONG_FLAGS)):
        for name in names:
            if name in long_kind:
                raise AssertionError("sbatch option %r is in two kind sets" % name)
            long_kind[name] = kind
    probe = {"PIPESWIFT_SBATCH": "/nonexistent/psbatch-probe/sbatch"}
    no_sbatch, rc = _captured(psbatch.submit, [], probe, None)
    warning, _ = _captured(psbatch._warn, "\0")
    prefix, sep, suffix = warning.partition("\0")
    if not sep or rc == 0 or not no_sbatch:
        raise AssertionError("cannot read psbatch's messages (%r, %r, %r)" % (no_sbatch, rc, warning))
    if not sbatch_args.OWN_PREFIX.startswith("--"):
        raise AssertionError("OWN_PREFIX must be a long option prefix")
    return {
        "max_script_bytes": psbatch.MAX_SCRIPT_BYTES,
        "markers": list(psbatch._MARKERS),
        "own_prefix": sbatch_args.OWN_PREFIX,
        "check_value": psbatch.CHECK[1],
        "long": dict(sorted(long_kind.items())),
        "short": {letter: (name, 0 if name in sbatch_args._LONG_REQUIRED else 2)
                  for letter, name in sorted(sbatch_args._SHORT.items())},
        "no_stdin": sorted(sbatch_args._NO_STDIN),
        "defpath": os.defpath,
        "no_sbatch_message": no_sbatch,
        "no_sbatch_rc": rc,
        "warn_prefix": prefix,
        "warn_suffix": suffix,
    }


def c_string(text: str) -> str:
    """A C string literal for ``text`` (bytes as the OS sees them; safe in any C mode)."""
    out = []
    for byte in os.fsencode(text):
        ch = chr(byte)
        if 0x20 <= byte < 0x7F and ch not in '"\\?':
            out.append(ch)
        else:
            out.append("\\%03o" % byte)
    return '"' + "".join(out) + '"'


def _word_list(name: str, words: Sequence[str]) -> list[str]:
    return ["PSB_TABLE char *const %s[] = {" % name, *("    %s," % c_string(w) for w in words), "    NULL};"]


def header_text(python: Optional[str] = None, root: Optional[str] = None, helper: bool = True) -> str:
    """``psbatch_tables.h`` for the interpreter ``python`` (default: this one); ``helper``:
    whether the resident helper is on when ``$PIPESWIFT_PSBATCH_HELPER`` does not say."""
    python = python or sys.executable
    if not python:
        raise BuildError("no Python interpreter path (sys.executable is empty; give --python)")
    root = root or package_root()
    t = tables()
    lines = [
        "/* Generated by pipeswift_slurm/submit/fast/build.py from pipeswift_slurm.submit.psbatch, sbatch_args,",
        " * jobscript, megatron and token (pipeswift-slurm %s). Do not edit. */" % __version__,
        "#ifndef PSBATCH_TABLES_H",
        "#define PSBATCH_TABLES_H",
        "#include <stddef.h>",
        "",
        "#define PSB_REQUIRED 0",
        "#define PSB_OPTIONAL 1",
        "#define PSB_FLAG 2",
        "struct psb_long { const char *name; int kind; };",
        "struct psb_short { const char *name; int kind; };",
        "#define PSB_TABLE static const __attribute__((unused))  /* not every file uses every table */",
        "",
        "#define PSB_MAX_SCRIPT_BYTES ((size_t)%d)" % t["max_script_bytes"],
        "#define PSB_OWN_PREFIX %s" % c_string(t["own_prefix"]),
        "#define PSB_CHECK_VALUE %s" % c_string(t["check_value"]),
        "#define PSB_DEFPATH %s" % c_string(t["defpath"]),
        "#define PSB_PYTHON %s" % c_string(python),
        "#define PSB_NO_SBATCH_MESSAGE %s" % c_string(t["no_sbatch_message"]),
        "#define PSB_NO_SBATCH_RC %d" % t["no_sbatch_rc"],
        "#define PSB_WARN_PREFIX %s" % c_string(t["warn_prefix"]),
        "#define PSB_WARN_SUFFIX %s" % c_string(t["warn_suffix"]),
        "#define PSB_HELPER_DEFAULT_ON %d" % int(helper),
        "#define PSB_HELPER_PROTOCOL %s" % c_string(psbatch_helper.protocol_id(root)),
        "#define PSB_HELPER_SOCKET %s" % c_string(psbatch_helper.SOCKET_NAME),
        "#define PSB_HELPER_JOB_PREFIX %s" % c_string(psbatch_helper.JOB_PREFIX),
        "#define PSB_HELPER_LOCK %s" % c_string(psbatch_helper.LOCK_NAME),
        "#define PSB_HELPER_MEMO %s" % c_string(psbatch_helper.MEMO_NAME),
        "#define PSB_SHARED_MEMORY %s" % c_string(psbatch_helper.SHARED_MEMORY),
        "#define PSB_HELPER_TIMEOUT_S %d" % int(psbatch_helper.IO_TIMEOUT_S),
        "#define PSB_HELPER_MAX_ANSWER_BYTES ((size_t)%d)" % psbatch_helper.MAX_REQUEST_BYTES,
        "",
        "#define PSB_LAUNCHER %s" % c_string(jobscript.LAUNCHER),
        "#define PSB_MAX_LOGICAL_LINES %d" % jobscript.MAX_LOGICAL_LINES,
        "#define PSB_PROFILE_PREFIX %s" % c_string(token.PROFILE_PREFIX.rstrip(";")),
        "#define PSB_MEGATRON_FLAG_COUNT %d" % len(megatron.FLAGS),
        *("#define %s %d" % (name, k) for k, name in enumerate(MEGATRON_KINDS.values())),
        "struct psb_megatron_flag { const char *name; int kind; };",
        "",
        *_word_list("psb_prefix_words", jobscript.PREFIX_WORDS),
        *_word_list("psb_assign_commands", jobscript.ASSIGN_COMMANDS),
        *_word_list("psb_not_commands", sorted(jobscript.NOT_COMMANDS)),
        *_word_list("psb_launchers", jobscript.LAUNCHERS),
        *_word_list("psb_shape_flags", jobscript.SHAPE_FLAGS),
        "PSB_TABLE struct psb_megatron_flag psb_megatron_flags[] = {",
        *("    {%s, %s}," % (c_string(name), MEGATRON_KINDS[kind]) for name, kind in megatron.FLAGS.items()),
        "    {NULL, 0}};",
        "PSB_TABLE char *const psb_python_flags[] = {",
        *("    %s," % c_string(word) for word in python_argv(root)),
        "    NULL};",
        "PSB_TABLE char *const psb_helper_flags[] = {",
        *("    %s," % c_string(word) for word in python_argv(root, psbatch_helper.__name__)),
        "    NULL};",
        "PSB_TABLE char *const psb_markers[] = {",
        *("    %s," % c_string(m) for m in t["markers"]),
        "    NULL};",
        "PSB_TABLE char *const psb_no_stdin[] = {",
        *("    %s," % c_string(m) for m in t["no_stdin"]),
        "    NULL};",
        "PSB_TABLE struct psb_long psb_long[] = {",
        *("    {%s, %s}," % (c_string(name), KINDS[kind]) for name, kind in t["long"].items()),
        "    {NULL, 0}};",
        "PSB_TABLE struct psb_short psb_short[128] = {",
        *("    [%d] = {%s, %s}, /* -%s */" % (ord(letter), c_string(name), KINDS[kind], letter)
          for letter, (name, kind) in t["short"].items()),
        "};",
        "",
        "#endif",
        "",
    ]
    return "\n".join(lines)


def compiler(cc: Optional[str] = None) -> list[str]:
    """The C compiler command: ``cc``, else ``$CC``, else ``cc``.

    Raises:
        BuildError: no such compiler.
    """
    words = shlex.split(cc or os.environ.get("CC") or "cc")
    if not words or shutil.which(words[0]) is None:
        raise BuildError("C compiler %r not found (install gcc, or give --cc or $CC)"
                         % (words[0] if words else cc))
    return words


def attempts(cc: Optional[str] = None) -> list[tuple[list[str], tuple[str, ...]]]:
    """(compiler command, link flags) to try in turn: the named compiler (``cc``, else
    ``$CC``) static, then dynamic; with none named, musl-gcc static first when installed,
    then ``cc`` static, then dynamic (when there is a ``cc``).

    Raises:
        BuildError: the named compiler (or ``cc``) is not found.
    """
    if not (cc or os.environ.get("CC")) and shutil.which(MUSL_CC):
        fallback = [(["cc"], STATIC), (["cc"], ())] if shutil.which("cc") else []
        return [([MUSL_CC], STATIC), *fallback]
    words = compiler(cc)
    return [(words, STATIC), (words, ())]


def _check_python(python: str, root: str) -> None:
    code = python_argv(root)[2].replace("sys.exit(main())", "pass")
    try:
        done = subprocess.run([python, "-P", "-c", code], capture_output=True, text=True, timeout=120,
                              check=False)
    except OSError as exc:
        raise BuildError("cannot run the Python %s: %s" % (python, exc.strerror)) from None
    if done.returncode:
        last = (done.stderr.strip().splitlines() or ["exit %d" % done.returncode])[-1]
        raise BuildError("the Python %s cannot import %s: %s" % (python, psbatch.__name__, last))


def build(out: str | os.PathLike[str], cc: Optional[str] = None, python: Optional[str] = None,
          extra_flags: Sequence[str] = (), check_python: bool = True, helper: bool = True) -> Path:
    """Generate the header, compile psbatch.c and install the binary at ``out``
    (a folder gets ``psbatch`` in it). The file is replaced atomically.

    Raises:
        BuildError: no compiler, the compiler failed, or ``out`` cannot be written.
    """
    return build_with(out, cc, python, extra_flags, check_python, helper)[0]


def build_with(out: str | os.PathLike[str], cc: Optional[str] = None, python: Optional[str] = None,
               extra_flags: Sequence[str] = (), check_python: bool = True,
               helper: bool = True) -> tuple[Path, list[str]]:
    """``build``, also returning the compiler command and link flags that built it."""
    python = python or sys.executable
    root = package_root()
    target = Path(out)
    if str(out).endswith(os.sep) and not target.is_dir():
        raise BuildError("cannot write %s: no such folder" % out)
    if target.is_dir():
        target = target / "psbatch"
    if not target.parent.is_dir():
        raise BuildError("cannot write %s: no such folder %s" % (target, target.parent))
    tries = attempts(cc)
    if check_python:
        _check_python(python, root)
    with tempfile.TemporaryDirectory(prefix="psbatch-build-") as tmp:
        (Path(tmp) / HEADER).write_text(header_text(python, root, helper))
        for name in SOURCES:
            shutil.copyfile(SOURCE.with_name(name), Path(tmp) / name)
        src = [str(Path(tmp) / name) for name in SOURCES if name.endswith(".c")]
        exe = Path(tmp) / "psbatch"
        failure = ""
        for words, link in tries:  # the last failure is the one reported
            argv = [*words, *CFLAGS, *link, *extra_flags, "-o", str(exe), *src]
            try:
                done = subprocess.run(argv, capture_output=True, text=True, timeout=300, check=False)
            except (OSError, subprocess.TimeoutExpired) as exc:
                failure = "cannot run %s: %s" % (words[0], exc)
                continue
            if done.returncode == 0 and exe.is_file():
                break
            said = done.stderr.splitlines()
            first = ([ln for ln in said if "error" in ln] or said or [""])[0].strip()
            failure = "%s failed (exit %d): %s" % (" ".join(words), done.returncode, first)
        else:
            raise BuildError(failure, 1)
        _install(exe, target)
    return target, [*words, *link]


def _install(exe: Path, target: Path) -> None:
    tmp_path = None
    try:
        fd, tmp_path = tempfile.mkstemp(prefix=".psbatch-", dir=target.parent)
        with os.fdopen(fd, "wb") as fh:
            fh.write(exe.read_bytes())
            os.fchmod(fh.fileno(), 0o755)
        os.replace(tmp_path, target)
    except OSError as exc:
        if tmp_path and os.path.exists(tmp_path):
            os.unlink(tmp_path)
        raise BuildError("cannot write %s: %s" % (target, exc.strerror or exc)) from None


def main(argv: Optional[Sequence[str]] = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m pipeswift_slurm.submit.fast.build",
                                 description="Build psbatch's compiled front end.")
    ap.add_argument("--print-header", action="store_true", help="print the generated header and exit")
    ap.add_argument("--out", default="psbatch", help="where to write the binary (default: %(default)s)")
    ap.add_argument("--cc", help="C compiler command (default: $CC, else musl-gcc when installed, then cc)")
    ap.add_argument("--python", help="interpreter for Megatron jobs (default: this one)")
    ap.add_argument("--no-helper", action="store_true",
                    help="resident helper off unless $PIPESWIFT_PSBATCH_HELPER turns it on")
    args = ap.parse_args(argv)
    try:
        if args.print_header:
            sys.stdout.write(header_text(args.python, helper=not args.no_helper))
            return 0
        path, how = build_with(args.out, cc=args.cc, python=args.python, helper=not args.no_helper)
    except BuildError as exc:
        sys.stderr.write("psbatch build: error: %s\n" % exc)
        return exc.code
    sys.stdout.write("wrote %s (%s)\n" % (path, " ".join(how)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
