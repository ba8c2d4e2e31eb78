"""psbatch is a drop-in for sbatch: for ordinary invocations both make the same job (as
Slurm sees it), print the same thing (modulo job ids) and return the same exit code; a
Megatron job reaches Slurm enriched; and random argument lists and scripts never make
psbatch crash (fake sbatch for most examples, the real one for a handful).

The real-Slurm tests run through every front end: the Python psbatch, the compiled one
(pipeswift_slurm/submit/fast, built once per session; skipped only without a C compiler),
and the psbatch a ``pip install`` put beside the interpreter (or at $PSBATCH_INSTALLED)."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Optional

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pipeswift_slurm.submit import jobscript, psbatch
from pipeswift_slurm.submit import sbatch_args

PSBATCH = [sys.executable, "-m", "pipeswift_slurm.submit.psbatch"]
FRONT_ENDS = ("python", "compiled", "installed")
VOLATILE = {"JobId", "ArrayJobId", "HetJobId", "SubmitTime", "EligibleTime", "AccrueTime", "StartTime",
            "EndTime", "LastSchedEval", "AllocNode:Sid", "Command", "StdErr", "StdOut", "StdIn", "Priority",
            "Dependency", "RunTime", "Reason", "JobState", "NodeList", "BatchHost", "SecsPreSuspend"}


def _slurm_answers() -> bool:
    if not shutil.which("squeue"):
        return False
    try:
        return subprocess.run(["squeue", "-h"], capture_output=True, timeout=10, check=False).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


needs_slurm = pytest.mark.skipif(not _slurm_answers(), reason="no Slurm controller answers squeue "
                                 "(start one with tests/slurm/testbed.sh up and source its env.sh)")


def _fields(job_id: str) -> dict[str, str]:
    line = subprocess.run(["scontrol", "-o", "show", "job", job_id], capture_output=True, text=True, check=False).stdout
    pairs = re.findall(r"(?:^| )([A-Za-z][A-Za-z0-9:/_]*)=(\S*)", line)
    return {k: v for k, v in pairs if k not in VOLATILE}


def _build(folder: Path) -> str:
    from pipeswift_slurm.submit.fast.build import BuildError, attempts, build

    if not attempts():  # no C compiler here (tests/run-all.sh installs gcc)
        pytest.skip("no C compiler")
    try:
        return str(build(folder / "psbatch")[0])
    except BuildError as exc:
        pytest.skip(str(exc))


@pytest.fixture(scope="session")
def compiled_psbatch(tmp_path_factory) -> list[str]:
    """The compiled front end, built once per session for this Python: Megatron jobs go
    through the Python psbatch."""
    return [_build(tmp_path_factory.mktemp("psbatch-front"))]


@pytest.fixture(params=FRONT_ENDS)
def front_end(request) -> list[str]:
    """psbatch's command line: the Python one, the compiled front end, or the psbatch a
    ``pip install`` put at $PSBATCH_INSTALLED (default: beside this interpreter, as the
    README's install puts it)."""
    if request.param == "installed":
        installed = os.environ.get("PSBATCH_INSTALLED") or str(Path(sys.executable).parent / "psbatch")
        if not os.access(installed, os.X_OK):
            pytest.skip("no installed psbatch at %s (set PSBATCH_INSTALLED)" % installed)
        return [installed]
    return PSBATCH if request.param == "python" else request.getfixturevalue("compiled_psbatch")


@pytest.fixture
def submitted():
    ids: list[str] = []
    yield ids
    if ids:
        subprocess.run(["scancel", *ids], capture_output=True, check=False)


def _norm(text: str) -> str:
    return re.sub(r"\d+", "N", text)


def _submit(tool: list[str], args: list[str], cwd: Path, stdin: bytes = b"",
            env: Optional[dict[str, str]] = None) -> subprocess.CompletedProcess:
    return subprocess.run(tool + args, input=stdin, capture_output=True, cwd=cwd, timeout=60, check=False,
                          env=None if env is None else dict(os.environ, **env))


def _job_ids(out: bytes) -> list[str]:
    return re.findall(r"(?:^|job )(\d+)", out.decode())


SCRIPT = b"#!/bin/bash\n#SBATCH --time=5\n#SBATCH -J scripted\n#SBATCH --gpus-per-node=2\nsleep 60\n"
CASES = {
    "options": (["-H", "-N", "2", "--gpus-per-node=1", "--time=3", "-J", "opts", "job.sh"], b""),
    "sbatch_lines": (["-H", "job.sh"], b""),
    "wrap": (["-H", "--wrap", "sleep 60", "--mem=100"], b""),
    "stdin": (["-H", "--comment=hi there"], SCRIPT),
    "array": (["-H", "--array=0-2", "job.sh"], b""),
    "parsable": (["-H", "--parsable", "--gpus=3", "job.sh"], b""),
    "test_only": (["--test-only", "job.sh"], b""),
    "bad_partition": (["-p", "nosuchpartition", "job.sh"], b""),
    "bad_gpus": (["--gpus=abc", "job.sh"], b""),
    "bad_option": (["--no-such-option", "job.sh"], b""),
    "script_args": (["-H", "job.sh", "--num-layers", "2"], b""),
}


@needs_slurm
@pytest.mark.slurm
@pytest.mark.parametrize("case", sorted(CASES))
def test_same_job_output_and_exit_code(case, front_end, tmp_path, submitted):
    args, stdin = CASES[case]
    (tmp_path / "job.sh").write_bytes(SCRIPT)
    want = _submit(["sbatch"], args, tmp_path, stdin)
    got = _submit(front_end, args, tmp_path, stdin)
    submitted.extend(_job_ids(want.stdout) + _job_ids(got.stdout))
    assert got.returncode == want.returncode
    assert _norm(got.stdout.decode()) == _norm(want.stdout.decode())
    assert _norm(got.stderr.decode()) == _norm(want.stderr.decode())
    if "--test-only" not in args and want.returncode == 0:
        assert _fields(_job_ids(got.stdout)[0]) == _fields(_job_ids(want.stdout)[0])


@needs_slurm
@pytest.mark.slurm
def test_dependency_same_job(front_end, tmp_path, submitted):
    base = subprocess.run(["sbatch", "--parsable", "-H", "--wrap", "true"], capture_output=True, text=True, check=False)
    submitted.append(base.stdout.strip())
    args = ["--parsable", "--dependency=afterok:%s" % base.stdout.strip(), "--wrap", "sleep 1"]
    want, got = _submit(["sbatch"], args, tmp_path), _submit(front_end, args, tmp_path)
    submitted.extend([want.stdout.decode().strip(), got.stdout.decode().strip()])
    assert got.returncode == want.returncode == 0
    assert _fields(got.stdout.decode().strip()) == _fields(want.stdout.decode().strip())


def _submit_enriched(front_end, args, tmp_path, submitted, stdin=None, env=None):
    """Submit a Megatron job that psbatch must enrich; returns (job id, the batch script
    Slurm stored, the job's comment)."""
    got = _submit(front_end, args, tmp_path, stdin, env)
    assert got.returncode == 0 and got.stderr == b"", got.stderr
    job_id = got.stdout.decode().strip()
    submitted.append(job_id)
    batch = subprocess.run(["scontrol", "write", "batch_script", job_id, "-"], capture_output=True, text=True,
                           check=False).stdout
    comment = subprocess.run(["squeue", "-h", "-j", job_id, "-o", "%k"], capture_output=True, text=True,
                             check=False).stdout
    return job_id, batch, comment


@needs_slurm
@pytest.mark.slurm
def test_megatron_job_reaches_slurm_enriched(front_end, tmp_path, submitted):
    text = ("#!/bin/bash\n#SBATCH --gpus=4\n#SBATCH --comment=mine\n"
            "torchrun --nproc-per-node 4 pretrain_gpt.py --num-layers 8 --hidden-size 256"
            " --num-attention-heads 8 --seq-length 256 --global-batch-size 16 --train-iters 10\n")
    (tmp_path / "train.sh").write_text(text)
    for _ in range(2):  # submitted again: the same job
        job_id, batch, comment = _submit_enriched(front_end, ["-H", "--parsable", "--pipeswift-gpus=2-8", "train.sh"],
                                                  tmp_path, submitted)
        fields = _fields(job_id)
        assert fields["JobName"] == "train.sh" and fields["WorkDir"] == str(tmp_path)
        assert batch == text.replace("torchrun", "pipeswift-launch -- torchrun", 1)
        assert comment.startswith("pswift1;args=") and comment.rstrip().endswith(" mine") and "gpus=2-8" in comment


# Every way sbatch takes a GPU count, each for 4 GPUs: psbatch sizes the profile by it
# before the job exists, the controller reads Slurm's tres_per_* fields; one rule
# (core.gres), so the controller never refuses an honest job's profile for its size.
GPU_SPELLINGS = {
    "gpus": ["--gpus=4"],
    "gpus_typeless_per_node": ["-N", "2", "--gpus-per-node=2"],
    "gres": ["--gres=gpu:4"],
    "gres_two_nodes": ["-N", "2", "--gres=gpu:2"],
    "gpus_per_task": ["--ntasks=4", "--gpus-per-task=1"],
    "gpus_per_task_per_node": ["-N", "2", "--ntasks-per-node=2", "--gpus-per-task=1"],
    "gpus_and_per_node": ["-N", "2", "--gpus=4", "--gpus-per-node=2"],
}


@needs_slurm
@pytest.mark.slurm
@pytest.mark.parametrize("spelling", sorted(GPU_SPELLINGS))
def test_psbatch_and_the_controller_count_a_jobs_gpus_alike(spelling, tmp_path, submitted):
    from pipeswift_slurm.core.request import submitted_profile
    from pipeswift_slurm.core.token import decode_profile
    from pipeswift_slurm.slurm.backends.slurm_cli import SlurmCliBackend

    text = ("#!/bin/bash\n"
            "torchrun pretrain_gpt.py --num-layers 8 --hidden-size 256 --num-attention-heads 8"
            " --seq-length 256 --global-batch-size 16 --train-iters 10\n")
    (tmp_path / "train.sh").write_text(text)
    job_id, _, comment = _submit_enriched(PSBATCH, ["-H", "--parsable"] + GPU_SPELLINGS[spelling] + ["train.sh"],
                                          tmp_path, submitted)
    request = decode_profile(comment.strip())
    # the controller's own read of the job (squeue --json through its backend: other tests'
    # jobs carry names that are not UTF-8)
    job = SlurmCliBackend().snapshot().job(int(job_id))
    assert job is not None
    assert request.world_size == job.gpus == 4
    profile = submitted_profile(request, job.gpus, gpus_per_node=8, cluster_gpus=None)  # not refused
    assert profile.requested.gpus == 4


@needs_slurm
@pytest.mark.slurm
def test_megatron_stdin_job_reaches_slurm_enriched(front_end, tmp_path, submitted):
    text = ("#!/bin/bash\n#SBATCH --gpus=2\n"
            "torchrun pretrain_gpt.py --num-layers 4 --hidden-size 64 --num-attention-heads 4"
            " --seq-length 64 --global-batch-size 8 --train-iters 10\n")
    # sbatch has no SBATCH_COMMENT input variable: the Comment holds psbatch's token alone
    _, batch, comment = _submit_enriched(front_end, ["-H", "--parsable", "-J", "fromstdin"], tmp_path, submitted,
                                         text.encode(), env={"SBATCH_COMMENT": "not-read"})
    assert batch == text.replace("torchrun", "pipeswift-launch -- torchrun", 1)
    assert comment.startswith("pswift1;args=") and "not-read" not in comment


@needs_slurm
@pytest.mark.slurm
def test_every_option_sbatch_lists_is_in_psbatchs_table():
    """psbatch finds the script (and so its Megatron job) after any option sbatch has: a
    new Slurm's new option would make it stop at that word (24.11 added --oom-kill-step)."""
    out = subprocess.run(["sbatch", "--help"], capture_output=True, text=True, check=False).stdout
    listed = set(re.findall(r"--([a-z][a-z0-9-]*)", out))
    assert len(listed) > 50, out
    assert listed <= sbatch_args.LONG_ALL, sorted(listed - sbatch_args.LONG_ALL)


DIRECTIVES = json.loads((Path(__file__).resolve().parents[1] / "data" / "psbatch" / "directives.json").read_text())


@needs_slurm
@pytest.mark.slurm
def test_directives_are_read_as_the_real_sbatch_reads_them(tmp_path, submitted):
    """psbatch's reading of #SBATCH lines (quotes, backslashes, # and empty words the way
    sbatch's own splitter takes them) gives the comment and job name Slurm stores."""
    for k, case in enumerate(DIRECTIVES):
        script = tmp_path / ("d%d.sh" % k)
        script.write_text("#!/bin/bash\n#SBATCH" + case["line"] + "\nsrun hostname\n")
        done = _submit(["sbatch"], ["-H", "--parsable", script.name], tmp_path)
        if case.get("versions_differ"):  # psbatch does not guess: it keeps such a job as written
            assert jobscript.read_header(script.read_text().split("\n")).version_dependent, case
            if done.returncode == 0:  # 24.11: the blank stays in the word
                submitted.append(done.stdout.decode().strip())
                stored = subprocess.run(["squeue", "-h", "-j", submitted[-1], "-o", "%k"],
                                        capture_output=True, text=True, check=False).stdout.rstrip("\n")
                assert stored == case["words_2411"][0].partition("=")[2], case
            else:  # 22.05: it ends the word, and the next word is no option
                assert case["words"] != case["words_2411"] and b"invalid" in done.stderr.lower(), done.stderr
            continue
        assert (done.returncode == 0) == case["sbatch_accepts"], (case, done.stderr)
        if done.returncode:
            continue
        job_id = done.stdout.decode().strip()
        submitted.append(job_id)
        header = jobscript.read_header(script.read_text().split("\n")).header[0]
        ours = sbatch_args.effective_options([], header, {})
        fields = _fields(job_id)
        stored_comment = subprocess.run(["squeue", "-h", "-j", job_id, "-o", "%k"], capture_output=True,
                                        text=True, check=False).stdout.rstrip("\n")
        assert (ours["comment"] if "comment" in ours else "(null)") == stored_comment, case
        assert fields["JobName"] == (ours.get("job-name") or script.name), case


# ---------------------------------------------------------------- fuzz

_OPTION_WORDS = ["-H", "-N", "2", "-n", "3", "--gpus=2", "--gpus-per-node", "4", "--gres=gpu:1", "-J", "x",
                 "--wrap", "--comment", "a b", "--parsable", "--test-only", "-p", "gpu", ":", "--", "-vQ",
                 "--pipeswift-gpus=2-8", "--pipeswift-pp", "1,2", "--pipeswift=off", "--pipeswift-bogus=1",
                 "--array=0-1", "--time=1", "--exclusive", "--nice=5", "job.sh", "--", "=", "-", "--mem"]
_SCRIPT_LINES = ["#!/bin/bash", "#SBATCH --gpus=2", "#SBATCH hetjob", "#PSWIFT gpus=2-4", "#PSWIFT off",
                 "A='--num-layers 4'", "torchrun pretrain_gpt.py $A --hidden-size 64 --num-attention-heads 4",
                 " --seq-length 64 \\", "echo 'unterminated", "cat <<EOF", "EOF", "X=(", ")", "srun true && ls |",
                 "python pretrain_gpt.py --num-layers x", "\xff", "#SBATCH --comment='q"]
_args = st.lists(st.sampled_from(_OPTION_WORDS) | st.text(max_size=6), max_size=10)
_script = st.lists(st.sampled_from(_SCRIPT_LINES) | st.text(max_size=20), max_size=10).map("\n".join)


def _check_outcome(raw: list[str], sent_argv: list[str]) -> None:
    """Submitted as written (own options removed) or enriched (comment in front)."""
    stripped = sbatch_args.strip_own_options(raw)[0]
    if sent_argv != stripped and sent_argv != raw:
        assert sent_argv[0].startswith("--comment=") and "pswift1;" in sent_argv[0]


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(raw=_args, text=_script)
def test_fuzz_never_crashes_fake_sbatch(raw, text, monkeypatch, tmp_path):
    (tmp_path / "job.sh").write_text(text, errors="surrogateescape")
    monkeypatch.chdir(tmp_path)
    sent = []
    monkeypatch.setattr(psbatch, "_run", lambda sbatch, argv, stdin, script, environ: sent.append(argv) or 0)

    class Stdin:
        buffer = __import__("io").BytesIO(text.encode("utf-8", "surrogateescape"))

        @staticmethod
        def isatty():
            return False
    rc = psbatch.submit(raw, {"PIPESWIFT_SBATCH": sys.executable, "PATH": os.defpath}, Stdin())
    try:
        sbatch_args.strip_own_options(raw)
    except sbatch_args.PsbatchUsageError:  # an unknown --pipeswift-KEY: refused, as sbatch refuses one
        assert rc == 2 and sent == []
        return
    assert rc == 0
    _check_outcome(raw, sent[0])


@needs_slurm
@pytest.mark.slurm
@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(raw=_args, text=_script)
def test_fuzz_real_sbatch_submits_or_refuses_like_sbatch(raw, text, front_end, tmp_path):
    (tmp_path / "job.sh").write_text("#!/bin/bash\n" + text.replace("\x00", ""), errors="surrogateescape")
    args = ["-H"] + [a for a in raw if "\x00" not in a]
    got = _submit(front_end, args, tmp_path)
    ids = _job_ids(got.stdout)
    if ids:
        subprocess.run(["scancel", *ids], capture_output=True, check=False)
    assert b"Traceback" not in got.stderr
    if got.returncode != 0:
        assert b"sbatch: " in got.stderr or got.stderr == b"", got.stderr
