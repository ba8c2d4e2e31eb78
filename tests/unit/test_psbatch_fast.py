"""psbatch's compiled front end (pipeswift_slurm/fast): its generated tables match the
Python ones; jobs that are not Megatron jobs reach a fake sbatch with the same argv and
the same stdin bytes without starting Python; Megatron jobs and --pipeswift options go
through the resident helper or the Python psbatch; and, over random argv lists, scripts
and stdin, the compiled front end and ``python -m pipeswift_slurm.submit.psbatch`` hand sbatch
exactly the same argv, script and stdin and return the same exit code and output.

The front end also decides common Megatron jobs itself, in C (``$PIPESWIFT_PSBATCH_FAST``,
on unless off, 0, no or false): then sbatch gets, byte for byte, what the Python psbatch
would give it, and anything outside that subset is left to the helper or to Python. The
tests before "the decision made in C" run with it off, so they keep testing those paths.

The fake sbatch is a small C program (started in well under a millisecond) that records
argv, the text of temporary scripts psbatch wrote, and the stdin bytes.
"""

from __future__ import annotations

import io
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import NamedTuple, Optional, Sequence

import pytest
from hypothesis import HealthCheck, event, given, note, settings
from hypothesis import strategies as st

from pipeswift_slurm.submit import psbatch
from pipeswift_slurm.submit import sbatch_args
from pipeswift_slurm.submit.fast import build as fast_build

ROOT = Path(__file__).resolve().parents[2]
PYTHON_PSBATCH = (sys.executable, "-m", "pipeswift_slurm.submit.psbatch")

FAKE_SBATCH_C = r"""
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static void put(FILE *f, char tag, const char *data, size_t n)
{
    fprintf(f, "%c%zu:", tag, n);
    fwrite(data, 1, n, f);
}

static void put_all(FILE *f, char tag, FILE *in)
{
    char chunk[65536], *data = NULL;
    size_t n = 0, cap = 0, got;
    while ((got = fread(chunk, 1, sizeof chunk, in)) > 0) {
        if (n + got > cap) {
            cap = (n + got) * 2;
            data = realloc(data, cap);
        }
        memcpy(data + n, chunk, got);
        n += got;
    }
    put(f, tag, data ? data : "", n);
    free(data);
}

/* A script psbatch rewrote: in $FAKE_SBATCH_TMP, or in a psbatch-* folder (the front end
 * writes them in the helper's folder) */
static int tmp_script(const char *arg, const char *tmp, size_t tlen)
{
    const char *base = strrchr(arg, '/'), *parent = base;
    if (tlen && strncmp(arg, tmp, tlen) == 0 && arg[tlen] == '/')
        return 1;
    if (base == NULL)
        return 0;
    while (parent > arg && parent[-1] != '/')
        parent--;
    return parent > arg && strncmp(parent, "psbatch-", 8) == 0;
}

int main(int argc, char **argv)
{
    const char *tmp = getenv("FAKE_SBATCH_TMP"), *rc_text = getenv("FAKE_SBATCH_RC");
    FILE *f = fopen(getenv("FAKE_SBATCH_LOG"), "ab");
    int i, rc = rc_text ? atoi(rc_text) : 0, parsable = 0;
    size_t tlen = tmp ? strlen(tmp) : 0;
    if (f == NULL)
        return 99;
    put(f, 'C', argv[0], strlen(argv[0]));
    for (i = 1; i < argc; i++) {
        const char *arg = argv[i];
        parsable |= strcmp(arg, "--parsable") == 0;
        if (tmp_script(arg, tmp, tlen)) {
            const char *base = strrchr(arg, '/') + 1;
            FILE *script = fopen(arg, "rb");
            put(f, 'T', base, strlen(base));
            if (script) {
                put_all(f, 'F', script);
                fclose(script);
            }
        } else {
            put(f, 'A', arg, strlen(arg));
        }
    }
    if (!isatty(0))
        put_all(f, 'I', stdin);
    fclose(f);
    if (rc)
        fputs("sbatch: error: fake failure\n", stderr);
    else
        puts(parsable ? "42" : "Submitted batch job 42");
    return rc;
}
"""

DUMP_TABLES_C = r"""
#include <stdio.h>
#include "psbatch_tables.h"
int main(void)
{
    int k;
    printf("max %lu\nprefix %s\ndefpath %s\npython %s\nrc %d\n", (unsigned long)PSB_MAX_SCRIPT_BYTES,
           PSB_OWN_PREFIX, PSB_DEFPATH, PSB_PYTHON, PSB_NO_SBATCH_RC);
    printf("nosbatch %s", PSB_NO_SBATCH_MESSAGE);
    printf("warn %s%%s%s", PSB_WARN_PREFIX, PSB_WARN_SUFFIX);
    for (k = 0; psb_markers[k]; k++)
        printf("marker %s\n", psb_markers[k]);
    for (k = 0; psb_no_stdin[k]; k++)
        printf("nostdin %s\n", psb_no_stdin[k]);
    for (k = 0; psb_long[k].name; k++)
        printf("long %s %d\n", psb_long[k].name, psb_long[k].kind);
    for (k = 0; k < 128; k++)
        if (psb_short[k].name)
            printf("short %c %s %d\n", k, psb_short[k].name, psb_short[k].kind);
    for (k = 0; psb_python_flags[k]; k++)
        printf("flag %s\n", psb_python_flags[k]);
    return 0;
}
"""

PLAIN = b"#!/bin/bash\n#SBATCH -N 1\n#SBATCH --comment=plain\necho hello \xff\xfe odd bytes\n"
MEGATRON = (b"#!/bin/bash\n#SBATCH --gpus=2\ntorchrun pretrain_gpt.py --num-layers 4 --hidden-size 64"
            b" --num-attention-heads 4 --seq-length 64 --global-batch-size 8 --train-iters 10\n")
ROUTED = MEGATRON.replace(b"torchrun", b"pipeswift-launch -- torchrun", 1)


def _env(**extra: str) -> dict[str, str]:
    """This environment, with this checkout first on PYTHONPATH."""
    path = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    return dict(os.environ, PYTHONPATH=path, **extra)


def _compiler() -> Optional[str]:
    return shutil.which(os.environ.get("CC") or "cc") or shutil.which("gcc")


needs_cc = pytest.mark.skipif(_compiler() is None, reason="no C compiler (tests/run-all.sh installs gcc)")


class Bins(NamedTuple):
    fast: str       # the front end, handing Megatron jobs to this Python
    no_python: str  # the same with a missing interpreter: any Python hand-off shows as a warning
    fake: str       # the fake sbatch
    work: Path      # submit directory with plain.sh, meg.sh, big.sh, adir/
    tmp: Path       # TMPDIR of every run (where the Python psbatch writes rewritten scripts)


@pytest.fixture(scope="module")
def bins(tmp_path_factory: pytest.TempPathFactory) -> Bins:
    if _compiler() is None:
        pytest.skip("no C compiler (tests/run-all.sh installs gcc)")
    base = tmp_path_factory.mktemp("psbatch-fast")
    fast = fast_build.build(base / "psbatch", extra_flags=("-Wall", "-Wextra", "-Werror"))
    no_python = fast_build.build(base / "psbatch-nopy", python="/nonexistent/python3", check_python=False)
    (base / "fake.c").write_text(FAKE_SBATCH_C)
    subprocess.run([_compiler(), "-O2", "-o", str(base / "sbatch"), str(base / "fake.c")], check=True)
    work, tmp = base / "work", base / "tmp"
    work.mkdir()
    tmp.mkdir()
    (work / "plain.sh").write_bytes(PLAIN)
    (work / "meg.sh").write_bytes(MEGATRON)
    (work / "big.sh").write_bytes(MEGATRON + b"#" * psbatch.MAX_SCRIPT_BYTES)
    (work / "adir").mkdir()
    return Bins(str(fast), str(no_python), str(base / "sbatch"), work, tmp)


class Outcome(NamedTuple):
    rc: int
    stdout: bytes
    stderr: bytes
    calls: list[dict]


def _calls(log: Path) -> list[dict]:
    data = log.read_bytes() if log.exists() else b""
    calls: list[dict] = []
    i = 0
    while i < len(data):
        colon = data.index(b":", i)
        tag, size = chr(data[i]), int(data[i + 1:colon])
        body, i = data[colon + 1:colon + 1 + size], colon + 1 + size
        if tag == "C":
            calls.append({"argv0": body, "argv": [], "scripts": [], "stdin": None})
        elif tag in "AT":
            calls[-1]["argv"].append(body if tag == "A" else b"$TMPDIR/psbatch-?/" + body)
        elif tag == "F":
            calls[-1]["scripts"].append(body)
        else:
            calls[-1]["stdin"] = body
    return calls


def _run(bins: Bins, front: list[str] | tuple[str, ...], args: list[str], stdin: Optional[bytes] = b"",
         rc: int = 0, env: Optional[dict[str, str]] = None, cwd: Optional[Path] = None) -> Outcome:
    log = bins.tmp / "calls.log"
    if log.exists():
        log.unlink()
    # the decision made in C is off unless a test turns it on (PIPESWIFT_PSBATCH_FAST=None)
    run_env = _env(PIPESWIFT_SBATCH=bins.fake, FAKE_SBATCH_LOG=str(log), FAKE_SBATCH_TMP=str(bins.tmp),
                   FAKE_SBATCH_RC=str(rc), TMPDIR=str(bins.tmp), PIPESWIFT_PSBATCH_HELPER="off",
                   PIPESWIFT_PSBATCH_FAST="off")
    run_env.pop("PIPESWIFT_DEBUG", None)
    run_env.update(env or {})
    for key in [k for k, v in run_env.items() if v is None]:
        del run_env[key]
    done = subprocess.run([*front, *args], input=stdin, stdin=subprocess.DEVNULL if stdin is None else None,
                          capture_output=True, cwd=cwd or bins.work, env=run_env, timeout=60, check=False)
    return Outcome(done.returncode, done.stdout, done.stderr, _calls(log))


def _sent(args: list[str], stdin: Optional[bytes]) -> list[dict]:
    argv = [os.fsencode(a) for a in args]
    return [{"argv0": b"sbatch", "argv": argv, "scripts": [], "stdin": stdin or b""}]


# ---------------------------------------------------------------- the generated tables


@needs_cc
def test_header_matches_the_python_tables(tmp_path):
    (tmp_path / "psbatch_tables.h").write_text(fast_build.header_text())
    (tmp_path / "dump.c").write_text(DUMP_TABLES_C)
    dump = str(tmp_path / "dump")
    subprocess.run([_compiler(), "-std=c99", "-Wall", "-Werror", "-o", dump, dump + ".c"], check=True)
    lines = subprocess.run([dump], capture_output=True, text=True, check=True).stdout.splitlines()
    got: dict[str, list[str]] = {}
    for line in lines:
        key, _, value = line.partition(" ")
        got.setdefault(key, []).append(value)
    assert got["max"] == [str(psbatch.MAX_SCRIPT_BYTES)]
    assert got["prefix"] == [sbatch_args.OWN_PREFIX] and got["defpath"] == [os.defpath]
    assert got["python"] == [sys.executable] and got["rc"] == ["127"]
    assert got["nosbatch"] == ["psbatch: error: sbatch not found (set PIPESWIFT_SBATCH or PATH)"]
    assert got["warn"] == ["psbatch: warning: %s; submitted unchanged"]
    assert got["marker"] == list(psbatch._MARKERS)
    assert set(got["nostdin"]) == set(sbatch_args._NO_STDIN)
    kinds = {n: 0 for n in sbatch_args._LONG_REQUIRED} | {n: 1 for n in sbatch_args._LONG_OPTIONAL} \
        | {n: 2 for n in sbatch_args._LONG_FLAGS}
    assert dict(v.split() for v in got["long"]) == {n: str(k) for n, k in kinds.items()}
    assert len(got["long"]) == len(sbatch_args._LONG_ALL)
    short = {v.split()[0]: v.split()[1:] for v in got["short"]}
    required = sbatch_args._LONG_REQUIRED
    assert short == {c: [n, "0" if n in required else "2"] for c, n in sbatch_args._SHORT.items()}
    assert got["flag"][:2] == ["-P", "-c"] and "from pipeswift_slurm.submit.psbatch import main" in got["flag"][2]


def test_print_header_command_and_light_import():
    env = _env()
    out = subprocess.run([sys.executable, "-m", "pipeswift_slurm.submit.fast.build", "--print-header"],
                         capture_output=True, text=True, env=env, check=True).stdout
    assert out == fast_build.header_text()
    code = ("import sys; sys.modules['click'] = sys.modules['sqlalchemy'] = None\n"
            "import pipeswift_slurm.submit.fast.build as b; b.header_text()")
    subprocess.run([sys.executable, "-c", code], env=env, check=True)


def test_c_string_escapes_everything_odd():
    assert fast_build.c_string('a"b\\c?\n\xe9') == '"a\\042b\\134c\\077\\012\\303\\251"'


# ---------------------------------------------------------------- jobs that are not Megatron jobs

PASS_THROUGH = {
    "script_file": (["-p", "gpu", "--parsable", "plain.sh", "a b", "--num-layers"], b""),
    "wrap": (["--wrap", "echo hi", "-J", "w"], MEGATRON),
    "wrap_inline_last_wins": (["--wrap=pretrain_gpt.py", "--wrap=echo hi"], b""),
    "wrap_prefix": (["--wr", "echo hi"], b""),
    "stdin": (["-J", "x"], PLAIN),
    "stdin_empty": ([], b""),
    "stdin_devnull": (["-H"], None),
    "het_job": (["-n1", ":", "-n2", "-J", "meg.sh", "plain.sh"], b""),
    "het_stdin": (["-n1", ":", "-n2"], PLAIN),
    "help": (["--help"], MEGATRON),
    "usage_short": (["-u"], MEGATRON),
    "version": (["-V"], MEGATRON),
    "unknown_long": (["--frobnicate"], MEGATRON),
    "unknown_short": (["-Z"], MEGATRON),
    "unknown_then_script": (["--frobnicate", "plain.sh"], b""),
    "values_look_like_files": (["-o", "meg.sh", "-e", "meg.sh", "--comment", "meg.sh", "plain.sh"], MEGATRON),
    "value_looks_like_option": (["-J", "--wrap", "plain.sh"], b""),
    "job_name_then_script": (["-J", "name", "plain.sh", "meg.sh"], b""),
    "bundled_short": (["-HQJmeg.sh", "plain.sh"], b""),
    "bundled_short_value_next": (["-HJ", "meg.sh", "plain.sh"], b""),
    "double_dash": (["-J", "x", "--", "plain.sh"], b""),
    "long_prefixes": (["--part=gpu", "--gpus-per-n", "4", "--exclusive", "plain.sh"], b""),
    "long_prefix_value_looks_like_file": (["--comm", "meg.sh", "plain.sh"], b""),
    "ambiguous_prefix_is_unknown": (["--gpus-per"], MEGATRON),
    "inline_value_of_required": (["--job-name=x", "-Jmeg.sh", "--output", "meg.sh", "plain.sh"], b""),
    "flag_with_inline_value": (["--hold=meg.sh"], b""),
    "optional_value_not_taken": (["--exclusive", "plain.sh"], b""),
    "missing_script": (["missing.sh"], MEGATRON),
    "script_is_a_folder": (["adir"], MEGATRON),
    "too_big_script": (["big.sh"], b""),
    "too_big_stdin": ([], MEGATRON + b"#" * (1 << 20)),
    "option_missing_its_value": (["-J"], b""),
    "pipeswift_after_script": (["plain.sh", "--pipeswift-gpus=2"], b""),
}


@needs_cc
@pytest.mark.parametrize("case", sorted(PASS_THROUGH))
def test_not_megatron_passes_through_without_python(bins, case):
    args, stdin = PASS_THROUGH[case]
    got = _run(bins, [bins.no_python], args, stdin)  # a Python hand-off would warn
    assert (got.rc, got.stderr) == (0, b"")
    assert got.calls == _sent(args, stdin)
    assert _run(bins, [bins.fast], args, stdin) == got
    assert _run(bins, PYTHON_PSBATCH, args, stdin) == got


@needs_cc
@pytest.mark.parametrize("front", ["fast", "python"])
def test_terminal_stdin_is_not_read(bins, front):
    leader, follower = os.openpty()
    try:
        log = bins.tmp / "calls.log"
        if log.exists():
            log.unlink()
        env = _env(PIPESWIFT_SBATCH=bins.fake, FAKE_SBATCH_LOG=str(log), TMPDIR=str(bins.tmp),
                   PIPESWIFT_PSBATCH_HELPER="off", PIPESWIFT_PSBATCH_FAST="off")
        cmd = [bins.fast] if front == "fast" else list(PYTHON_PSBATCH)
        done = subprocess.run(cmd, stdin=follower, env=env, cwd=bins.work, capture_output=True, timeout=30,
                              check=False)
    finally:
        os.close(follower)
        os.close(leader)
    assert done.returncode == 0
    assert _calls(log) == [{"argv0": b"sbatch", "argv": [], "scripts": [], "stdin": None}]


@needs_cc
def test_exit_code_and_output_pass_through(bins):
    got = _run(bins, [bins.fast], ["--wrap", "true", "-p", "nope"], rc=3)
    assert got.rc == 3 and got.stdout == b"" and got.stderr == b"sbatch: error: fake failure\n"
    got = _run(bins, [bins.fast], ["--parsable", "plain.sh"])
    assert got.rc == 0 and got.stdout == b"42\n"


@needs_cc
def test_built_against_glibc_it_behaves_as_the_default_build(bins, helper, tmp_path):
    """The default build uses musl when it is installed; the one ``cc`` links against
    glibc (what a machine without musl-gcc gets) does exactly the same: passes plain jobs
    through, hands Megatron jobs to the helper, and says the same when sbatch is missing."""
    glibc = str(fast_build.build(tmp_path / "psbatch", cc=_compiler(), python="/nonexistent/python3",
                                 check_python=False))
    for case in sorted(PASS_THROUGH):
        args, stdin = PASS_THROUGH[case]
        assert _run(bins, [glibc], args, stdin) == _run(bins, [bins.no_python], args, stdin), case
    for args, stdin in [(["-p", "gpu", "meg.sh", "x"], b""), (["-J", "m"], MEGATRON)]:
        got = _run(bins, [glibc], args, stdin, env=_helper_env(helper))
        assert got == _run(bins, [bins.no_python], args, stdin, env=_helper_env(helper)), args
        assert got.calls[0]["argv"][0].startswith(b"--comment=pswift1;") and got.stderr == b""
    missing = {"PIPESWIFT_SBATCH": "/nonexistent/sbatch"}
    said = _run(bins, [glibc], ["plain.sh"], env=missing)
    assert said.rc != 0 and said == _run(bins, [bins.no_python], ["plain.sh"], env=missing)


def test_the_default_build_prefers_musl_then_cc(monkeypatch):
    found = {"cc", "musl-gcc", "clang"}
    monkeypatch.setattr(fast_build.shutil, "which", lambda name: name in found and "/usr/bin/" + name or None)
    monkeypatch.delenv("CC", raising=False)
    static, dynamic = fast_build.STATIC, ()
    assert fast_build.attempts() == [(["musl-gcc"], static), (["cc"], static), (["cc"], dynamic)]
    assert fast_build.attempts("clang -O1") == [(["clang", "-O1"], static), (["clang", "-O1"], dynamic)]
    monkeypatch.setenv("CC", "clang")
    assert fast_build.attempts() == [(["clang"], static), (["clang"], dynamic)]  # named: used alone
    monkeypatch.delenv("CC")
    found.discard("cc")
    assert fast_build.attempts() == [(["musl-gcc"], static)]  # musl alone will do
    found.discard("musl-gcc")
    with pytest.raises(fast_build.BuildError, match="C compiler 'cc' not found"):
        fast_build.attempts()
    found.add("cc")
    assert fast_build.attempts() == [(["cc"], static), (["cc"], dynamic)]


# ---------------------------------------------------------------- Megatron jobs: the Python psbatch


@needs_cc
def test_megatron_script_file_goes_through_python(bins):
    got = _run(bins, [bins.fast], ["-p", "gpu", "meg.sh", "x"])
    assert got.rc == 0 and got.stderr == b"", got.stderr
    [call] = got.calls
    assert call["argv"][0].startswith(b"--comment=pswift1;") and call["argv"][1:] == [
        b"-p", b"gpu", b"$TMPDIR/psbatch-?/meg.sh", b"x"]
    assert call["scripts"] == [ROUTED]
    assert _run(bins, PYTHON_PSBATCH, ["-p", "gpu", "meg.sh", "x"]) == got


@needs_cc
def test_megatron_stdin_and_wrap_go_through_python(bins):
    got = _run(bins, [bins.fast], ["-J", "m"], MEGATRON)
    assert got.rc == 0 and got.stderr == b"" and got.calls[0]["stdin"] == ROUTED
    assert got.calls[0]["argv"][0].startswith(b"--comment=pswift1;")
    cmd = MEGATRON.decode().splitlines()[-1]
    got = _run(bins, [bins.fast], ["--gpus=2", "--wrap", cmd], b"unrelated")
    assert got.calls[0]["argv"][1] == b"--wrap=pipeswift-launch -- " + cmd.encode()


@needs_cc
@pytest.mark.parametrize("args, text", [
    (["--pipeswift-gpus=2-8", "plain.sh"], None),          # own option, plain script
    (["--pipeswift=off", "meg.sh"], None),                 # own option: opt out
    (["pswift.sh"], b"#!/bin/bash\n#PSWIFT gpus=2-4\necho no training here\n"),
    (["bad.sh"], b"#!/bin/bash\npython pretrain_gpt.py --num-layers 3\n"),
])
def test_markers_and_own_options_go_through_python(bins, args, text):
    if text is not None:
        (bins.work / args[-1]).write_bytes(text)
    got = _run(bins, [bins.fast], args)
    assert got == _run(bins, PYTHON_PSBATCH, args)
    without_own = [os.fsencode(a) for a in args if not a.startswith("--pipeswift")]
    assert got.rc == 0 and got.calls[0]["argv"] == without_own  # submitted unchanged...
    # ...by the Python psbatch: without an interpreter, the compiled one says so, and still submits.
    fallback = _run(bins, [bins.no_python], args)
    assert fallback.rc == 0 and fallback.calls == got.calls
    assert fallback.stderr.decode().startswith(
        "psbatch: warning: cannot run the Python psbatch (/nonexistent/python3: ")
    assert fallback.stderr.decode().endswith("; submitted unchanged\n")


@needs_cc
@pytest.mark.parametrize("args", [["--pipeswift=check", "meg.sh"], ["--pipeswift-=check", "plain.sh"],
                                  ["-p", "gpu", "--pipeswift--", "check", "meg.sh"]])
def test_check_is_the_python_report_and_never_a_submission(bins, helper, args):
    """--pipeswift=check: the report comes from the Python psbatch, through the helper too
    (it answers "fall back"); when no Python can run, the front end fails without
    submitting, where other jobs would go to sbatch unchanged."""
    python = _run(bins, PYTHON_PSBATCH, args)
    assert python.calls == [] and python.rc == (1 if "plain.sh" in args else 0) and python.stdout
    assert _run(bins, [bins.fast], args) == python
    assert _run(bins, [bins.fast], args, env=_helper_env(helper)) == python
    for env in (None, _helper_env(helper)):
        got = _run(bins, [bins.no_python], args, env=env)
        assert got.rc == 2 and got.calls == [] and got.stdout == b""
        assert got.stderr.decode().startswith("psbatch: error: --pipeswift=check needs the Python psbatch")


# ---------------------------------------------------------------- finding sbatch


@needs_cc
def test_finds_real_sbatch_on_path_skipping_itself(bins, tmp_path):
    mine, real = tmp_path / "mine", tmp_path / "real"
    mine.mkdir()
    real.mkdir()
    shutil.copy(bins.fast, mine / "sbatch")                 # installed as sbatch itself
    (real / "sbatch").symlink_to(bins.fake)
    env = {"PIPESWIFT_SBATCH": "", "PATH": "%s:%s:%s" % (mine, real, os.defpath)}
    got = _run(bins, [str(mine / "sbatch")], ["plain.sh"], env=env)
    assert got.rc == 0 and got.calls == _sent(["plain.sh"], b"")
    got = _run(bins, [str(mine / "sbatch")], ["meg.sh"], env=env)  # Python is told which sbatch: no loop
    assert got.rc == 0 and got.calls[0]["argv"][0].startswith(b"--comment=pswift1;")
    assert got.calls[0]["scripts"] == [ROUTED]


@needs_cc
@pytest.mark.parametrize("env", [{"PIPESWIFT_SBATCH": "/nonexistent/sbatch"},
                                 {"PIPESWIFT_SBATCH": "", "PATH": "/nonexistent"}])
@pytest.mark.parametrize("args", [["plain.sh"], ["meg.sh"], ["--pipeswift-gpus=2", "meg.sh"]])
def test_no_sbatch_is_the_python_error(bins, env, args):
    got = _run(bins, [bins.fast], args, env=env)
    assert got == _run(bins, PYTHON_PSBATCH, args, env=env)
    assert got.rc == 127 and got.calls == []
    assert got.stderr == b"psbatch: error: sbatch not found (set PIPESWIFT_SBATCH or PATH)\n"


# ---------------------------------------------------------------- the safety property

_WORDS = ["-H", "-J", "x", "-Jname", "-HJ", "-HQ", "-o", "-e", "-N", "2", "-p", "gpu", "--wrap",
          "--wrap=echo hi", "--wrap=pretrain_gpt.py", "--wr", "--comment", "--comment=--num-layers",
          "--parsable", "--help", "-h", "--usage", "-u", "--version", "-V", "--frobnicate", "-Z", "-é",
          ":", "--", "-", "=", "--=x", "--exclusive", "--exclusive=user", "--nice=5", "--mem", "--gpus=2",
          "--gres=gpu:1", "--test-only", "--part", "--p", "--pipeswift-gpus=2-8", "--pipeswift",
          "--pipeswift=off", "--pipeswift-pp", "1,2", "--num-layers", "job.sh", "plain.sh", "meg.sh",
          "missing.sh", "adir", "big.sh", "a b"]
_LINES = ["#!/bin/bash", "#SBATCH --gpus=2", "#SBATCH hetjob", "#PSWIFT gpus=2-4", "#PSWIFT off", "echo hi",
          "A='--num-layers 4'", "torchrun pretrain_gpt.py $A --hidden-size 64 --num-attention-heads 4",
          " --seq-length 64 --global-batch-size 8 --train-iters 10 \\", "python pretrain_gpt.py --num-layers x", "\udcff",
          "#SBATCH --comment='q", "srun true"]
_word = st.sampled_from(_WORDS)
_text = st.text(max_size=5).filter(lambda w: "\x00" not in w)
_options = st.lists(_word.filter(lambda w: w.startswith("-") or w in ("2", "x", "gpu", "1,2")), max_size=6)
_argv = st.lists(_word | _word | _text, max_size=8) | st.builds(lambda a, b: a + b, _options,
                                                              st.lists(_word | _text, max_size=2))
_script = st.lists(st.sampled_from(_LINES) | st.text(max_size=12), max_size=6).map("\n".join)
_stdin = st.sampled_from([None, b"", PLAIN, MEGATRON, b"#PSWIFT off\n"]) | st.binary(max_size=40) \
    | _script.map(lambda t: t.encode("utf-8", "surrogateescape"))
_job = st.sampled_from([PLAIN, MEGATRON]) | _script.map(lambda t: t.encode("utf-8", "surrogateescape"))
EXAMPLES = int(os.environ.get("PSBATCH_FAST_EXAMPLES", "60"))


class _Stdin:
    """sys.stdin as the Python psbatch sees a pipe or /dev/null."""

    def __init__(self, data: bytes):
        self.buffer = io.BytesIO(data)

    def isatty(self) -> bool:
        return False


@needs_cc
@settings(max_examples=4 * EXAMPLES, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(args=_argv, job=_job, stdin=_stdin)
def test_hands_off_exactly_when_python_would_look_closer(bins, args, job, stdin, monkeypatch):
    """The decision itself, against psbatch.py's own functions: the compiled front end
    starts Python (here: fails to, and says so) exactly when the Python psbatch would go
    past its cheap test (own options, or a marker in the text read_source finds), and
    sbatch always gets the same stdin bytes."""
    (bins.work / "job.sh").write_bytes(job)
    monkeypatch.chdir(bins.work)
    stripped, pairs = sbatch_args.strip_own_options(args)
    source = psbatch.read_source(stripped, _Stdin(stdin or b""))
    hand_off = bool(pairs) or (source.text is not None and any(m in source.text for m in psbatch._MARKERS))
    got = _run(bins, [bins.no_python], args, stdin)
    assert got.rc == 0
    assert got.stderr.startswith(b"psbatch: warning: cannot run the Python psbatch") == hand_off
    assert got.stderr == b"" or hand_off
    assert got.calls == _sent(stripped if hand_off else args, stdin)


@needs_cc
@settings(max_examples=EXAMPLES, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(args=_argv, job=_job, stdin=_stdin, rc=st.sampled_from([0, 0, 1]))
def test_same_outcome_as_the_python_psbatch(bins, args, job, stdin, rc):
    (bins.work / "job.sh").write_bytes(job)
    fast = _run(bins, [bins.fast], args, stdin, rc)
    slow = _run(bins, PYTHON_PSBATCH, args, stdin, rc)
    assert fast == slow
    assert b"Traceback" not in fast.stderr


# ---------------------------------------------------------------- the resident helper

HELPER_MODULE = (sys.executable, "-m", "pipeswift_slurm.submit.helper")


def _helper_env(folder: Path, **extra: str) -> dict[str, str]:
    return {"PIPESWIFT_PSBATCH_HELPER": "on", "PIPESWIFT_PSBATCH_HELPER_DIR": str(folder), **extra}


def _wait_for(check, timeout_s: float = 60.0) -> bool:
    import time

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if check():
            return True
        time.sleep(0.05)
    return False


def _helper_cmd(command: str, folder: Path) -> subprocess.CompletedProcess:
    return subprocess.run([*HELPER_MODULE, command, "--dir", str(folder)], env=_env(), capture_output=True,
                          text=True, timeout=60, check=False)


def _serving(folder: Path) -> bool:
    from pipeswift_slurm.submit import helper as psbatch_helper

    return psbatch_helper.running_pid(str(folder)) is not None and (folder / "psbatch.sock").exists()


@pytest.fixture(scope="module")
def helper(bins) -> Path:
    """A helper serving this checkout, for the module; stopped at the end."""
    folder = bins.tmp.parent / "helper"
    proc = subprocess.Popen([*HELPER_MODULE, "serve", "--dir", str(folder), "--idle-s", "600"], env=_env())
    try:
        assert _wait_for(lambda: _serving(folder)), "the helper did not start"
        yield folder
    finally:
        proc.terminate()
        proc.wait(timeout=30)


@needs_cc
@settings(max_examples=2 * EXAMPLES, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(args=_argv, job=_job, stdin=_stdin, rc=st.sampled_from([0, 0, 1]))
def test_helper_answers_exactly_as_the_python_psbatch(bins, helper, args, job, stdin, rc):
    """Through the helper, a front end that cannot start Python (any hand-off to Python
    would show as a warning) hands sbatch what the Python psbatch would, every time: asked
    first, then again (from the helper's memo when the answer was reusable)."""
    (bins.work / "job.sh").write_bytes(job)
    got = _run(bins, [bins.no_python], args, stdin, rc, env=_helper_env(helper))
    assert got == _run(bins, PYTHON_PSBATCH, args, stdin, rc)
    assert b"cannot run the Python psbatch" not in got.stderr
    assert _run(bins, [bins.no_python], args, stdin, rc, env=_helper_env(helper)) == got


@needs_cc
def test_helper_serves_megatron_jobs_and_own_options(bins, helper):
    from pipeswift_slurm.submit import helper as ph

    for args, stdin in [(["-p", "gpu", "meg.sh", "x"], b""), (["-J", "m"], MEGATRON),
                        (["--pipeswift-gpus=2-8", "--parsable", "meg.sh"], b""), (["bad.sh"], b"")]:
        if args == ["bad.sh"]:
            (bins.work / "bad.sh").write_bytes(b"#!/bin/bash\npython pretrain_gpt.py --num-layers 3\n")
        got = _run(bins, [bins.no_python], args, stdin, env=_helper_env(helper))
        assert got == _run(bins, PYTHON_PSBATCH, args, stdin), args
    [call] = _run(bins, [bins.no_python], ["-p", "gpu", "meg.sh", "x"], env=_helper_env(helper)).calls
    assert call["argv"][0].startswith(b"--comment=pswift1;") and call["scripts"] == [ROUTED]
    assert not [p for p in bins.tmp.iterdir() if p.name.startswith("psbatch-")]  # temp scripts removed
    # the front end wrote the rewritten script in the helper's folder and exec'd sbatch on it;
    # the helper removes it once that sbatch has ended
    assert _wait_for(lambda: not [p for p in helper.iterdir() if p.name.startswith("psbatch-")],
                     ph.JOB_MIN_AGE_S + 10.0)


def test_helper_removes_the_scripts_of_ended_submissions_only(tmp_path):
    import time

    from pipeswift_slurm.submit import helper as ph

    folder = tmp_path / "h"
    folder.mkdir(mode=0o700)
    ended = subprocess.Popen(["true"])
    ended.wait()
    alive = subprocess.Popen(["sleep", "60"])
    try:
        for pid, tag in ((ended.pid, "old"), (alive.pid, "old"), (ended.pid, "new")):
            job = folder / ("%s%d-%s" % (ph.JOB_PREFIX, pid, tag))
            job.mkdir()
            (job / "meg.sh").write_text("#!/bin/bash\n")
            if tag == "old":
                os.utime(job, (time.time() - 60, time.time() - 60))
        (folder / "psbatch-notapid").mkdir()
        ph.remove_ended_jobs(str(folder))
        assert sorted(p.name for p in folder.iterdir()) == sorted([  # running, or just written
            "psbatch-%d-old" % alive.pid, "psbatch-%d-new" % ended.pid, "psbatch-notapid"])
    finally:
        alive.kill()
        alive.wait()
    ph.remove_ended_jobs(str(folder), min_age_s=0.0)
    assert [p.name for p in folder.iterdir()] == ["psbatch-notapid"]


@needs_cc
def test_first_use_starts_a_helper_and_stop_ends_it(bins, tmp_path):
    from pipeswift_slurm.submit import helper as ph

    folder = tmp_path / "h"
    first = _run(bins, [bins.fast], ["meg.sh"], env=_helper_env(folder))  # no helper yet: Python
    assert first == _run(bins, PYTHON_PSBATCH, ["meg.sh"])
    try:
        assert _wait_for(lambda: _serving(folder)), "the front end did not start a helper"
        assert (folder.stat().st_mode & 0o777) == 0o700
        assert _run(bins, [bins.no_python], ["meg.sh"], env=_helper_env(folder)) == first
        # the helper writes its answer to the memo once no request came for a moment
        assert _wait_for(lambda: ph.memo_size(str(folder)) == 1), "the answer never reached the memo"
        status = _helper_cmd("status", folder)
        assert status.returncode == 0 and status.stdout.startswith("running (pid ")
        assert status.stdout.endswith("; 1 answer in its memo\n")
    finally:
        stop = _helper_cmd("stop", folder)
    assert stop.returncode == 0 and stop.stdout.startswith("stopped pid ")
    assert _wait_for(lambda: not (folder / "psbatch.sock").exists())
    assert _helper_cmd("status", folder).stdout.startswith("not running")


@needs_cc
@pytest.mark.parametrize("how", ["off", "unsafe_folder", "in_a_job", "stale_socket"])
def test_no_helper_means_the_python_psbatch(bins, tmp_path, how):
    """Off, a folder others can enter, or inside a Slurm job: no helper is asked or
    started. A socket left by a dead helper: the Python psbatch, and a new helper."""
    import socket

    folder = tmp_path / "h"
    env = _helper_env(folder)
    if how == "off":
        env["PIPESWIFT_PSBATCH_HELPER"] = "off"
    elif how == "unsafe_folder":
        folder.mkdir(mode=0o755)
        folder.chmod(0o755)
    elif how == "in_a_job":
        env["SLURM_JOB_ID"] = "7"
    else:
        folder.mkdir(mode=0o700)
        dead = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        dead.bind(str(folder / "psbatch.sock"))
        dead.close()
    got = _run(bins, [bins.no_python], ["meg.sh"], env=env)
    assert got.stderr.startswith(b"psbatch: warning: cannot run the Python psbatch")
    assert got.calls == _sent(["meg.sh"], b"")
    try:
        assert _run(bins, [bins.fast], ["meg.sh"], env=env) == _run(bins, PYTHON_PSBATCH, ["meg.sh"])
        if how == "stale_socket":
            assert _wait_for(lambda: _serving(folder))
        else:
            import time

            time.sleep(2.0)  # a helper, had one been started, binds within a second here
            assert not (folder / "psbatch.sock").exists()
    finally:
        _helper_cmd("stop", folder)


@needs_cc
def test_a_helper_in_a_folder_others_can_enter_is_not_asked(bins, tmp_path):
    folder = tmp_path / "h"
    proc = subprocess.Popen([*HELPER_MODULE, "serve", "--dir", str(folder)], env=_env())
    try:
        assert _wait_for(lambda: _serving(folder))
        assert _run(bins, [bins.no_python], ["meg.sh"], env=_helper_env(folder)).stderr == b""
        folder.chmod(0o755)  # someone else could have put that socket there: not trusted
        got = _run(bins, [bins.no_python], ["meg.sh"], env=_helper_env(folder))
        assert got.stderr.startswith(b"psbatch: warning: cannot run the Python psbatch")
    finally:
        proc.terminate()
        proc.wait(timeout=30)


@needs_cc
def test_built_without_the_helper_it_asks_only_when_told(bins, helper, tmp_path):
    exe = str(fast_build.build(tmp_path / "psbatch", python="/nonexistent/python3", check_python=False,
                               helper=False))
    env = _helper_env(helper, PIPESWIFT_PSBATCH_HELPER="")
    assert _run(bins, [exe], ["meg.sh"], env=env).stderr.startswith(b"psbatch: warning: cannot run the Python")
    env["PIPESWIFT_PSBATCH_HELPER"] = "1"
    assert _run(bins, [exe], ["meg.sh"], env=env) == _run(bins, PYTHON_PSBATCH, ["meg.sh"])


@needs_cc
def test_a_helper_that_never_answers_costs_a_timeout_not_the_job(bins, tmp_path):
    import socket
    import time

    folder = tmp_path / "h"
    folder.mkdir(mode=0o700)
    mute = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    mute.bind(str(folder / "psbatch.sock"))
    mute.listen(4)
    try:
        start = time.monotonic()
        got = _run(bins, [bins.fast], ["meg.sh"], env=_helper_env(folder))
        waited_s = time.monotonic() - start
    finally:
        mute.close()
    assert got == _run(bins, PYTHON_PSBATCH, ["meg.sh"])
    assert waited_s >= 4.0  # the front end waited for the answer, then went to the Python psbatch


def test_the_helper_reads_the_environment_as_getenv_would():
    from pipeswift_slurm.submit.helper import EnvBlock

    env = EnvBlock(b"A=1\0B=two words\0A=again\0NOEQ\0=empty\0C=\xff\xfe\0D=\0E=x=y\0")
    assert (env["A"], env["B"], env["D"], env["E"]) == ("1", "two words", "", "x=y")  # the first A wins
    assert env["C"] == os.fsdecode(b"\xff\xfe")
    assert "NOEQ" not in env and "" not in env and "A=1" not in env and env.get("X") is None
    assert dict(env) == {"A": "1", "B": "two words", "C": os.fsdecode(b"\xff\xfe"), "D": "", "E": "x=y"}
    assert not EnvBlock(b"") and dict(EnvBlock(b"")) == {}


@needs_cc
def test_variables_from_the_submit_environment_reach_the_helper(bins, helper):
    """A training command whose flags come from the submitter's environment is read the
    same through the helper as by the Python psbatch (and differently for another value)."""
    (bins.work / "envmeg.sh").write_bytes(MEGATRON.replace(b"--num-layers 4", b"--num-layers $NL"))
    outcomes = []
    for layers in ("4", "8", "4", "8"):  # the last two: the same again, from the helper's memo
        got = _run(bins, [bins.no_python], ["envmeg.sh"], env=_helper_env(helper, NL=layers))
        assert got == _run(bins, PYTHON_PSBATCH, ["envmeg.sh"], env={"NL": layers})
        assert got.rc == 0 and got.stderr == b"" and got.calls[0]["argv"][0].startswith(b"--comment=pswift1;")
        outcomes.append(got.calls[0]["argv"][0])
    assert outcomes[0] != outcomes[1]  # the profile records the layers the environment gave
    unset = _run(bins, [bins.no_python], ["envmeg.sh"], env=_helper_env(helper, NL=None))
    assert unset == _run(bins, PYTHON_PSBATCH, ["envmeg.sh"], env={"NL": None})
    assert unset.stderr.startswith(b"psbatch: warning: Megatron job not opted in")  # "$NL" is no number


def _memo(folder: Path) -> list[str]:
    memo = folder / "memo"
    return sorted(p.name for p in memo.iterdir()) if memo.exists() else []


@needs_cc
def test_a_resubmission_is_carried_out_from_the_memo_without_asking(bins, tmp_path):
    """The helper remembers its answer; the same submission again (same argv, script and
    the variables the answer read) is carried out from the memo while the helper holds
    its lock, even when the helper could not answer (stopped here: asking it would time
    out and hand the job to Python, which this front end cannot start). Anything else is
    asked; the memo is gone once the helper exits."""
    import signal

    from pipeswift_slurm.submit import helper as ph

    folder = tmp_path / "h"
    proc = subprocess.Popen([*HELPER_MODULE, "serve", "--dir", str(folder)], env=_env())
    try:
        assert _wait_for(lambda: _serving(folder))
        env = _helper_env(folder, SBATCH_GRES="gpu:4")
        first = _run(bins, [bins.no_python], ["-p", "gpu", "meg.sh"], env=env)
        assert first == _run(bins, PYTHON_PSBATCH, ["-p", "gpu", "meg.sh"], env=env)
        assert _wait_for(lambda: len(_memo(folder)) == 1)
        entry = dict(ph.read_records_from((folder / "memo" / _memo(folder)[0]).read_bytes()))
        assert entry[b"k"].startswith(ph.encode_records([(b"v", os.fsencode(ph.protocol_id()))]))
        lock, kept_entry = folder / ph.LOCK_NAME, folder / "memo" / _memo(folder)[0]
        os.utime(lock, (0, 0))
        os.utime(kept_entry, (0, 0))
        proc.send_signal(signal.SIGSTOP)
        try:
            again = _run(bins, [bins.no_python], ["-p", "gpu", "meg.sh"], env=env)
            assert again == first and again.calls[0]["scripts"] == [ROUTED]
            assert lock.stat().st_mtime > 0  # marked: the helper counts the hit as a request
            assert kept_entry.stat().st_mtime > 0  # marked used: the memo drops the least recently used
            other = _run(bins, [bins.no_python], ["-p", "gpu", "meg.sh"],
                         env=dict(env, SBATCH_GRES="gpu:2"))  # a variable the answer read
            assert other.stderr.startswith(b"psbatch: warning: cannot run the Python psbatch")
        finally:
            proc.send_signal(signal.SIGCONT)
        assert _run(bins, [bins.no_python], ["-p", "gpu", "meg.sh"], env=dict(env, UNREAD="1")) == first
        [name] = _memo(folder)
        kept = (folder / "memo" / name).read_bytes()
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    assert _memo(folder) == []
    (folder / "memo" / name).write_bytes(kept)  # left behind (a helper killed with SIGKILL)
    got = _run(bins, [bins.no_python], ["-p", "gpu", "meg.sh"], env=env)
    assert got.stderr.startswith(b"psbatch: warning: cannot run the Python psbatch")  # no helper: not used


def test_memo_entries_record_what_the_answer_read():
    from pipeswift_slurm.submit import helper as ph

    key = [(b"v", os.fsencode(ph.protocol_id())), (b"a", b"-H"), (b"t", MEGATRON)]
    reply, environ = ph.respond(key + [(b"h", b"00000000000000aa"), (b"E", b"SBATCH_GRES=gpu:4\0B=1\0")])
    entry = ph.memo_entry(key, environ, reply)
    assert entry is not None
    records = ph.read_records_from(entry)
    assert records[0] == (b"k", ph.encode_records(key))
    asked = dict((records[i][1], records[i + 1]) for i in range(1, len(records)) if records[i][0] == b"g")
    assert asked.pop(b"SBATCH_GRES") == (b"G", b"gpu:4") and b"B" not in asked
    assert asked and all(value == (b"N", b"") for value in asked.values())  # SBATCH_GPUS and others: unset
    assert records[-len(reply):] == reply
    # not reusable: a fall back, an old front end's environment, the whole environment read
    assert ph.respond([(b"v", b"other")] + key[1:])[1] is None
    assert ph.memo_entry(key, {"A": "1"}, reply) is None
    env = ph.EnvBlock(b"A=1\0")
    dict(env)
    assert ph.memo_entry(key, env, reply) is None
    env = ph.EnvBlock(b"A=1\0")
    assert env.get("A=1") is None and ph.memo_entry(key, env, reply) is None


def test_the_memo_keeps_a_bounded_number_of_entries(tmp_path, monkeypatch):
    from pipeswift_slurm.submit import helper as ph

    monkeypatch.setattr(ph, "MEMO_MAX_ENTRIES", 4)
    for i in range(7):
        ph.remember(str(tmp_path), b"%016x" % i, b"entry %d" % i)
        os.utime(tmp_path / "memo" / ("%016x" % i), ns=(i * 10**9, i * 10**9))
    assert _memo(tmp_path) == ["%016x" % i for i in (3, 4, 5, 6)]  # the least recently used went
    ph.remember(str(tmp_path), b"../escape0000000", b"x")
    ph.remember(str(tmp_path), b"%016x" % 9, b"x" * (ph.MEMO_MAX_ENTRY_BYTES + 1))
    assert len(_memo(tmp_path)) == 4 and not (tmp_path / "escape0000000").exists()
    ph.clear_memo(str(tmp_path))
    assert _memo(tmp_path) == []


def test_a_request_asked_again_before_a_pause_is_remembered_at_once(monkeypatch):
    """New entries wait for a pause (not to compete with the sbatch just started), unless
    the same request comes again first: a loop resubmitting one job then gets the memo
    from its third submission on."""
    from pipeswift_slurm.submit import helper as ph

    monkeypatch.setattr(ph, "MEMO_MAX_ENTRIES", 3)
    pending: list[tuple[bytes, bytes]] = []
    assert ph.pend(pending, b"a", b"entry a") is None and pending == [(b"a", b"entry a")]
    assert ph.pend(pending, b"b", b"entry b") is None
    assert ph.pend(pending, b"a", b"entry a2") == (b"a", b"entry a2")  # asked again: write now
    assert pending == [(b"b", b"entry b")]
    for name in (b"c", b"d", b"e"):
        assert ph.pend(pending, name, b"x") is None
    assert [name for name, _ in pending] == [b"b", b"c", b"d"]  # bounded: the rest waits for a new request


@needs_cc
def test_memo_hits_keep_the_helper_from_exiting_idle(bins, tmp_path):
    import time

    folder = tmp_path / "h"
    proc = subprocess.Popen([*HELPER_MODULE, "serve", "--dir", str(folder), "--idle-s", "3"], env=_env())
    try:
        assert _wait_for(lambda: _serving(folder))
        first = _run(bins, [bins.no_python], ["meg.sh"], env=_helper_env(folder))
        assert _wait_for(lambda: len(_memo(folder)) == 1)
        until = time.monotonic() + 7.0
        while time.monotonic() < until:  # over twice the idle time, with memo hits only
            assert _run(bins, [bins.no_python], ["meg.sh"], env=_helper_env(folder)) == first
            time.sleep(0.3)
        assert proc.poll() is None
        assert proc.wait(timeout=30) == 0  # without them, it exits idle
    finally:
        proc.kill()
        proc.wait()
    assert _memo(folder) == []


def test_the_helper_folder_prefers_a_runtime_folder_then_shared_memory(tmp_path):
    from pipeswift_slurm.submit import helper as ph

    shm = tmp_path / "shm"
    shm.mkdir()
    shm.chmod(0o1777)
    assert ph.helper_dir({"PIPESWIFT_PSBATCH_HELPER_DIR": "/x", "XDG_RUNTIME_DIR": "/run/user/7"}, 7) == "/x"
    assert ph.helper_dir({"XDG_RUNTIME_DIR": "/run/user/7"}, 7, str(shm)) == "/run/user/7/pipeswift"
    assert ph.helper_dir({"XDG_RUNTIME_DIR": "relative"}, 7, str(shm)) == str(shm / "pipeswift-7")
    shm.chmod(0o777)  # not sticky: others could remove the user's folder
    assert ph.helper_dir({}, 7, str(shm)) == "/tmp/pipeswift-7"
    assert ph.helper_dir({}, 7, str(tmp_path / "missing")) == "/tmp/pipeswift-7"


@needs_cc
def test_the_front_end_finds_the_helper_folder_as_python_does(bins):
    """Without $PIPESWIFT_PSBATCH_HELPER_DIR and $XDG_RUNTIME_DIR, the front end starts a
    helper (here: fails to; its Python is missing) in the folder psbatch_helper names."""
    from pipeswift_slurm.submit import helper as ph

    folder = Path(ph.helper_dir({}, os.getuid()))
    existed = folder.exists()
    try:
        got = _run(bins, [bins.no_python], ["meg.sh"], env={"PIPESWIFT_PSBATCH_HELPER": "on",
                                                           "PIPESWIFT_PSBATCH_HELPER_DIR": None,
                                                           "XDG_RUNTIME_DIR": None})
        assert got.stderr.startswith(b"psbatch: warning: cannot run the Python psbatch")
        assert folder.is_dir() and (folder.stat().st_mode & 0o777) == 0o700
    finally:
        if not existed and folder.is_dir():
            shutil.rmtree(folder)


def test_helper_answer_falls_back_on_another_checkout():
    import socket

    from pipeswift_slurm.submit import helper as ph

    request = [(b"v", os.fsencode(ph.protocol_id())), (b"a", b"-H"), (b"E", b"A=1\0"),
               (b"t", MEGATRON)]
    said = dict(ph.respond(request)[0])
    assert said[b"a"] == b"-H" and said[b"i"] == ROUTED  # the stdin script, routed
    assert ph.respond([(b"v", os.fsencode(ph.protocol_id("/elsewhere")))] + request[1:])[0] == [(b"x", b"")]
    with pytest.raises(ValueError):
        ours, theirs = socket.socketpair()
        with ours, theirs:
            theirs.sendall(ph.encode([(b"t", b"#" * 100)]))
            ph.read_records(ours, limit=64)


def test_helper_exits_soon_after_its_code_changes_and_serves_until_then(tmp_path):
    import socket
    import time

    from pipeswift_slurm.submit import helper as ph

    folder, installed = tmp_path / "h", tmp_path / "installed"
    code = ("import os, sys; import pipeswift_slurm.submit.helper as ph; stamp = ph._code_stamp;"
            " ph._code_stamp = lambda: dict(stamp(), new=os.path.exists(%r));"
            " sys.exit(ph.serve(%r, 60))" % (str(installed), str(folder)))
    helper = subprocess.Popen([sys.executable, "-c", code], env=_env())
    try:
        sock = folder / "psbatch.sock"
        deadline = time.monotonic() + 30
        while not sock.exists() and time.monotonic() < deadline:
            time.sleep(0.02)
        request = [(b"v", os.fsencode(ph.protocol_id())), (b"a", b"-H"), (b"t", MEGATRON)]
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
            conn.connect(str(sock))
            conn.sendall(ph.encode(request))
            assert dict(ph.read_records(conn))[b"i"] == ROUTED
        installed.touch()  # a new install: the helper must not outlive it by much
        start = time.monotonic()
        assert helper.wait(timeout=10) == 0
        assert time.monotonic() - start < 2.5 * ph.CODE_CHECK_S
        assert not sock.exists()  # the next submission starts a helper on the new code
    finally:
        helper.kill()
        helper.wait()


# ---------------------------------------------------------------- the decision made in C

FAST_ON = {"PIPESWIFT_PSBATCH_FAST": None}  # for _run: the default (on)
CANNOT_RUN_PYTHON = b"psbatch: warning: cannot run the Python psbatch"
INVALID_WARNING = b"psbatch: warning: Megatron job not opted in to PipeSwift: invalid Megatron arguments"
LAUNCH = b"pipeswift-launch -- "


class Job(NamedTuple):
    """A Megatron job script the Python psbatch opts in, and the submit environment it needs."""

    text: bytes
    env: dict[str, str] = {}


# Modelled on NVIDIA Megatron-LM's example scripts; each one valid for Megatron on the
# GPUs its #SBATCH lines (or sbatch's input variables) ask for.
CORPUS = {
    # Megatron-LM examples/gpt3/train_gpt3_175b_distributed.sh, scaled down: bash arrays
    "gpt3_arrays": Job(b"""#!/bin/bash
#SBATCH --job-name=gpt3-small
#SBATCH --nodes=1
#SBATCH --gpus-per-node=8
#SBATCH --time=04:00:00

# Runs a small GPT-3 style model

export CUDA_DEVICE_MAX_CONNECTIONS=1

GPUS_PER_NODE=8
# Change for multinode config
MASTER_ADDR=localhost
MASTER_PORT=6000
NUM_NODES=1
NODE_RANK=0

CHECKPOINT_PATH=$1 #<Specify path>
TENSORBOARD_LOGS_PATH=$2 #<Specify path>
VOCAB_FILE=$3 #<Specify path to file>/gpt2-vocab.json
MERGE_FILE=$4 #<Specify path to file>/gpt2-merges.txt
DATA_PATH=$5 #<Specify path and file prefix>_text_document

DISTRIBUTED_ARGS=(
    --nproc_per_node $GPUS_PER_NODE
    --nnodes $NUM_NODES
    --master_addr $MASTER_ADDR
    --master_port $MASTER_PORT
)

GPT_MODEL_ARGS=(
    --num-layers 12
    --hidden-size 768
    --num-attention-heads 12
    --seq-length 1024
    --max-position-embeddings 1024
    --attention-backend auto # Can use (flash/fused/unfused/local)
)

TRAINING_ARGS=(
    --micro-batch-size 2
    --global-batch-size 64
    --train-iters 500000
    --weight-decay 0.1
    --adam-beta1 0.9
    --adam-beta2 0.95
    --init-method-std 0.006
    --clip-grad 1.0
    --bf16
    --lr 6.0e-5
    --lr-decay-style cosine
    --min-lr 6.0e-6
    --lr-warmup-fraction .001
    --lr-decay-iters 430000
)

MODEL_PARALLEL_ARGS=(
\t--tensor-model-parallel-size 2
\t--pipeline-model-parallel-size 2
)

DATA_ARGS=(
    --data-path $DATA_PATH
    --vocab-file $VOCAB_FILE
    --merge-file $MERGE_FILE
    --split 949,50,1
)

EVAL_AND_LOGGING_ARGS=(
    --log-interval 100
    --save-interval 10000
    --eval-interval 1000
    --save $CHECKPOINT_PATH
    --load $CHECKPOINT_PATH
    --eval-iters 10
    --tensorboard-dir $TENSORBOARD_LOGS_PATH
)

torchrun ${DISTRIBUTED_ARGS[@]} pretrain_gpt.py \\
    ${GPT_MODEL_ARGS[@]} \\
    ${TRAINING_ARGS[@]} \\
    ${MODEL_PARALLEL_ARGS[@]} \\
    ${DATA_ARGS[@]} \\
    ${EVAL_AND_LOGGING_ARGS[@]}
"""),
    # Megatron-LM's older examples/pretrain_gpt_distributed_with_mp.sh: flags in strings
    "gpt_strings_srun": Job(b"""#!/bin/bash
#SBATCH -N 2
#SBATCH --gres=gpu:8
#SBATCH --ntasks-per-node=1
#SBATCH --exclusive

# Runs the "345M" parameter model

export CUDA_DEVICE_MAX_CONNECTIONS=1

GPUS_PER_NODE=8
MASTER_PORT=6000
NNODES=2
CHECKPOINT_PATH=/lustre/ckpt/gpt-345m
VOCAB_FILE=/lustre/data/gpt2-vocab.json
MERGE_FILE=/lustre/data/gpt2-merges.txt
DATA_PATH=/lustre/data/my-gpt2_text_document

DISTRIBUTED_ARGS="
    --nproc_per_node $GPUS_PER_NODE \\
    --nnodes $NNODES \\
    --rdzv_backend c10d \\
    --master_port $MASTER_PORT
"

GPT_ARGS="
    --tensor-model-parallel-size 2 \\
    --pipeline-model-parallel-size 2 \\
    --sequence-parallel \\
    --num-layers 24 \\
    --hidden-size 1024 \\
    --num-attention-heads 16 \\
    --seq-length 1024 \\
    --max-position-embeddings 1024 \\
    --micro-batch-size 4 \\
    --global-batch-size 64 \\
    --lr 0.00015 \\
    --train-iters 500000 \\
    --lr-decay-iters 320000 \\
    --lr-decay-style cosine \\
    --min-lr 1.0e-5 \\
    --weight-decay 1e-2 \\
    --lr-warmup-fraction .01 \\
    --clip-grad 1.0 \\
    --fp16
"

DATA_ARGS="
    --data-path $DATA_PATH \\
    --vocab-file $VOCAB_FILE \\
    --merge-file $MERGE_FILE \\
    --split 949,50,1
"

OUTPUT_ARGS="
    --log-interval 100 \\
    --save-interval 10000 \\
    --eval-interval 1000 \\
    --eval-iters 10
"

srun torchrun $DISTRIBUTED_ARGS pretrain_gpt.py \\
    $GPT_ARGS \\
    $DATA_ARGS \\
    $OUTPUT_ARGS \\
    --distributed-backend nccl \\
    --save $CHECKPOINT_PATH \\
    --load $CHECKPOINT_PATH
"""),
    # a Llama-2 style model: SwiGLU, GQA, RoPE, samples-based schedule with batch ramp-up
    "llama_gqa_rampup": Job(b"""#!/bin/bash
#SBATCH --job-name=llama-1b
#SBATCH --nodes=2
#SBATCH --gpus-per-node=8
#SBATCH --ntasks-per-node=1
#SBATCH --cpus-per-task=32
#SBATCH --output=logs/%x-%j.out

set -euo pipefail
export CUDA_DEVICE_MAX_CONNECTIONS=1
export NCCL_IB_SL=1

CKPT=/checkpoints/llama-1b
TOKENIZER=/models/llama2/tokenizer.model

LLAMA_ARGS=(
    --use-mcore-models
    --num-layers 16
    --hidden-size 2048
    --ffn-hidden-size 5632
    --num-attention-heads 16
    --group-query-attention
    --num-query-groups 4
    --seq-length 2048
    --max-position-embeddings 4096
    --swiglu
    --normalization RMSNorm
    --position-embedding-type rope
    --untie-embeddings-and-output-weights
    --disable-bias-linear
)

TRAIN_ARGS=(
    --micro-batch-size 1
    --global-batch-size 128
    --rampup-batch-size 32 32 1000000
    --train-samples 10000000
    --lr 3e-4 --min-lr 3e-5 --lr-decay-style cosine
    --bf16
    --use-distributed-optimizer
    --tensor-model-parallel-size 2
    --pipeline-model-parallel-size 2
)

srun --kill-on-bad-exit=1 torchrun \\
    --nnodes "$SLURM_NNODES" --nproc_per_node 8 \\
    --rdzv_id "$SLURM_JOB_ID" --rdzv_backend c10d --rdzv_endpoint "$(hostname):29500" \\
    pretrain_gpt.py \\
    "${LLAMA_ARGS[@]}" \\
    "${TRAIN_ARGS[@]}" \\
    --tokenizer-type Llama2Tokenizer --tokenizer-model "$TOKENIZER" \\
    --data-path /data/redpajama_text_document \\
    --save "$CKPT" --load "$CKPT" --save-interval 1000
"""),
    # interleaved pipeline (layers per virtual stage), all GPUs from --gpus
    "interleaved_vpp": Job(b"""#!/bin/bash
#SBATCH --gpus=8
#SBATCH --time=2:00:00
#SBATCH --partition=gpu

MODEL="--num-layers 16 --hidden-size 1024 --num-attention-heads 16 --seq-length 2048"
PARALLEL="--pipeline-model-parallel-size 4 --num-layers-per-virtual-pipeline-stage 2 --overlap-grad-reduce"

torchrun --standalone --nproc_per_node=8 pretrain_gpt.py $MODEL $PARALLEL \\
  --micro-batch-size 2 --global-batch-size 32 --train-iters 20000 \\
  --bf16 --lr 1e-4 --mock-data --tokenizer-type NullTokenizer --vocab-size 32000
"""),
    # virtual stages per rank, python -m torch.distributed.run, --flag=value forms, -G
    "vstages_flag_equals": Job(b"""#!/bin/bash
#SBATCH -G 4
#SBATCH --mem=0

cd /workspace/Megatron-LM
python -m torch.distributed.run --nproc_per_node=4 --master_port=29501 pretrain_gpt.py \\
    --num-layers=8 --hidden-size=512 --num-attention-heads=8 --seq-length=512 \\
    --max-position-embeddings=512 --pipeline-model-parallel-size=2 \\
    --num-virtual-stages-per-pipeline-rank=2 --micro-batch-size=1 --global-batch-size=16 \\
    --train-iters=1000 --fp16 --mock-data
"""),
    # python straight under srun, one task per GPU
    "srun_python_per_task": Job(b"""#!/bin/bash
#SBATCH --nodes=2
#SBATCH --ntasks-per-node=8
#SBATCH --gpus-per-task=1
#SBATCH --cpus-per-task=8

source /opt/venv/bin/activate
export MASTER_ADDR=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)
export MASTER_PORT=6000

srun --cpu-bind=none python pretrain_gpt.py \\
    --num-layers 24 --hidden-size 2048 --num-attention-heads 32 --seq-length 2048 \\
    --tensor-model-parallel-size 4 --pipeline-model-parallel-size 2 --sequence-parallel \\
    --micro-batch-size 1 --global-batch-size 256 --train-iters 100000 \\
    --recompute-activations --use-distributed-optimizer --bf16 \\
    --data-path /data/pile_text_document --split 99,1,0
"""),
    # a typed GRES, the training command behind cd && ... and piped through tee
    "gres_typed_tee": Job(b"""#!/bin/bash
#SBATCH --gres=gpu:a100:4
#SBATCH -o train-%j.log

LOG=train-$SLURM_JOB_ID.txt
""" b"cd $HOME/Megatron-LM && torchrun --nproc_per_node 4 pretrain_gpt.py --num-layers 12 --hidden-size 768"
        b" --num-attention-heads 12 --seq-length 1024 --tensor-model-parallel-size 2 --micro-batch-size 4"
        b' --global-batch-size 32 --train-iters 5000 --bf16 2>&1 | tee $LOG; echo "exit $?"\n'),
    # no GPU line in the script: the GPUs come from sbatch's input variables
    "env_gpus_per_task": Job(b"""#!/bin/bash
#SBATCH --ntasks=6
#SBATCH -N 4
#SBATCH --time=30

torchrun --nproc_per_node 2 pretrain_gpt.py --num-layers 12 --hidden-size 512 --num-attention-heads 8 \\
    --seq-length 256 --tensor-model-parallel-size 2 --pipeline-model-parallel-size 3 \\
    --global-batch-size 8 --train-iters 100 --mock-data
""", {"SBATCH_GPUS_PER_TASK": "1", "PIPESWIFT_GPUS_PER_NODE": "2"}),
    "env_gpus": Job(b"""#!/bin/bash
#SBATCH --job-name=from-env

srun python pretrain_gpt.py --num-layers 4 --hidden-size 256 --num-attention-heads 4 --seq-length 128 \\
    --micro-batch-size 2 --global-batch-size 16 --train-iters 200
""", {"SBATCH_GPUS": "4"}),
    "env_gres_and_per_node": Job(b"""#!/bin/bash
#SBATCH --nodes=2

torchrun pretrain_gpt.py --num-layers 8 --hidden-size 512 --num-attention-heads 8 --seq-length 512 \\
    --tensor-model-parallel-size 4 --global-batch-size 32 --train-iters 300
""", {"SBATCH_GRES": "gpu:4", "SBATCH_GPUS_PER_NODE": "8"}),
    # export, ${X} and values built from other variables
    "exported_vars": Job(b"""#!/bin/bash
#SBATCH --nodes=1 --gpus-per-node=4

export NUM_LAYERS=8
export HIDDEN=1024
export HEADS=16
SEQ=2048
export MODEL_ARGS="--num-layers ${NUM_LAYERS} --hidden-size $HIDDEN --num-attention-heads ${HEADS}"
declare -a BATCH=(--micro-batch-size 2 --global-batch-size 64)

srun torchrun --nproc_per_node 4 pretrain_gpt.py ${MODEL_ARGS} --seq-length $SEQ "${BATCH[@]}" \\
    --train-iters 10000 --tensor-model-parallel-size 4 --bf16
"""),
    # the model size from the submit environment (sbatch --export=ALL by default)
    "submit_environment": Job(b"""#!/bin/bash
#SBATCH --gpus=8
#SBATCH --nodes=1

torchrun --nproc_per_node 8 pretrain_gpt.py --num-layers $NL --hidden-size ${HS} \\
    --num-attention-heads $NH --seq-length 1024 --micro-batch-size ${MBS} --global-batch-size 64 \\
    --train-iters $ITERS --tensor-model-parallel-size 2 --save $SCRATCH/ckpt --load $SCRATCH/ckpt \\
    --save-interval 500
""", {"NL": "12", "HS": "768", "NH": "12", "MBS": "4", "ITERS": "3000", "SCRATCH": "/scratch/me"}),
    # already routed through the launcher: only the Comment changes
    "already_routed": Job(b"""#!/bin/bash
#SBATCH --gpus=4
srun pipeswift-launch -- torchrun --nproc_per_node 4 pretrain_gpt.py --num-layers 4 --hidden-size 256 \\
    --num-attention-heads 4 --seq-length 256 --global-batch-size 16 --train-iters 100
"""),
    # a Comment in the header (quoted); #PSWIFT lines
    "comment_and_pswift": Job(b"""#!/bin/bash
#SBATCH --comment="nightly sweep"
#SBATCH --gpus=4
#SBATCH --qos=normal
#PSWIFT gpus=2-8
#PSWIFT min-micro-batch=1 class=tiny

torchrun --nproc_per_node 4 pretrain_gpt.py --num-layers 4 --hidden-size 256 --num-attention-heads 4 \\
    --seq-length 256 --micro-batch-size 2 --global-batch-size 16 --train-iters 100
"""),
    # a heredoc (its body never runs as a command) and comments before the command
    "heredoc_config": Job(b"""#!/bin/bash
#SBATCH -N 1
#SBATCH --gpus-per-node=2
## debug run: --num-layers 2 would do

cat > run.cfg <<EOF
layers=4
python pretrain_gpt.py --num-layers 99
EOF

# the real run
python -m torch.distributed.run --nproc_per_node 2 pretrain_gpt.py --num-layers 4 --hidden-size 128 \\
    --num-attention-heads 4 --seq-length 128 --global-batch-size 8 --train-iters 50  # short
echo finished
"""),
    # single quotes across lines, no continuations
    "single_quotes_across_lines": Job(b"""#!/bin/bash
#SBATCH --gpus=2
ARGS='--num-layers 6 --hidden-size 384
      --num-attention-heads 6 --seq-length 512
      --micro-batch-size 2 --global-batch-size 8 --train-iters 400'
exec torchrun --nproc_per_node 2 pretrain_gpt.py $ARGS --pipeline-model-parallel-size 2
"""),
    # uneven first/last pipeline stages; context parallelism
    "uneven_pipeline": Job(b"""#!/bin/bash
#SBATCH --nodes=1
#SBATCH --gpus=8
torchrun --nproc_per_node 8 pretrain_gpt.py --num-layers 14 --hidden-size 1024 --num-attention-heads 16 \\
    --seq-length 1024 --pipeline-model-parallel-size 4 --decoder-first-pipeline-num-layers 3 \\
    --decoder-last-pipeline-num-layers 3 --global-batch-size 32 --micro-batch-size 2 --train-iters 1000
"""),
    "context_parallel": Job(b"""#!/bin/bash
#SBATCH --nodes=1
#SBATCH --ntasks-per-node=8
#SBATCH --gpus-per-task=1
srun --ntasks-per-node=1 torchrun --nproc_per_node 8 pretrain_gpt.py --num-layers 8 --hidden-size 2048 \\
    --num-attention-heads 16 --seq-length 8192 --context-parallel-size 2 --tensor-model-parallel-size 2 \\
    --global-batch-size 16 --micro-batch-size 1 --train-iters 500 --bf16 --recompute-granularity full \\
    --recompute-method uniform
"""),
    # a large job over four nodes, short options bundled in one #SBATCH line
    "four_nodes": Job(b"""#!/bin/bash
#SBATCH -N4 --gpus=32 -t 24:00:00
#SBATCH --exclusive
export OMP_NUM_THREADS=8
srun torchrun --nnodes 4 --nproc_per_node 8 /opt/megatron/pretrain_gpt.py \\
    --num-layers 32 --hidden-size 4096 --num-attention-heads 32 --seq-length 4096 \\
    --tensor-model-parallel-size 4 --pipeline-model-parallel-size 4 \\
    --micro-batch-size 1 --global-batch-size 256 --train-iters 250000 \\
    --use-distributed-optimizer --recompute-activations --bf16 \\
    --save /ckpt/7b --load /ckpt/7b --save-interval 2000
"""),
    # a 13B-class model, tensor parallel over all 8 GPUs of one node
    "tp8_one_node": Job(b"""#!/bin/bash
#SBATCH --gpus=8
#SBATCH --cpus-per-gpu=12
TP=8
srun torchrun --nproc_per_node 8 pretrain_gpt.py --num-layers 40 --hidden-size 5120 \\
    --num-attention-heads 40 --seq-length 4096 --tensor-model-parallel-size $TP --sequence-parallel \\
    --micro-batch-size 1 --global-batch-size 32 --train-iters 20000 --bf16 --use-distributed-optimizer
"""),
    # BERT, one GPU, plain python
    "bert_one_gpu": Job(b"""#!/bin/bash
#SBATCH --gpus=1
python pretrain_bert.py --num-layers 2 --hidden-size 128 --num-attention-heads 2 --seq-length 128 \\
    --max-position-embeddings 512 --micro-batch-size 4 --global-batch-size 4 --train-iters 20
"""),
    # separate commands on one line: ; && ||
    "segments": Job(b"""#!/bin/bash
#SBATCH --gpus-per-node=4
""" b"module load cuda/12.4 || true; cd /work && srun torchrun --nproc_per_node 4 pretrain_gpt.py"
        b" --num-layers 4 --hidden-size 256 --num-attention-heads 8 --seq-length 256"
        b" --tensor-model-parallel-size 2 --global-batch-size 8 --train-iters 100 ; echo done\n"),
}


def _submission(bins: Bins, mode: str, name: str, text: bytes, options: Sequence[str] = (),
                tail: Sequence[str] = (), double_dash: bool = False,
                inline: bool = False) -> tuple[list[str], bytes]:
    """psbatch's argv and stdin for ``text`` submitted as the script file ``name`` (with
    ``tail`` as the script's arguments), on stdin, or as the --wrap text."""
    if mode == "file":
        (bins.work / name).write_bytes(text)
        return [*options, *(["--"] if double_dash else []), name, *tail], b""
    if mode == "stdin":
        return list(options), text
    wrap = ["--wrap=" + text.decode()] if inline else ["--wrap", text.decode()]
    return [*options, *wrap], b""


def _rewritten(mode: str, call: dict) -> bytes:
    """The script text sbatch got."""
    if mode == "file":
        [script] = call["scripts"]
        return script
    if mode == "stdin":
        return call["stdin"]
    [wrap] = [a for a in call["argv"] if a.startswith(b"--wrap=")]
    return wrap[len(b"--wrap="):]


def _assert_routed(original: bytes, rewritten: bytes) -> None:
    """The training command now runs through pipeswift-launch: inserted once, right before
    its launcher, the rest of the script as written (a routed command: all as written)."""
    if LAUNCH in original:
        assert rewritten == original
        return
    old, new = original.split(b"\n"), rewritten.split(b"\n")
    assert len(new) == len(old)
    [k] = [k for k in range(len(old)) if old[k] != new[k]]
    before, _, after = new[k].partition(LAUNCH)
    assert before + after == old[k]
    assert os.path.basename(after.split()[0]) in (b"srun", b"torchrun", b"python", b"python3")


@pytest.fixture()
def quiet(tmp_path) -> Path:
    """A private helper folder (the user's, mode 0700) where no helper runs."""
    folder = tmp_path / "quiet"
    folder.mkdir()
    folder.chmod(0o700)
    return folder


_MODES = ("file", "stdin", "wrap")
# (psbatch options, the script's arguments, "--" before the script): the last two for files only
_EXTRAS: list[tuple[list[str], tuple[str, ...], bool]] = [
    ([], (), False),
    (["--parsable"], ("--data", "/scratch/data"), False),
    (["-p", "gpu", "--pipeswift-gpus=8-32"], (), False),
    (["--comment=team a", "--pipeswift-pp=1,2,4"], (), True),
    (["--pipeswift-min-micro-batch=1", "-J", "meg", "--parsable"], ("--num-layers", "3"), False),
    (["--pipeswift-class=gpt_1.3b-small/v2", "--pipeswift=on", "--comment", "sweep 3"], (), False),
    (["--time=01:00:00", "--pipeswift-gpus=4"], ("a b",), True),
]


def test_the_corpus_is_opted_in_by_the_python_psbatch():
    """The corpus is what it says: jobs the Python psbatch opts in and routes."""
    for case, job in sorted(CORPUS.items()):
        plan = psbatch.plan_job(["job.sh"], [], job.text.decode(), job.env)
        assert plan is not None and plan.argv[0].startswith("--comment="), case
        assert "pswift1;args=" in plan.argv[0] and plan.text is not None, case


@needs_cc
@pytest.mark.parametrize("mode", _MODES)
@pytest.mark.parametrize("case", sorted(CORPUS))
def test_megatron_jobs_are_decided_in_c_as_python_would(bins, quiet, case, mode):
    """A common Megatron job, as a script file (the helper's folder private, no helper
    running), on stdin or with --wrap: the front end decides it without Python (one that
    cannot start Python submits it without a warning), and sbatch gets exactly what the
    Python psbatch gives it: the Comment with the profile token in front, and the
    training command routed through pipeswift-launch."""
    job = CORPUS[case]
    k = sorted(CORPUS).index(case) + _MODES.index(mode)
    options, tail, double_dash = _EXTRAS[k % len(_EXTRAS)]
    args, stdin = _submission(bins, mode, case + ".sh", job.text, options, tail, double_dash, k % 2 == 1)
    env = _helper_env(quiet, **FAST_ON, **job.env)
    python = _run(bins, PYTHON_PSBATCH, args, stdin, env=env)
    assert python.rc == 0 and python.stderr == b"", python.stderr  # the Python psbatch opts it in
    got = _run(bins, [bins.no_python], args, stdin, env=env)
    assert CANNOT_RUN_PYTHON not in got.stderr, got.stderr  # decided in C
    assert got == python
    [call] = got.calls
    assert call["argv"][0].startswith(b"--comment=") and b"pswift1;args=" in call["argv"][0]
    rewritten = _rewritten(mode, call)
    _assert_routed(job.text, rewritten)
    if mode == "file":  # written where the helper's answers go (the helper removes them)
        [folder] = [p for p in quiet.iterdir() if p.name.startswith("psbatch-")]
        assert (folder / (case + ".sh")).read_bytes() == rewritten
        shutil.rmtree(folder)


class Odd(NamedTuple):
    """A job outside what C decides: its script, psbatch options and environment; and
    whether C must leave it to the helper or Python (False: C may decide it too)."""

    text: bytes
    options: tuple[str, ...] = ()
    env: dict[str, Optional[str]] = {}
    must_defer: bool = True


_SIMPLE = (b"#!/bin/bash\n#SBATCH --gpus=4\n"
           b"torchrun --nproc_per_node 4 pretrain_gpt.py --num-layers 8 --hidden-size 256 \\\n"
           b"    --num-attention-heads 4 --seq-length 256 --pipeline-model-parallel-size 2 \\\n"
           b"    --global-batch-size 16 --train-iters 100\n")
_HEADER = b"#SBATCH --gpus=4\n"
_NBSP, _ARABIC_3, _ARABIC_4, _ARABIC_8 = "\u00a0", "\u0663", "\u0664", "\u0668"

DEFERRED = {
    "layers_not_divisible_by_pp": Odd(_SIMPLE.replace(b"--num-layers 8", b"--num-layers 30").replace(
        b"--pipeline-model-parallel-size 2", b"--pipeline-model-parallel-size 4")),
    "no_train_iters": Odd(_SIMPLE.replace(b" --train-iters 100", b"")),
    "pswift_off_line": Odd(_SIMPLE.replace(_HEADER, _HEADER + b"#PSWIFT off\n"), must_defer=False),
    "pipeswift_off_option": Odd(_SIMPLE, ("--pipeswift=off",), must_defer=False),
    "hetjob_header": Odd(_SIMPLE.replace(_HEADER, _HEADER + b"#SBATCH hetjob\n#SBATCH --gpus=2\n")),
    "hetjob_argv": Odd(_SIMPLE, ("-n1", ":", "-n2")),
    # Python's str.split() splits at U+00A0: the variable holds four words for it, and opts in
    "nbsp_between_flags": Odd(("#!/bin/bash\n#SBATCH --gpus=4\nSHAPE=\"--num-layers 8%s--hidden-size 256\"\n"
                               "torchrun pretrain_gpt.py $SHAPE --num-attention-heads 4 --seq-length 256"
                               " --pipeline-model-parallel-size 2 --global-batch-size 16 --train-iters 100\n"
                               % _NBSP).encode()),
    "nbsp_in_a_comment": Odd(_SIMPLE.replace(_HEADER, _HEADER + ("# 4%sGPUs\n" % _NBSP).encode()),
                             must_defer=False),
    "crlf_line_ends": Odd(_SIMPLE.replace(b" \\\n   ", b"").replace(b"\n", b"\r\n")),
    "bad_own_value": Odd(_SIMPLE, ("--pipeswift-gpus=x",)),
    "own_value_non_ascii_digits": Odd(_SIMPLE, ("--pipeswift-gpus=%s-%s" % (_ARABIC_4, _ARABIC_8),)),
    # Python reads U+0663 as 3 GPUs, not divisible by pp 2 (a warning); without them the job is valid
    "env_gpus_non_ascii_digit": Odd(_SIMPLE.replace(_HEADER, b"#SBATCH --time=10\n"),
                                    env={"SBATCH_GPUS": _ARABIC_3}),
    "header_gpus_non_ascii_digit": Odd(_SIMPLE.replace(b"--gpus=4", ("--gpus=%s" % _ARABIC_3).encode())),
    "unclosed_quote_after": Odd(_SIMPLE + b'echo "finished\n', must_defer=False),
    "unclosed_quote_before": Odd(_SIMPLE.replace(_HEADER, _HEADER + b"echo 'starting\n"), must_defer=False),
    # int() takes underscores: 1000 iterations for the Python psbatch
    "underscore_in_a_number": Odd(_SIMPLE.replace(b"--train-iters 100", b"--train-iters 1_000"),
                                  must_defer=False),
    "pswift_quoted_value": Odd(_SIMPLE.replace(_HEADER, _HEADER + b'#PSWIFT gpus="2-8"\n'), must_defer=False),
    "pswift_trailing_comment": Odd(_SIMPLE.replace(_HEADER, _HEADER + b"#PSWIFT gpus=2-8 # one node\n")),
}


@needs_cc
@pytest.mark.parametrize("case, mode", [(case, mode) for k, case in enumerate(sorted(DEFERRED))
                                        for mode in ("file", ("stdin", "wrap")[k % 2])])
def test_jobs_outside_the_c_subset_end_as_python_ends_them(bins, helper, quiet, case, mode):
    """Invalid Megatron arguments, heterogeneous jobs, non-ASCII or odd text, bad own
    option values: the front end leaves them to the helper or to the Python psbatch (one
    that cannot start Python says so), and the job ends exactly as the Python psbatch
    ends it."""
    odd = DEFERRED[case]
    args, stdin = _submission(bins, mode, "odd.sh", odd.text, odd.options, inline=True)
    env = dict(odd.env, **FAST_ON)
    python = _run(bins, PYTHON_PSBATCH, args, stdin, env=env)
    assert _run(bins, [bins.fast], args, stdin, env=env) == python  # helper off: the Python psbatch
    assert _run(bins, [bins.fast], args, stdin, env=_helper_env(helper, **env)) == python  # the helper
    got = _run(bins, [bins.no_python], args, stdin, env=_helper_env(quiet, **env))
    assert got.rc == 0
    if odd.must_defer:
        assert got.stderr.startswith(CANNOT_RUN_PYTHON), (got.stderr, python.stderr)
    else:
        assert got == python or got.stderr.startswith(CANNOT_RUN_PYTHON)


def _megatron(flags: str, header: str = "#SBATCH --gpus=4") -> bytes:
    """A job script running ``pretrain_gpt.py`` with these flags."""
    return ("#!/bin/bash\n%s\ntorchrun pretrain_gpt.py %s\n" % (header, flags)).encode()


_SHAPE = "--num-layers 8 --hidden-size 256 --num-attention-heads 4 --seq-length 256"
_RUN = "--global-batch-size 16 --train-iters 100"
# One job per rule a job is held to (megatron.profile_from_argv and check_config, and
# require_length): the Python psbatch warns and submits it unchanged.
INVALID = {
    "heads_not_divisible_by_tp": _megatron("--num-layers 8 --hidden-size 384 --num-attention-heads 6"
                                           " --seq-length 256 --tensor-model-parallel-size 4 " + _RUN),
    "groups_not_divisible_by_tp": _megatron(_SHAPE + " --group-query-attention --num-query-groups 1"
                                            " --tensor-model-parallel-size 2 " + _RUN),
    "heads_not_divisible_by_groups": _megatron(_SHAPE + " --group-query-attention --num-query-groups 3 "
                                               + _RUN),
    "hidden_not_divisible_by_heads": _megatron(_SHAPE.replace("--hidden-size 256", "--hidden-size 250")
                                               + " " + _RUN),
    "tp_beyond_a_node": _megatron(_SHAPE + " --tensor-model-parallel-size 4 " + _RUN,
                                  "#SBATCH --nodes=2 --gpus-per-node=2"),
    "world_not_divisible": _megatron(_SHAPE + " --pipeline-model-parallel-size 3 " + _RUN),
    "seq_not_divisible_by_2cp": _megatron(_SHAPE.replace("--seq-length 256", "--seq-length 254")
                                          + " --context-parallel-size 2 " + _RUN),
    "layers_not_divisible_by_pp": _megatron(_SHAPE + " --pipeline-model-parallel-size 3 " + _RUN,
                                            "#SBATCH --gpus=3"),
    "uneven_split": _megatron(_SHAPE.replace("--num-layers 8", "--num-layers 12")
                              + " --pipeline-model-parallel-size 4 --decoder-first-pipeline-num-layers 5"
                              " --decoder-last-pipeline-num-layers 4 " + _RUN),
    "uneven_split_pp1": _megatron(_SHAPE + " --decoder-first-pipeline-num-layers 4 " + _RUN),
    "interleaving_needs_pp2": _megatron(_SHAPE + " --num-virtual-stages-per-pipeline-rank 2 " + _RUN),
    "stage_layers_not_divisible_by_vp": _megatron(_SHAPE + " --pipeline-model-parallel-size 2"
                                                  " --num-virtual-stages-per-pipeline-rank 3 " + _RUN),
    "layers_per_virtual_stage": _megatron(_SHAPE + " --pipeline-model-parallel-size 2"
                                          " --num-layers-per-virtual-pipeline-stage 3 " + _RUN),
    "both_virtual_flags": _megatron(_SHAPE + " --pipeline-model-parallel-size 2"
                                    " --num-layers-per-virtual-pipeline-stage 2"
                                    " --num-virtual-stages-per-pipeline-rank 2 " + _RUN),
    "micro_batches_not_multiple_of_pp": _megatron(_SHAPE + " --pipeline-model-parallel-size 2"
                                                  " --num-virtual-stages-per-pipeline-rank 2"
                                                  " --global-batch-size 6 --train-iters 100"),
    "global_batch_not_divisible": _megatron(_SHAPE + " --micro-batch-size 4 --global-batch-size 24"
                                            " --train-iters 100"),
    "rampup_step": _megatron(_SHAPE + " --rampup-batch-size 4 8 100 " + _RUN),  # 4 and 12: fine per step
    "rampup_intermediate": _megatron(_SHAPE + " --rampup-batch-size 2 2 100 " + _RUN),
    "rampup_start_above_global": _megatron(_SHAPE + " --rampup-batch-size 32 4 100 " + _RUN),
    "max_positions_below_seq": _megatron(_SHAPE + " --max-position-embeddings 128 " + _RUN),
    "bf16_and_fp16": _megatron(_SHAPE + " --bf16 --fp16 " + _RUN),
    "iters_and_samples": _megatron(_SHAPE + " --train-samples 1000 " + _RUN),
    "no_length": _megatron(_SHAPE + " --global-batch-size 16"),
    "no_seq_length": _megatron(_SHAPE.replace(" --seq-length 256", "") + " " + _RUN),
    "recompute_granularity": _megatron(_SHAPE + " --recompute-granularity part " + _RUN),
    "zero_micro_batch": _megatron(_SHAPE + " --micro-batch-size 0 " + _RUN),
    "obsolete_model_parallel": _megatron(_SHAPE + " --model-parallel-size 2 " + _RUN),
    "switch_with_value": _megatron(_SHAPE + " --bf16=true " + _RUN),
    "rampup_inline": _megatron(_SHAPE + " --rampup-batch-size=4 " + _RUN),
    "value_missing": _megatron(_SHAPE + " " + _RUN + " --save"),
    "value_is_a_flag": _megatron(_SHAPE + " --load --bf16 " + _RUN),
    "not_an_integer": _megatron(_SHAPE.replace("--num-layers 8", "--num-layers 8.0") + " " + _RUN),
    "negative_integer": _megatron(_SHAPE + " --train-iters -100 --global-batch-size 16"),
}


@needs_cc
@pytest.mark.parametrize("case", sorted(INVALID))
def test_c_leaves_every_invalid_job_to_python(bins, quiet, case):
    """A job broken against any one rule Megatron (or PipeSwift) holds it to is never
    decided in C: the Python psbatch warns and submits it unchanged, and a front end
    that cannot start Python says so and submits it unchanged too."""
    mode = _MODES[sorted(INVALID).index(case) % len(_MODES)]
    args, stdin = _submission(bins, mode, "invalid.sh", INVALID[case], inline=True)
    python = _run(bins, PYTHON_PSBATCH, args, stdin, env=FAST_ON)
    assert python.stderr.startswith(INVALID_WARNING)
    got = _run(bins, [bins.no_python], args, stdin, env=_helper_env(quiet, **FAST_ON))
    assert got.stderr.startswith(CANNOT_RUN_PYTHON) and got.calls == python.calls


# Each way a job asks for GPUs, for a valid world (8 GPUs for tp 2 x pp 2; GPUs per node
# from the cluster: 4, tp 2 fits) or not (6 GPUs; 1 GPU per node): #SBATCH lines,
# psbatch options and the submit environment. (The global batch, 48, leaves only the world
# to decide: 6, 8, 12 and 16 GPUs all divide it.)
_WORLDS = {
    "gpus": lambda ok: ("#SBATCH --gpus=%d" % (8 if ok else 6), (), {}),
    "short_g": lambda ok: ("#SBATCH -G %d" % (8 if ok else 6), (), {}),
    "gpus_per_node": lambda ok: ("#SBATCH -N 2\n#SBATCH --gpus-per-node=%d" % (4 if ok else 3), (), {}),
    "gres": lambda ok: ("#SBATCH --gres=gpu:%d" % (8 if ok else 6), (), {}),
    "gres_typed": lambda ok: ("#SBATCH --nodes=2 --gres=gpu:a100:%d" % (4 if ok else 3), (), {}),
    "gpus_per_task": lambda ok: ("#SBATCH --ntasks=%d\n#SBATCH --gpus-per-task=1" % (8 if ok else 6), (), {}),
    "tasks_per_node": lambda ok: ("#SBATCH -N2 --ntasks-per-node=%d --gpus-per-task=1" % (4 if ok else 3),
                                  (), {}),
    "per_task_alone": lambda ok: ("#SBATCH --gpus-per-task=%d" % (8 if ok else 6), (), {}),
    "two_per_task": lambda ok: ("#SBATCH --gpus-per-task=2 --ntasks=%d" % (4 if ok else 3), (), {}),
    "env_gpus": lambda ok: ("#SBATCH --time=10", (), {"SBATCH_GPUS": "8" if ok else "6"}),
    "env_gpus_per_node": lambda ok: ("#SBATCH --nodes=1", (), {"SBATCH_GPUS_PER_NODE": "8" if ok else "6"}),
    "env_gres": lambda ok: ("#SBATCH --nodes=2", (), {"SBATCH_GRES": "gpu:4" if ok else "gpu:3"}),
    "env_gpus_per_task": lambda ok: ("#SBATCH --ntasks=%d" % (8 if ok else 6), (),
                                     {"SBATCH_GPUS_PER_TASK": "1"}),
    "env_over_header": lambda ok: ("#SBATCH --gpus=4", (), {"SBATCH_GPUS": "8" if ok else "6"}),
    "option_over_header_and_env": lambda ok: ("#SBATCH --gpus=4", ("--gpus=%d" % (8 if ok else 6),),
                                              {"SBATCH_GPUS": "4"}),
    "option_gres": lambda ok: ("#SBATCH --gres=gpu:2", ("-N", "2", "--gres", "gpu:%d" % (4 if ok else 3)),
                               {}),
    "gpus_per_node_of_the_cluster": lambda ok: ("#SBATCH -N 3 --gpus=8", (),
                                                {"PIPESWIFT_GPUS_PER_NODE": "4" if ok else "1"}),
}
_NO_GPU_ENV = dict.fromkeys(["SBATCH_GPUS", "SBATCH_GPUS_PER_NODE", "SBATCH_GPUS_PER_TASK", "SBATCH_GRES",
                             "PIPESWIFT_GPUS_PER_NODE"])


@needs_cc
@pytest.mark.parametrize("form", sorted(_WORLDS))
def test_the_gpus_a_job_asks_for_are_read_as_python_reads_them(bins, quiet, form):
    """Whichever way a job asks for its GPUs: on as many as make tp 2 x pp 2 valid, the
    front end decides it without Python, exactly as the Python psbatch does; on as many
    as do not, the Python psbatch warns, and the front end leaves it to Python."""
    job = _megatron("--num-layers 8 --hidden-size 256 --num-attention-heads 4 --seq-length 256"
                    " --tensor-model-parallel-size 2 --pipeline-model-parallel-size 2 --global-batch-size 48"
                    " --train-iters 100", "%s")
    mode = _MODES[sorted(_WORLDS).index(form) % len(_MODES)]
    for valid in (True, False):
        header, options, env = _WORLDS[form](valid)
        args, stdin = _submission(bins, mode, "world.sh", job.replace(b"%s", header.encode()), options,
                                  inline=True)
        env = {**_NO_GPU_ENV, **env, **FAST_ON}
        python = _run(bins, PYTHON_PSBATCH, args, stdin, env=env)
        got = _run(bins, [bins.no_python], args, stdin, env=_helper_env(quiet, **env))
        if valid:
            assert python.stderr == b"" and python.calls[0]["argv"][0].startswith(b"--comment=pswift1;")
            assert CANNOT_RUN_PYTHON not in got.stderr and got == python
        else:
            assert python.stderr.startswith(INVALID_WARNING)
            assert got.stderr.startswith(CANNOT_RUN_PYTHON)


@needs_cc
@pytest.mark.parametrize("value", ["off", "0", "no", "false"])
def test_fast_off_leaves_megatron_jobs_to_the_helper_or_python(bins, quiet, value):
    """PIPESWIFT_PSBATCH_FAST=off (or 0, no, false): the front end decides no Megatron
    job itself: one that cannot start Python warns and submits the job unchanged."""
    job = CORPUS["bert_one_gpu"]
    for mode in _MODES:
        args, stdin = _submission(bins, mode, "bert.sh", job.text)
        on = _run(bins, [bins.no_python], args, stdin, env=_helper_env(quiet, **FAST_ON))
        assert on.stderr == b"" and on.calls[0]["argv"][0].startswith(b"--comment=pswift1;args="), mode
        off = _run(bins, [bins.no_python], args, stdin, env=_helper_env(quiet, PIPESWIFT_PSBATCH_FAST=value))
        assert off.stderr.startswith(CANNOT_RUN_PYTHON) and off.calls == _sent(args, stdin), mode


@needs_cc
def test_check_is_still_the_python_report(bins, quiet):
    """--pipeswift=check on a job C would decide: the Python psbatch's report, nothing
    submitted; without Python, the front end says it needs it (and submits nothing)."""
    job = CORPUS["bert_one_gpu"]
    for mode in ("file", "stdin"):
        args, stdin = _submission(bins, mode, "bert.sh", job.text, ["--pipeswift=check"])
        python = _run(bins, PYTHON_PSBATCH, args, stdin, env=FAST_ON)
        assert python.rc == 0 and python.calls == [] and b"would be opted in" in python.stdout, mode
        assert _run(bins, [bins.fast], args, stdin, env=FAST_ON) == python, mode
        got = _run(bins, [bins.no_python], args, stdin, env=_helper_env(quiet, **FAST_ON))
        assert got.rc == 2 and got.calls == [], mode
        assert got.stderr.startswith(b"psbatch: error: --pipeswift=check needs the Python psbatch"), mode


# Megatron-ish scripts from building blocks: #SBATCH lines, a #PSWIFT line, the flags
# split between a variable, the command line and continuation lines; small sizes, so
# that some are valid and some are not.


class Gen(NamedTuple):
    headers: tuple[str, ...]
    pswift: str
    style: str                 # how MEG_ARGS holds its flags (_STYLES)
    use: str                   # how the command uses it
    use_last: bool
    flags: tuple[str, ...]     # "--flag value" or "--flag=value"
    where: tuple[int, ...]     # per flag: 0 in MEG_ARGS, 1 on the command line, 2 on a continuation line
    launch: str
    before: tuple[str, ...]
    after: tuple[str, ...]
    tail: str


_STYLES = {
    "dq": lambda name, words: '%s="%s"' % (name, " ".join(words)),
    "dq_lines": lambda name, words: '%s="\n    %s\n"' % (name, " \\\n    ".join(words)),
    "sq_lines": lambda name, words: "%s='%s'" % (name, "\n    ".join(words)),
    "array": lambda name, words: "%s=(\n    %s\n)" % (name, "\n    ".join(words)),
    "array_inline": lambda name, words: "%s=( %s )" % (name, " ".join(words)),
    "export": lambda name, words: 'export %s="%s"' % (name, " ".join(words)),
}
_USES = ("$MEG_ARGS", "${MEG_ARGS}", "${MEG_ARGS[@]}", '"${MEG_ARGS[@]}"')
_GPU_HEADERS = ("#SBATCH --gpus=8", "#SBATCH -G 4", "#SBATCH --nodes=2\n#SBATCH --gpus-per-node=4",
                "#SBATCH -N 1 --gres=gpu:8", "#SBATCH --gres=gpu:a100:2",
                "#SBATCH --ntasks=4\n#SBATCH --gpus-per-task=1",
                "#SBATCH -N2 --ntasks-per-node=4 --gpus-per-task=1", "#SBATCH --gpus=2", "#SBATCH --time=10",
                "#SBATCH --nodes=2 --gpus=16", "#SBATCH --comment='a b'", '#SBATCH --comment="sweep 1"',
                "#SBATCH -p gpu -J meg", "#SBATCH --gpus-per-node=2 # per node")
_PSWIFT_LINES = ("", "", "#PSWIFT gpus=2-16", "#PSWIFT min-micro-batch=2", "#PSWIFT pp=1,2",
                 "#PSWIFT class=small", "#PSWIFT on", "#PSWIFT off", "#PSWIFT gpus=x",
                 "#PSWIFT gpus=1-8 pp=1,2,4")
_LAUNCHES = ("torchrun --nproc_per_node 8 pretrain_gpt.py",
             "srun torchrun --nnodes 1 --nproc_per_node=4 pretrain_gpt.py",
             "python -m torch.distributed.run --nproc_per_node 2 pretrain_gpt.py",
             "srun python pretrain_gpt.py",
             "python /opt/Megatron-LM/pretrain_gpt.py", "pipeswift-launch -- torchrun pretrain_gpt.py",
             "exec srun --mpi=pmix python3 pretrain_gpt.py", "cd /work && torchrun pretrain_gpt.py",
             "torchrun $DIST pretrain_gpt.py", "srun pipeswift-launch -- python pretrain_gpt.py")
_BEFORE = ("echo start", "cd $HOME", "module load cuda/12.4", "export CUDA_DEVICE_MAX_CONNECTIONS=1",
           "# train it", 'DIST="--nproc_per_node 4 --nnodes 1"', "set -x", "MASTER_ADDR=$(hostname)",
           "source activate.sh && echo ready", "CKPT=/ckpt/run1")
_AFTER = ("echo done", "wait", "# the end", "exit 0")
_TAILS = ("", "", "  # train", " 2>&1 | tee train.log", "; echo done", " && echo ok", " &")
_EXTRA_FLAGS = ("--bf16", "--swiglu", "--sequence-parallel", "--use-distributed-optimizer", "--save $CKPT",
                "--load $CKPT", "--save-interval 10", "--lr 1e-4", "--data-path /data/x_text_document",
                "--rampup-batch-size 4 4 100", "--recompute-activations", "--fp16", "--no-such-flag 3")
_SIZES = (("--tensor-model-parallel-size", [1, 2, 4]), ("--pipeline-model-parallel-size", [1, 2, 4]),
          ("--micro-batch-size", [1, 2]), ("--global-batch-size", [4, 8, 16, 32, 6]),
          ("--train-iters", [10, 100, 1000, 50, 20, "x"]))


def _compose(g: Gen) -> bytes:
    held, inline, continued = ([f for f, w in zip(g.flags, g.where) if w == k] for k in range(3))
    lines = ["#!/bin/bash", *g.headers, *([g.pswift] if g.pswift else []), *g.before]
    words = [g.launch] + inline
    if held:
        lines.append(_STYLES[g.style]("MEG_ARGS", held))
        words.insert(len(words) if g.use_last else 1, g.use)
    command = " ".join(words)
    for k in range(0, len(continued), 2):
        command += " \\\n    " + " ".join(continued[k:k + 2])
    lines += [command + g.tail, *g.after]
    return ("\n".join(lines) + "\n").encode()


def _flag(draw, name: str, values: Sequence[object]) -> str:
    return "%s%s%s" % (name, draw(st.sampled_from([" ", " ", "="])), draw(st.sampled_from(values)))


@st.composite
def _gens(draw) -> Gen:
    heads = draw(st.sampled_from([2, 4, 8]))
    hidden = heads * draw(st.sampled_from([32, 64])) if draw(st.integers(0, 9)) else 100
    flags = [_flag(draw, "--num-layers", [2, 4, 6, 8, 12]), _flag(draw, "--hidden-size", [hidden]),
             _flag(draw, "--num-attention-heads", [heads]), _flag(draw, "--seq-length", [64, 128, 256])]
    flags += [_flag(draw, name, values) for name, values in _SIZES if draw(st.integers(0, 4))]
    flags += draw(st.lists(st.sampled_from(_EXTRA_FLAGS), max_size=4, unique=True))
    flags = draw(st.permutations(flags))
    where = draw(st.lists(st.sampled_from([0, 1, 2]), min_size=len(flags), max_size=len(flags)))
    return Gen(headers=tuple(draw(st.lists(st.sampled_from(_GPU_HEADERS), max_size=3))),
               pswift=draw(st.sampled_from(_PSWIFT_LINES)), style=draw(st.sampled_from(sorted(_STYLES))),
               use=draw(st.sampled_from(_USES)), use_last=draw(st.booleans()), flags=tuple(flags),
               where=tuple(where), launch=draw(st.sampled_from(_LAUNCHES)),
               before=tuple(draw(st.lists(st.sampled_from(_BEFORE), max_size=3))),
               after=tuple(draw(st.lists(st.sampled_from(_AFTER), max_size=2))),
               tail=draw(st.sampled_from(_TAILS)))


_OWN = st.lists(st.sampled_from([
    ("--pipeswift-gpus=2-16",), ("--pipeswift-pp=1,2",), ("--pipeswift-min-micro-batch=1",),
    ("--pipeswift-class=x",), ("--pipeswift-class=a.b c/d_e-f",), ("--pipeswift=off",), ("--pipeswift=on",),
    ("-p", "gpu"), ("--comment=x",),
    ("--parsable",), ("--pipeswift-gpus", "4"), ("--gpus=4",), ("-N", "1"), ("--gres=gpu:2",),
]), max_size=3).map(lambda options: [word for option in options for word in option])
_GEN_ENV = st.fixed_dictionaries({
    "SBATCH_GPUS": st.sampled_from([None, None, "4", "8"]),
    "SBATCH_GPUS_PER_NODE": st.sampled_from([None, None, "2"]),
    "SBATCH_GRES": st.sampled_from([None, None, "gpu:2"]),
    "SBATCH_GPUS_PER_TASK": st.sampled_from([None, None, "1"]),
    "PIPESWIFT_GPUS_PER_NODE": st.sampled_from([None, "4"]),
    "CKPT": st.sampled_from([None, "/ckpt/x"]),
})


@needs_cc
@settings(max_examples=EXAMPLES, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(gen=_gens(), options=_OWN, env=_GEN_ENV, mode=st.sampled_from(_MODES), inline=st.booleans(),
       rc=st.sampled_from([0, 0, 0, 1]))
def test_c_decides_generated_megatron_jobs_as_python_would(bins, helper, quiet, gen, options, env, mode,
                                                           inline, rc):
    """Over generated Megatron-ish jobs, argv and submit environments: the front end
    (deciding in C, else through the helper) hands sbatch exactly what the Python psbatch
    does; and whenever one that cannot start Python submits without a warning, that too
    is exactly the Python psbatch's outcome."""
    text = _compose(gen)
    note(text.decode())
    args, stdin = _submission(bins, mode, "gen.sh", text, options, inline=inline)
    env = dict(env, **FAST_ON)
    python = _run(bins, PYTHON_PSBATCH, args, stdin, rc, env=env)
    assert _run(bins, [bins.fast], args, stdin, rc, env=_helper_env(helper, **env)) == python
    got = _run(bins, [bins.no_python], args, stdin, rc, env=_helper_env(quiet, **env))
    if CANNOT_RUN_PYTHON in got.stderr:
        event("left to the helper or Python")
    else:
        event("decided in C")
        assert got == python


# generated-like jobs that C decides (the property above checks C only where it decides)
_DECIDED_GENS = {
    "array_srun": Gen(
        headers=("#SBATCH --nodes=2\n#SBATCH --gpus-per-node=4",), pswift="", style="array",
        use='"${MEG_ARGS[@]}"', use_last=False,
        flags=("--num-layers 8", "--hidden-size 256", "--num-attention-heads 4", "--seq-length 128",
               "--tensor-model-parallel-size 2", "--pipeline-model-parallel-size 2", "--global-batch-size 16",
               "--train-iters 100", "--bf16"), where=(0, 0, 0, 1, 2, 2, 1, 2, 0),
        launch="srun torchrun --nnodes 1 --nproc_per_node=4 pretrain_gpt.py", before=("echo start",),
        after=("echo done",), tail=""),
    "dq_lines_equals": Gen(
        headers=("#SBATCH -G 4",), pswift="#PSWIFT gpus=2-16", style="dq_lines", use="$MEG_ARGS",
        use_last=True,
        flags=("--num-layers=4", "--hidden-size=128", "--num-attention-heads=2", "--seq-length=64",
               "--micro-batch-size=2", "--global-batch-size=8", "--train-iters=10"),
        where=(0, 0, 0, 0, 1, 1, 2),
        launch="python -m torch.distributed.run --nproc_per_node 2 pretrain_gpt.py",
        before=("module load cuda/12.4",), after=(), tail="  # train"),
    "sq_lines_tee": Gen(
        headers=("#SBATCH --gres=gpu:a100:2", "#SBATCH --comment='a b'"), pswift="#PSWIFT class=small",
        style="sq_lines", use="${MEG_ARGS}", use_last=False,
        flags=("--num-layers 6", "--hidden-size 256", "--num-attention-heads 8", "--seq-length 256",
               "--tensor-model-parallel-size 2", "--global-batch-size 4", "--train-iters 10", "--save $CKPT",
               "--load $CKPT", "--save-interval 10"), where=(0, 1, 0, 2, 2, 0, 1, 0, 0, 1),
        launch="exec srun --mpi=pmix python3 pretrain_gpt.py", before=("CKPT=/ckpt/run1",), after=("wait",),
        tail=" 2>&1 | tee train.log"),
    "export_cd": Gen(
        headers=("#SBATCH --time=10",), pswift="", style="export", use="${MEG_ARGS[@]}", use_last=True,
        flags=("--num-layers 4", "--hidden-size 128", "--num-attention-heads 4", "--seq-length 128",
               "--pipeline-model-parallel-size 4", "--global-batch-size 32", "--train-iters 100",
               "--rampup-batch-size 4 4 100"), where=(0, 0, 0, 0, 1, 1, 2, 2),
        launch="cd /work && torchrun pretrain_gpt.py", before=("export CUDA_DEVICE_MAX_CONNECTIONS=1",),
        after=("# the end",), tail="; echo done"),
    "routed_inline_array": Gen(
        headers=("#SBATCH --gpus=8", "#SBATCH -p gpu -J meg"), pswift="#PSWIFT pp=1,2", style="array_inline",
        use="${MEG_ARGS[@]}", use_last=False,
        flags=("--num-layers 12", "--hidden-size 512", "--num-attention-heads 8", "--seq-length 256",
               "--tensor-model-parallel-size 4", "--micro-batch-size 1", "--train-iters 10", "--swiglu"),
        where=(1, 1, 0, 0, 2, 2, 0, 1), launch="srun pipeswift-launch -- python pretrain_gpt.py",
        before=("set -x", "cd $HOME"), after=(), tail=""),
}
_DECIDED_ENV = {"export_cd": {"SBATCH_GPUS": "8"}}


@needs_cc
@pytest.mark.parametrize("case", sorted(_DECIDED_GENS))
def test_generated_like_jobs_are_decided_in_c(bins, quiet, case):
    """Jobs from those building blocks, in reach of C: decided without Python whether
    they come as a file, on stdin or with --wrap, exactly as the Python psbatch would."""
    text = _compose(_DECIDED_GENS[case])
    env = dict(_DECIDED_ENV.get(case, {}), **FAST_ON)
    for k, mode in enumerate(_MODES):
        args, stdin = _submission(bins, mode, "gen.sh", text, ["--parsable"], inline=k == 2)
        python = _run(bins, PYTHON_PSBATCH, args, stdin, env=env)
        assert python.stderr == b"" and python.calls[0]["argv"][0].startswith(b"--comment=")  # opted in
        got = _run(bins, [bins.no_python], args, stdin, env=_helper_env(quiet, **env))
        assert CANNOT_RUN_PYTHON not in got.stderr, (mode, got.stderr)
        assert got == python, mode


# What decide.c copies from the Python: any change there needs the same change in C.
_MIRRORED = ("jobscript", "sbatch_args", "psbatch.build_request", "psbatch.plan_job", "psbatch._with_options",
             "psbatch.decide", "megatron.parse_argv", "megatron._split", "megatron._to_int", "megatron._width",
             "megatron._flag_value", "megatron._positive", "megatron.shape_from_args", "megatron.plan_from_args",
             "megatron._vp_from_args", "megatron.profile_from_argv", "megatron.require_length",
             "megatron.node_shape", "megatron.stage_layers", "megatron.check_config", "megatron._split_problems",
             "megatron._batch_problems", "token.encode_profile", "model.TrainingPlan")


def test_decide_c_was_reviewed_against_the_python_it_copies():
    """A change to the Python rules decide.c copies fails here until decide.c has been
    brought in line and its recorded fingerprint updated (the property tests above only
    catch a difference that their random jobs happen to reach)."""
    import hashlib
    import importlib
    import inspect
    import re

    sources = []
    for name in _MIRRORED:
        module, _, attr = name.partition(".")
        found = importlib.import_module("pipeswift_slurm." + module)
        sources.append(inspect.getsource(getattr(found, attr) if attr else found))
    digest = hashlib.sha256("\n".join(sources).encode()).hexdigest()[:16]
    c_text = (fast_build.SOURCE.with_name("decide.c")).read_text()
    recorded = re.search(r"copies the Python at fingerprint ([0-9a-f]{16})", c_text)
    assert recorded is not None and recorded.group(1) == digest, (
        "the Python rules decide.c copies have changed: bring decide.c in line, then record fingerprint %s"
        % digest)


# ---------------------------------------------------------------- pipeswift build-psbatch


def _cli(args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pipeswift_slurm.cli", "build-psbatch", *args], cwd=cwd,
                          env=_env(), capture_output=True, text=True, timeout=300, check=False)


@needs_cc
def test_build_command_writes_an_executable(tmp_path):
    done = _cli(["--out", str(tmp_path)], tmp_path)
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "psbatch").is_file() and os.access(tmp_path / "psbatch", os.X_OK)
    assert done.stdout.startswith("wrote %s (built with " % (tmp_path / "psbatch"))
    musl = shutil.which("musl-gcc") is not None and not os.environ.get("CC")
    assert ("built with musl-gcc -static" in done.stdout) == musl
    fake = tmp_path / "sbatch"
    fake.write_text("#!/bin/sh\nexit 7\n")
    fake.chmod(0o755)
    env = dict(os.environ, PIPESWIFT_SBATCH=str(fake))
    assert subprocess.run([str(tmp_path / "psbatch"), "--wrap", "true"], env=env, check=False).returncode == 7


@pytest.mark.parametrize("args, message, code", [
    (["--cc", "/nonexistent/cc"], "C compiler '/nonexistent/cc' not found", 2),
    (["--out", "nodir/psbatch"], "cannot write nodir/psbatch: no such folder", 2),
    (["--out", "afile/psbatch"], "cannot write afile/psbatch: no such folder", 2),
    (["--out", "nodir/"], "cannot write nodir/: no such folder", 2),
    (["--python", "/nonexistent/python3"], "cannot run the Python /nonexistent/python3", 2),
    (["--cc", "cc -x no-such-language"], "failed (exit 1)", 1),
])
def test_build_command_bad_input_is_one_line(tmp_path, args, message, code):
    if code == 1 and shutil.which("cc") is None or "Python" in message and _compiler() is None:
        pytest.skip("no C compiler")
    (tmp_path / "afile").write_text("")
    done = _cli(args, tmp_path)
    assert done.returncode == code
    assert done.stderr.startswith("pipeswift: error: ") and message in done.stderr, done.stderr
    assert done.stderr.count("\n") == 1 and "Traceback" not in done.stderr


@needs_cc
def test_build_command_unwritable_folder(tmp_path):
    if os.geteuid() == 0:  # root may write anywhere but sysfs (denied, or read-only in containers)
        target = "/sys/psbatch"
    else:
        (tmp_path / "ro").mkdir(mode=0o555)
        target = "ro/psbatch"
    done = _cli(["--out", target], tmp_path)
    assert done.returncode == 2 and "cannot write %s: " % target in done.stderr
    assert done.stderr.count("\n") == 1 and "Traceback" not in done.stderr
