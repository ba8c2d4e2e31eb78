"""psbatch's compiled front end (pipeswift_slurm/fast): its generated tables match the
Python ones; jobs that are not Megatron jobs reach a fake sbatch with the same argv and
the same stdin bytes without starting Python; Megatron jobs and --pipeswift options go
through the Python psbatch; and, over random argv lists, scripts and stdin, the compiled
front end and ``python -m pipeswift_slurm.psbatch`` hand sbatch exactly the same argv,
script and stdin and return the same exit code and output.

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
from typing import NamedTuple, Optional

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pipeswift_slurm import psbatch, sbatch_args
from pipeswift_slurm.fast import build as fast_build

ROOT = Path(__file__).resolve().parents[2]
PYTHON_PSBATCH = (sys.executable, "-m", "pipeswift_slurm.psbatch")

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
    run_env = _env(PIPESWIFT_SBATCH=bins.fake, FAKE_SBATCH_LOG=str(log), FAKE_SBATCH_TMP=str(bins.tmp),
                   FAKE_SBATCH_RC=str(rc), TMPDIR=str(bins.tmp), PIPESWIFT_PSBATCH_HELPER="off")
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
    assert got["flag"][:2] == ["-P", "-c"] and "from pipeswift_slurm.psbatch import main" in got["flag"][2]


def test_print_header_command_and_light_import():
    env = _env()
    out = subprocess.run([sys.executable, "-m", "pipeswift_slurm.fast.build", "--print-header"],
                         capture_output=True, text=True, env=env, check=True).stdout
    assert out == fast_build.header_text()
    code = ("import sys; sys.modules['click'] = sys.modules['sqlalchemy'] = None\n"
            "import pipeswift_slurm.fast.build as b; b.header_text()")
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
                   PIPESWIFT_PSBATCH_HELPER="off")
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

HELPER_MODULE = (sys.executable, "-m", "pipeswift_slurm.psbatch_helper")


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
    from pipeswift_slurm import psbatch_helper

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
    from pipeswift_slurm import psbatch_helper as ph

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

    from pipeswift_slurm import psbatch_helper as ph

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
    from pipeswift_slurm import psbatch_helper as ph

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
    from pipeswift_slurm.psbatch_helper import EnvBlock

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

    from pipeswift_slurm import psbatch_helper as ph

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
    from pipeswift_slurm import psbatch_helper as ph

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
    from pipeswift_slurm import psbatch_helper as ph

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
    from pipeswift_slurm import psbatch_helper as ph

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
    from pipeswift_slurm import psbatch_helper as ph

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
    from pipeswift_slurm import psbatch_helper as ph

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

    from pipeswift_slurm import psbatch_helper as ph

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

    from pipeswift_slurm import psbatch_helper as ph

    folder, installed = tmp_path / "h", tmp_path / "installed"
    code = ("import os, sys; import pipeswift_slurm.psbatch_helper as ph; stamp = ph._code_stamp;"
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
