"""psbatch's compiled front end (pipeswift_slurm/submit/fast/psbatch.c): it knows no Megatron
rule, passes jobs that are plainly not Megatron jobs to a fake sbatch with the same argv and
the same stdin bytes without starting Python, and hands every job the Python psbatch would
look at closer to the Python psbatch (false positives allowed, never a miss); over random
argv lists, scripts and stdin, it and ``python -m pipeswift_slurm.submit.psbatch`` hand sbatch
exactly the same argv, script and stdin. When Python cannot start, or cannot import the
package, the job is still submitted as written (own options removed) with one warning, by
the front end and by ``wrappers/psbatch`` alike.

The fake sbatch is a small C program that records argv, the text of temporary scripts
psbatch wrote, and the stdin bytes.
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
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from pipeswift_slurm.submit import plan, psbatch, sbatch_args
from pipeswift_slurm.submit.fast import build as fast_build

ROOT = Path(__file__).resolve().parents[2]
PYTHON_PSBATCH = (sys.executable, "-m", "pipeswift_slurm.submit.psbatch")
WRAPPER = ("sh", str(ROOT / "wrappers" / "psbatch"))

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
    broken: Path    # a folder whose pipeswift_slurm cannot be imported (for PYTHONPATH)
    broken_fast: str  # the front end handing jobs to a Python whose pipeswift_slurm is that one


@pytest.fixture(scope="module")
def bins(tmp_path_factory: pytest.TempPathFactory) -> Bins:
    if _compiler() is None:
        pytest.skip("no C compiler (tests/run-all.sh installs gcc)")
    base = tmp_path_factory.mktemp("psbatch-front")
    fast, _ = fast_build.build(base / "psbatch", extra_flags=("-Wextra", "-Werror"))
    no_python, _ = fast_build.build(base / "psbatch-nopy", python="/nonexistent/python3")
    (base / "fake.c").write_text(FAKE_SBATCH_C)
    subprocess.run([_compiler(), "-O2", "-o", str(base / "sbatch"), str(base / "fake.c")], check=True)
    work, tmp, broken = base / "work", base / "tmp", base / "broken" / "pipeswift_slurm"
    for folder in (work, tmp, broken, work / "adir"):
        folder.mkdir(parents=True)
    (broken / "__init__.py").write_text("raise ImportError('broken on purpose')\n")
    # the front end runs its Python with -E (PYTHONPATH ignored): a venv holding the broken package
    venv = base / "broken-venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    site = subprocess.run([str(venv / "bin" / "python"), "-c", "import sysconfig; print(sysconfig.get_path("
                           "'purelib'))"], capture_output=True, text=True, check=True).stdout.strip()
    shutil.copytree(broken, Path(site) / "pipeswift_slurm")
    broken_fast, _ = fast_build.build(base / "psbatch-broken", python=str(venv / "bin" / "python"))
    (work / "plain.sh").write_bytes(PLAIN)
    (work / "meg.sh").write_bytes(MEGATRON)
    (work / "big.sh").write_bytes(MEGATRON + b"#" * plan.MAX_SCRIPT_BYTES)
    return Bins(str(fast), str(no_python), str(base / "sbatch"), work, tmp, broken.parent, str(broken_fast))


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
                   FAKE_SBATCH_RC=str(rc), TMPDIR=str(bins.tmp))
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
    "option_missing_its_value": (["-J"], b""),
    "pipeswift_after_script": (["plain.sh", "--pipeswift-gpus=2"], b""),
}



# jobs with a marker in an argv word that is not the job's text: the front end is conservative
# (any argv word), so these reach the Python psbatch, which submits them unchanged
ARGV_MARKERS = {"script_file", "wrap_inline_last_wins"}


@needs_cc
@pytest.mark.parametrize("case", sorted(PASS_THROUGH))
def test_not_megatron_passes_through(bins, case):
    args, stdin = PASS_THROUGH[case]
    got = _run(bins, [bins.fast], args, stdin)
    assert (got.rc, got.stderr) == (0, b"") and got.calls == _sent(args, stdin)
    assert _run(bins, PYTHON_PSBATCH, args, stdin) == got
    if case not in ARGV_MARKERS:  # without starting Python: a hand-off would warn
        assert _run(bins, [bins.no_python], args, stdin) == got


@needs_cc
@pytest.mark.parametrize("args, stdin", [(["big.sh"], b""), ([], MEGATRON + b"#" * (1 << 20))],
                         ids=["file", "stdin"])  # (an id of a megabyte would be the test's environment)
def test_a_megatron_script_too_big_to_read_goes_unchanged_with_a_word(bins, args, stdin):
    got = _run(bins, [bins.fast], args, stdin)
    assert got.rc == 0 and got.calls == _sent(args, stdin)
    assert got.stderr == b"psbatch: warning: Megatron job not opted in to PipeSwift: the job script is over" \
                         b" 1048576 bytes, more than psbatch reads; submitted unchanged\n"
    assert _run(bins, PYTHON_PSBATCH, args, stdin) == got
    plain = ([], PLAIN + b"#" * (1 << 20))
    assert _run(bins, [bins.fast], *plain) == _run(bins, [bins.no_python], *plain)  # no hand-off, no word


@needs_cc
@needs_cc
@pytest.mark.parametrize("job", [PLAIN, MEGATRON])
def test_a_script_that_is_a_fifo_is_left_to_sbatch(bins, tmp_path, job):
    """The front end once read a FIFO (or ``<(...)``) script itself, so sbatch then found it
    empty, or waited forever for a writer. A pipe's bytes are now sbatch's alone."""
    import threading

    fifo, got = tmp_path / "job.fifo", tmp_path / "got"
    os.mkfifo(fifo)
    sbatch = tmp_path / "sbatch"
    sbatch.write_text('#!/bin/sh\nfor a; do last="$a"; done\ncat "$last" > "%s"\n' % got)
    sbatch.chmod(0o755)
    writer = threading.Thread(target=lambda: fifo.write_bytes(job), daemon=True)
    writer.start()
    done = subprocess.run([bins.fast, str(fifo)], capture_output=True, env=_env(PIPESWIFT_SBATCH=str(sbatch)),
                          stdin=subprocess.DEVNULL, timeout=20, check=False)
    assert done.returncode == 0 and got.read_bytes() == job, done.stderr


def test_header_is_the_python_tables():
    text = fast_build.header_text("/opt/py/bin/python3")
    for name in sbatch_args.LONG_REQUIRED:
        no_stdin = "|PSB_NO_STDIN" * (name == "wrap")
        assert "{%s, PSB_REQUIRED%s}," % (fast_build.c_string(name), no_stdin) in text
    for name in sbatch_args.LONG_FLAGS | sbatch_args.LONG_OPTIONAL:
        assert "{%s, PSB_REQUIRED" % fast_build.c_string(name) not in text
    for name in sbatch_args.NO_STDIN:
        assert [line for line in text.splitlines() if line.startswith("    {%s, " % fast_build.c_string(name))
                and line.endswith("|PSB_NO_STDIN},")]
    for marker in plan.MARKERS:
        assert fast_build.c_string(marker) in text
    assert '#define PSB_PYTHON "/opt/py/bin/python3"' in text
    assert "#define PSB_MAX_SCRIPT_BYTES ((size_t)%d)" % plan.MAX_SCRIPT_BYTES in text


def test_the_front_end_stays_small_and_knows_no_megatron_rule():
    source = fast_build.SOURCE.read_text()
    # 200 until it learned which own options take a value, 220 until its fallback kept option values
    assert len(source.splitlines()) <= 225
    for word in ("num-layers", "pretrain", "tensor-model", "pswift1", "PSWIFT"):
        assert word not in source  # markers come from the generated header, rules from Python


@needs_cc
@pytest.mark.parametrize("front", ["fast", "python"])
def test_terminal_stdin_is_not_read(bins, front):
    leader, follower = os.openpty()
    try:
        log = bins.tmp / "calls.log"
        if log.exists():
            log.unlink()
        env = _env(PIPESWIFT_SBATCH=bins.fake, FAKE_SBATCH_LOG=str(log), TMPDIR=str(bins.tmp))
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
def test_megatron_script_file_stdin_and_wrap_go_through_python(bins):
    got = _run(bins, [bins.fast], ["-p", "gpu", "meg.sh", "x"])
    assert got.rc == 0 and got.stderr == b"", got.stderr
    [call] = got.calls
    assert call["argv"][0].startswith(b"--comment=pswift1;") and call["argv"][1:] == [
        b"--begin=now+60", b"-p", b"gpu", b"$TMPDIR/psbatch-?/meg.sh", b"x"]
    assert call["scripts"] == [ROUTED]
    assert _run(bins, PYTHON_PSBATCH, ["-p", "gpu", "meg.sh", "x"]) == got
    got = _run(bins, [bins.fast], ["-J", "m"], MEGATRON)
    assert got.rc == 0 and got.stderr == b"" and got.calls[0]["stdin"] == ROUTED
    cmd = MEGATRON.decode().splitlines()[-1]
    got = _run(bins, [bins.fast], ["--gpus=2", "--wrap", cmd], b"unrelated")
    assert got.calls[0]["argv"][1] == b"--wrap=pipeswift-launch -- " + cmd.encode()


@needs_cc
@pytest.mark.parametrize("value", ["off", "0", "no", "false", "OFF", " False ", "No\n"])  # as core/switch.py
def test_fast_off_means_always_python(bins, value):
    got = _run(bins, [bins.no_python], ["plain.sh"], env={"PIPESWIFT_PSBATCH_FAST": value})
    assert got.stderr.startswith(b"psbatch: warning: cannot run the Python psbatch")
    assert got.calls == _sent(["plain.sh"], b"")


@needs_cc
@pytest.mark.parametrize("args, text", [
    (["--pipeswift-gpus=2-8", "plain.sh"], None),          # own option, plain script
    (["--pipeswift-gpus", "2-8", "-J", "x", "plain.sh"], None),
    (["--pipeswift=off", "meg.sh"], None),                 # own option: opt out
    (["pswift.sh"], b"#!/bin/bash\n#PSWIFT gpus=2-4\necho no training here\n"),
    (["bad.sh"], b"#!/bin/bash\npython pretrain_gpt.py --num-layers 3\n"),
])
def test_markers_and_own_options_go_through_python(bins, args, text):
    if text is not None:
        (bins.work / args[-1]).write_bytes(text)
    got = _run(bins, [bins.fast], args)
    assert got == _run(bins, PYTHON_PSBATCH, args)
    without_own = [os.fsencode(a) for a in args if not a.startswith("--pipeswift") and a != "2-8"]
    assert got.rc == 0 and got.calls[0]["argv"] == without_own  # submitted unchanged...
    # ...by the Python psbatch; when no Python runs, or it cannot import the package, the
    # front end (and the shell wrapper) still submit it, with one warning.
    fallback = _run(bins, [bins.no_python], args)
    assert fallback.rc == 0 and fallback.calls == got.calls
    said = fallback.stderr.decode()
    assert said.startswith("psbatch: warning: cannot run the Python psbatch (/nonexistent/")
    assert said.endswith("; submitted unchanged\n") and said.count("\n") == 1
    for front in ([bins.broken_fast], WRAPPER):
        broken = _run(bins, front, args, env={"PYTHONPATH": str(bins.broken)})
        assert broken.rc == 0 and broken.calls == got.calls, front
        assert broken.stderr == b"psbatch: warning: cannot start the Python psbatch (broken on purpose);" \
                                b" submitted unchanged\n"


@needs_cc
@pytest.mark.parametrize("args", [["--pipeswift=check", "meg.sh"], ["--pipeswift-=check", "plain.sh"]])
def test_check_is_the_python_report_and_never_a_submission(bins, args):
    python = _run(bins, PYTHON_PSBATCH, args)
    assert python.calls == [] and python.rc == (1 if "plain.sh" in args else 0) and python.stdout
    assert _run(bins, [bins.fast], args) == python
    for front, env in (([bins.no_python], None), ([bins.broken_fast], None),
                       (WRAPPER, {"PYTHONPATH": str(bins.broken)}),
                       (WRAPPER, {"PIPESWIFT_PYTHON": "/no/py"})):
        got = _run(bins, front, args, env=env)
        assert got.rc == 2 and got.calls == [] and got.stdout == b"", front
        assert got.stderr.decode().startswith("psbatch: error: --pipeswift=check needs the Python psbatch")


def test_the_wrapper_runs_the_same_bootstrap():
    assert "'" not in fast_build.BOOTSTRAP
    assert "-c '%s' \"$@\"" % fast_build.BOOTSTRAP in (ROOT / "wrappers" / "psbatch").read_text()


@needs_cc
@pytest.mark.parametrize("front", ["fast", "wrapper"])
def test_minimal_path_without_the_package_submits_as_written(bins, front, tmp_path):
    """Issue 28 item 11: ``env PATH=/usr/bin:/bin sh wrappers/psbatch --wrap 'sleep 1'``
    with a Python that cannot import pipeswift_slurm: submitted as written, one warning."""
    (tmp_path / "sbatch").symlink_to(bins.fake)
    env = {"PATH": "%s:/usr/bin:/bin" % tmp_path, "PYTHONPATH": str(bins.broken), "PIPESWIFT_SBATCH": ""}
    cmd = [bins.broken_fast] if front == "fast" else list(WRAPPER)
    got = _run(bins, cmd, ["--pipeswift-class=x", "--wrap", "sleep 1"], env=env)
    assert got.rc == 0 and got.calls == _sent(["--wrap", "sleep 1"], b"")
    assert got.stderr.startswith(b"psbatch: warning: cannot start the Python psbatch")


@needs_cc
@pytest.mark.parametrize("variable", ["PYTHONHOME", "PYTHONHASHSEED", "PYTHONIOENCODING"])
def test_the_users_python_settings_do_not_stop_the_site_psbatch(bins, variable):
    """Found by fuzzing: a PYTHONHOME that a conda or module setup exports kept the Python
    psbatch from starting ("Fatal Python error"), and the job was lost; the front end runs
    the site's install with -E, and sbatch and the job still get the user's environment."""
    value = {"PYTHONHOME": "/nonexistent/conda", "PYTHONHASHSEED": "nonsense", "PYTHONIOENCODING": "no-such"}[variable]
    got = _run(bins, [bins.fast], ["meg.sh"], env={variable: value})
    assert got.rc == 0 and got.stderr == b"" and got.calls[0]["scripts"] == [ROUTED]


@needs_cc
@pytest.mark.parametrize("which", ["no_python", "broken_fast"])
def test_without_the_python_psbatch_only_own_options_are_removed(bins, which):
    """Found by fuzzing the fallbacks (no interpreter: the front end's own; no package: the
    bootstrap's, told by the front end which words its scan found): an own option that is
    another option's value, or a word after the script, is passed on; one that took the
    script, the last word, as its value leaves no script: nothing is submitted."""
    front = [getattr(bins, which)]
    for args, sent in ((["-J", "--pipeswift-gpus=4", "meg.sh"], ["-J", "--pipeswift-gpus=4", "meg.sh"]),
                       (["meg.sh", "--pipeswift-gpus=4", "x"], ["meg.sh", "--pipeswift-gpus=4", "x"]),
                       (["--pipeswift-gpus", "2-4", "-J", "a", "meg.sh"], ["-J", "a", "meg.sh"])):
        got = _run(bins, front, args, stdin=PLAIN)
        assert got.rc == 0 and got.calls == _sent(sent, PLAIN), (which, args)
        assert got.stderr.count(b"\n") == 1 and b"submitted unchanged" in got.stderr
    got = _run(bins, front, ["--pipeswift-gpus", "meg.sh"], stdin=PLAIN)
    assert (got.rc, got.calls) == (2, []) and got.stderr == (
        b"psbatch: error: --pipeswift-gpus took the last word, meg.sh, as its value, which leaves no script;"
        b" write --pipeswift-gpus=VALUE before the script\n")


@needs_cc
def test_no_python_and_no_sbatch_is_one_line(bins):
    got = _run(bins, [bins.no_python], ["meg.sh"], env={"PIPESWIFT_SBATCH": "/nonexistent/sbatch"})
    assert (got.rc, got.calls) == (127, [])
    assert got.stderr == b"psbatch: error: sbatch not found (set PIPESWIFT_SBATCH or PATH)\n"


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

@needs_cc
@pytest.mark.parametrize("args", [["plain.sh"], ["meg.sh"], ["--pipeswift-gpus=2", "meg.sh"]])
def test_psbatch_named_as_the_real_sbatch_is_no_sbatch_and_no_loop(bins, args):
    """PIPESWIFT_SBATCH pointing at psbatch itself (the compiled front end, or another name
    of it on PATH) would run psbatch for ever: it counts as no sbatch, one error line."""
    alias = bins.tmp / "alias"
    alias.mkdir(exist_ok=True)
    if not (alias / "sbatch").exists():
        (alias / "sbatch").symlink_to(bins.fast)
    for env in ({"PIPESWIFT_SBATCH": bins.fast}, {"PIPESWIFT_SBATCH": "", "PATH": str(alias)}):
        got = _run(bins, [bins.fast], args, env=env)
        assert (got.rc, got.calls) == (127, []), env
        assert got.stderr == b"psbatch: error: sbatch not found (set PIPESWIFT_SBATCH or PATH)\n"


_WORDS = ["-H", "-J", "x", "-Jname", "-HJ", "-HQ", "-o", "-e", "-N", "2", "-p", "gpu", "--wrap",
          "--wrap=echo hi", "--wrap=pretrain_gpt.py", "--wr", "--comment", "--comment=--num-layers",
          "--parsable", "--help", "-h", "--usage", "-u", "--version", "-V", "--frobnicate", "-Z", "-é",
          ":", "--", "-", "=", "--=x", "--exclusive", "--exclusive=user", "--nice=5", "--mem", "--gpus=2",
          "--gres=gpu:1", "--test-only", "--part", "--p", "--pipeswift-gpus=2-8", "--pipeswift",
          "--pipeswift=off", "--pipeswift-pp", "1,2", "--num-layers", "job.sh", "plain.sh", "meg.sh",
          "missing.sh", "adir", "big.sh", "a b"]
_LINES = ["#!/bin/bash", "#SBATCH --gpus=2", "#SBATCH hetjob", "#PSWIFT gpus=2-4", "#PSWIFT off", "echo hi",
          "A='--num-layers 4'", "torchrun pretrain_gpt.py $A --hidden-size 64 --num-attention-heads 4",
          " --seq-length 64 --global-batch-size 8 --train-iters 10 \\", "python pretrain_gpt.py --num-layers x",
          "\udcff",
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
EXAMPLES = int(os.environ.get("PSBATCH_FRONT_EXAMPLES", "40"))


class _Stdin:
    """sys.stdin as the Python psbatch sees a pipe or /dev/null."""

    def __init__(self, data: bytes):
        self.buffer = io.BytesIO(data)

    def isatty(self) -> bool:
        return False




@needs_cc
@settings(max_examples=3 * EXAMPLES, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(args=_argv, job=_job, stdin=_stdin)
@example(args=["--pipeswift-pp", "job.sh"], job=PLAIN, stdin=None)  # found in CI: refused, as Python does
def test_hands_off_whenever_python_would_look_closer(bins, args, job, stdin, monkeypatch):
    """Against psbatch.py's own functions: whenever the Python psbatch would go past its
    cheap test (own options, or a marker in the text read_source finds), the front end
    starts Python (here: fails to, and says so), or refuses as Python would (an own option
    that took the script, the last word, as its value); sbatch always gets the same stdin
    bytes."""
    (bins.work / "job.sh").write_bytes(job)
    monkeypatch.chdir(bins.work)
    refused = b""
    try:
        stripped, pairs = sbatch_args.strip_own_options(args)
    except sbatch_args.PsbatchUsageError as exc:  # an own option Python refuses (it took the script as its value)
        python_looks, refused = True, b"psbatch: error: %s\n" % str(exc).encode()
    else:
        source = psbatch.read_source(stripped, _Stdin(stdin or b""))
        python_looks = bool(pairs) or (source.text is not None and any(m in source.text for m in plan.MARKERS))
    got = _run(bins, [bins.no_python], args, stdin)
    handed = got.stderr.startswith(b"psbatch: warning: cannot run the Python psbatch")
    said_as_python = bool(refused) and (got.rc, got.calls, got.stderr) == (2, [], refused)
    assert handed or said_as_python or not python_looks
    if not handed and not said_as_python:
        assert got.rc == 0 and got.stderr == b"" and got.calls == _sent(args, stdin)


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


@needs_cc
def test_build_command_writes_an_executable_and_bad_input_is_one_line(tmp_path):
    from click.testing import CliRunner

    from pipeswift_slurm.cli.main import pipeswift as cli

    done = CliRunner().invoke(cli, ["build-psbatch", "--out", str(tmp_path)])
    assert done.exit_code == 0 and os.access(tmp_path / "psbatch", os.X_OK), done.output
    assert (tmp_path / "psbatch").read_bytes()[:4] == b"\x7fELF"
    done = CliRunner().invoke(cli, ["build-psbatch", "--out", str(tmp_path / "no" / "such" / "psbatch")])
    assert done.exit_code == 2 and "no such folder" in done.output and "Traceback" not in done.output
    # an interpreter missing here may be there on the cluster: built, with a warning
    done = CliRunner().invoke(cli, ["build-psbatch", "--out", str(tmp_path), "--python", "/nonexistent/python3"])
    assert done.exit_code == 0 and "warning: --python /nonexistent/python3 is no executable" in done.stderr
    assert "warning" not in CliRunner().invoke(cli, ["build-psbatch", "--out", str(tmp_path), "--python",
                                                     sys.executable]).stderr
