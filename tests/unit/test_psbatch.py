"""psbatch: sbatch argv and #SBATCH parsing, Megatron job recognition, script rewriting
(golden files), own-option stripping, and submission through a fake sbatch that records
its argv and stdin (including the fallback on internal errors)."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeswift_slurm.submit import jobscript, sbatch_args, training
from pipeswift_slurm.submit import psbatch
from pipeswift_slurm.core.megatron import MegatronArgError
from pipeswift_slurm.core.token import decode_profile

DATA = Path(__file__).resolve().parent.parent / "data" / "psbatch"
FAKE = DATA / "fake_sbatch.py"
SCRIPTS = sorted((DATA / "scripts").glob("*.sh"))
ACCEPT = "PSBATCH_ACCEPT"


# ---------------------------------------------------------------- argv


@pytest.mark.parametrize("argv, names, script", [
    (["-N2", "-p", "gpu", "job.sh", "-N", "3"], ["nodes", "partition"], 3),
    (["-HQ", "--time", "10", "job.sh"], ["hold", "quiet", "time"], 3),
    (["--part=gpu", "--gpus-per-n", "4", "x"], ["partition", "gpus-per-node"], 3),
    (["--wrap", "echo hi", "--parsable"], ["wrap", "parsable"], None),
    (["-n", "2", ":", "-n", "1", "job.sh"], ["ntasks", "ntasks"], 5),
    (["--exclusive", "job.sh"], ["exclusive"], 1),
    (["-J", "name", "--", "job.sh"], ["job-name"], 3),
])
def test_scan_argv_finds_options_and_script(argv, names, script):
    scan = psbatch.scan_argv(argv)
    assert [o.name for o in scan.opts] == names
    assert scan.script_index == script


def test_scan_argv_counts_het_components_and_unknown_options():
    scan = psbatch.scan_argv(["-n1", ":", "-n2", "--frobnicate", "job.sh"])
    assert scan.components == 2
    assert scan.unknown == ["--frobnicate"]


@pytest.mark.parametrize("argv, kept, own", [
    (["--pipeswift-gpus=4-16", "-p", "gpu", "job.sh"], ["-p", "gpu", "job.sh"], [("gpus", "4-16")]),
    (["--pipeswift-pp", "1,2", "job.sh"], ["job.sh"], [("pp", "1,2")]),
    (["--pipeswift=off", "--wrap", "true"], ["--wrap", "true"], [("", "off")]),
    (["job.sh", "--pipeswift-gpus=4"], ["job.sh", "--pipeswift-gpus=4"], []),  # a script argument
    (["-p", "gpu", "job.sh"], ["-p", "gpu", "job.sh"], []),
])
def test_strip_own_options(argv, kept, own):
    assert psbatch.strip_own_options(argv) == (kept, own)


def test_own_options_values_and_errors():
    own = sbatch_args.own_options([("gpus", "4-16"), ("min-micro-batch", "2"), ("pp", "1,2,4"), ("class", "x")])
    assert own.gpus == (4, 16) and own.min_micro_batch_size == 2 and own.allowed_pp == (1, 2, 4)
    assert own.job_class == "x" and own.declared and not own.off
    assert sbatch_args.own_options([("", "off")]).off
    assert sbatch_args.own_options([("gpus", "8")]).gpus == (8, 8)
    for bad in ([("gpus", "x")], [("gpus", "9-3")], [("colour", "red")], [("", "maybe")]):
        with pytest.raises(sbatch_args.PsbatchError):
            sbatch_args.own_options(bad)


def test_own_options_refuse_what_the_profile_token_cannot_carry():
    """A count below 1, past the token's bound or not in digits was once recorded as written
    (``pp=-1,2``, ``mbmin=-5``: a token the controller cannot read, so the job silently
    stayed rigid) or read loosely (``gpus=2-`` as 2): now the job goes unchanged, with a warning."""
    for key, value in (("pp", "0"), ("pp", "-1,2"), ("min-micro-batch", "-5"), ("min-micro-batch", "0"),
                       ("min-micro-batch", "1" + "0" * 20), ("pp", "1" + "0" * 20), ("gpus", "2-"),
                       ("gpus", "+4"), ("gpus", "\u0664")):
        with pytest.raises(sbatch_args.PsbatchError, match="bad value"):
            sbatch_args.own_options([(key, value)])


# ---------------------------------------------------------------- script text


def test_read_header_stops_at_first_command_and_splits_hetjob():
    lines = ["#!/bin/bash", "#SBATCH -N 2 # two nodes", "# note", "#SBATCH --comment='a b'",
             "#SBATCH hetjob", "#SBATCH -n 1", "", "echo hi", "#SBATCH -p late", "#PSWIFT gpus=2-4 off"]
    script = jobscript.read_header(lines)
    assert script.header == [["-N", "2", "--comment=a b"], ["-n", "1"]]
    assert script.own == [("gpus", "2-4"), ("", "off")]


# Directive lines and the words sbatch takes from them, as Slurm 22.05's sbatch does (the
# integration tests check them against the real sbatch).
DIRECTIVES = json.loads((DATA / "directives.json").read_text())


@pytest.mark.parametrize("case", DIRECTIVES, ids=[c["line"] for c in DIRECTIVES])
def test_directive_words_are_split_as_sbatch_splits_them(case):
    assert jobscript.directive_words(case["line"]) == case["words"]
    script = jobscript.read_header(["#!/bin/sh", "#SBATCH" + case["line"], "true"])
    assert script.header == [case["words"]]
    assert script.version_dependent == case.get("versions_differ", False)


def test_a_directive_slurm_versions_read_differently_keeps_the_job_as_written():
    text = ("#!/bin/bash\n#SBATCH --gpus=2\n#SBATCH --comment=run\\ 7\n"
            "torchrun pretrain_gpt.py --num-layers 4 --hidden-size 64 --num-attention-heads 4 --seq-length 64"
            " --global-batch-size 8 --train-iters 10\n")
    with pytest.raises(sbatch_args.PsbatchError, match="backslash before a blank"):
        psbatch.plan_job(["x.sh"], [], text, {})
    assert psbatch.plan_job(["x.sh"], [], text.replace("run\\ 7", "'run 7'"), {}) is not None


def test_read_header_takes_the_old_slurm_directives_as_sbatch_does():
    lines = ["#!/bin/bash", "#SLURM --gpus=8", "#SBATCH -N 2", "srun hostname", "#SLURM -p late"]
    assert jobscript.read_header(lines).header == [["--gpus=8", "-N", "2"]]


@pytest.mark.parametrize("values, expected", [
    ({}, (None, None)),
    ({"nodes": "2", "gpus-per-node": "4"}, (8, 4)),
    ({"nodes": "2-4", "gpus-per-node": "a100:4"}, (8, 4)),
    ({"gres": "gpu:2"}, (2, 2)),
    ({"nodes": "3", "gres": "shard:1,gpu:h100:8"}, (24, 8)),
    ({"gpus": "6", "nodes": "2"}, (6, 3)),
    ({"gpus": "5", "nodes": "2"}, (5, None)),
    ({"gpus-per-task": "1", "ntasks": "4"}, (4, 4)),
    ({"gpus-per-task": "2", "ntasks-per-node": "2", "nodes": "2"}, (8, 4)),
    # both per job and per node: per node decides, as the controller reads Slurm's fields
    ({"gpus": "4", "gpus-per-node": "2", "nodes": "2"}, (4, 2)),
    # per socket: Slurm says how many sockets a node gives; the job goes as written
    ({"gpus-per-socket": "2"}, (None, None)),
    # not counts (sbatch refuses them): no world to plan for, so the job goes as written
    ({"gpus": "-4"}, (None, None)),
    ({"gpus": "a100:-4"}, (None, None)),
    ({"gpus-per-node": "x4"}, (None, None)),
    ({"gpus": "\u0664"}, (None, None)),
])
def test_requested_world(values, expected):
    assert sbatch_args.requested_world(values) == expected


def test_effective_options_precedence():
    cmdline = psbatch.scan_argv(["--gpus=8", "job.sh"]).opts
    values = sbatch_args.effective_options(cmdline, ["--gpus=2", "-N", "2"], {"SBATCH_GPUS": "4"})
    assert values["gpus"] == "8" and values["nodes"] == "2"
    assert sbatch_args.effective_options([], ["--gpus=2"], {"SBATCH_GPUS": "4"})["gpus"] == "4"


def test_environment_gres_counts_and_comment_does_not():
    """sbatch reads SBATCH_GRES (over #SBATCH lines) but has no SBATCH_COMMENT."""
    values = sbatch_args.effective_options([], ["--gres=gpu:1", "--comment=mine"],
                                       {"SBATCH_GRES": "gpu:2", "SBATCH_COMMENT": "env"})
    assert sbatch_args.requested_world(values) == (2, 2) and values["comment"] == "mine"
    text = ("#!/bin/bash\ntorchrun pretrain_gpt.py --num-layers 4 --hidden-size 64 --num-attention-heads 4"
            " --seq-length 64 --global-batch-size 8 --train-iters 10 --pipeline-model-parallel-size 4\n")
    plan = psbatch.plan_job(["x.sh"], [], text, {"SBATCH_COMMENT": "env"})
    assert plan is not None and plan.argv[0].startswith("--comment=pswift1;")
    with pytest.raises(MegatronArgError):  # four pipeline stages on the two GPUs asked for
        psbatch.plan_job(["x.sh"], [], text, {"SBATCH_GRES": "gpu:2"})


@pytest.mark.parametrize("text, found", [
    ("torchrun pretrain_gpt.py $ARGS", True),
    ("python train.py --num-layers 2 --hidden-size 8 --num-attention-heads 2 --seq-length 8", True),
    ("torchrun --nproc-per-node 2 x.py --num-layers 2", True),
    ("echo pretrain_gpt.py --num-layers 2 --hidden-size 8 --num-attention-heads 2 --seq-length 8", False),
    ("python train.py --num-layers 2", False),
    ("ls -l", False),
])
def test_is_training_command(text, found):
    assert training.find_training_command(text.split("\n")) is not None if found else \
        training.find_training_command(text.split("\n")) is None


def test_variables_expand_from_script_and_environment():
    lines = ["L=12", "torchrun pretrain_gpt.py --num-layers $L --hidden-size ${H} $REST"]
    cmd = training.find_training_command(lines, {"H": "64", "REST": "--seq-length 128"})
    assert cmd is not None
    assert cmd.words[-6:] == ("--num-layers", "12", "--hidden-size", "64", "--seq-length", "128")


def test_variables_that_double_at_each_line_are_read_in_bounded_work():
    # a fuzzed script: each assignment doubles the last, so the 40th would hold 2**40 words;
    # substitution spends a budget over the whole script, and past it a variable stays as
    # written (the fuzz found 24 such lines took 19 s and 936 MB, and 27 would need 8 GB)
    lines = ["A0=--bf16"] + ['A%d="$A%d $A%d"' % (i, i - 1, i - 1) for i in range(1, 41)]
    lines.append("torchrun pretrain_gpt.py --num-layers 2 $A40 $A3")
    cmd = training.find_training_command(lines)
    assert cmd is not None and cmd.words[-2:] == ("$A40", "$A3")
    assert len(cmd.words) < 10


def test_declared_arrays_keep_their_flags():
    lines = ["declare -a BATCH=(--micro-batch-size 2 --global-batch-size 64)", "export -n L=12",
             'torchrun pretrain_gpt.py --num-layers $L "${BATCH[@]}"']
    cmd = training.find_training_command(lines)
    assert cmd is not None
    assert cmd.words[-6:] == ("--num-layers", "12", "--micro-batch-size", "2", "--global-batch-size", "64")


def test_unknown_variables_stay_and_make_the_job_invalid(tmp_path):
    text = "#!/bin/bash\ntorchrun pretrain_gpt.py --num-layers $NL --hidden-size 8 " \
           "--num-attention-heads 2 --seq-length 8\n"
    with pytest.raises(MegatronArgError, match="--num-layers"):
        psbatch.plan_job([], [], text, {})


def _golden_text(script: Path) -> str:
    argv = ["-p", "gpu", script.name, "arg1"]
    try:
        plan = psbatch.plan_job(argv, [("class", "golden")], script.read_text(), {"HOME": "/home/u"})
    except (sbatch_args.PsbatchError, MegatronArgError) as exc:
        return "NOT OPTED IN (warning, submitted unchanged): %s\n" % exc
    comment = next(a for a in plan.argv if a.startswith("--comment="))
    request = decode_profile(comment)
    return "argv: %s\nprofile: %s\n---\n%s" % (
        json.dumps([a if not a.startswith("--comment=") else "--comment=<see profile>" for a in plan.argv]),
        json.dumps({"user_comment": " ".join(w for w in comment[len("--comment="):].split(" ")
                                             if not w.startswith("pswift1;")),
                    "argv": list(request.argv), "gpus": request.gpus,
                    "min_micro_batch_size": request.min_micro_batch_size, "allowed_pp": request.allowed_pp,
                    "job_class": request.job_class}),
        plan.text)


@pytest.mark.parametrize("script", SCRIPTS, ids=[s.stem for s in SCRIPTS])
def test_rewrite_golden(script):
    expected_path = DATA / "expected" / (script.stem + ".txt")
    got = _golden_text(script)
    if os.environ.get(ACCEPT):
        expected_path.parent.mkdir(exist_ok=True)
        expected_path.write_text(got)
    assert expected_path.exists(), "no golden file %s; run %s=1 pytest %s to create it" % (
        expected_path, ACCEPT, __file__)
    assert got == expected_path.read_text(), (
        "psbatch's rewrite of %s changed; if the change is intended, accept it with\n"
        "    %s=1 python -m pytest tests/unit/test_psbatch.py -k test_rewrite_golden\n"
        "and review the diff of %s" % (script.name, ACCEPT, expected_path))


def test_rewrite_preserves_every_other_byte():
    text = (DATA / "scripts" / "torchrun_vars.sh").read_text()
    plan = psbatch.plan_job(["x.sh"], [], text, {})
    assert plan is not None and plan.text is not None
    assert plan.text.replace("pipeswift-launch -- ", "", 1) == text


# ---------------------------------------------------------------- the shell scanner


def _reference_scan(text: str) -> tuple[bool, list[int], str]:
    """jobscript._scan_shell as first written, one character at a time: the oracle for the
    faster one (which copies runs of ordinary characters whole)."""
    starts, keep = [0], []
    quote, depth, i, n = "", 0, 0, len(text)
    while i < n:
        c = text[i]
        if quote:
            if c == "\\" and quote == '"' and i + 1 < n:
                keep.append(text[i:i + 2])
                i += 2
                continue
            if c == quote:
                quote = ""
        elif c == "\\":
            if i + 1 >= n:
                return True, starts, "".join(keep)
            keep.append(text[i:i + 2])
            i += 2
            continue
        elif c in "'\"`":
            quote = c
        elif c == "#" and (i == 0 or text[i - 1] in " \t\n;&|("):
            end = text.find("\n", i)
            i = n if end < 0 else end
            continue
        elif c in "(":
            depth += 1
        elif c == ")":
            depth = max(0, depth - 1)
        elif c in ";&|" and depth == 0:
            while i + 1 < n and text[i + 1] in ";&|":
                keep.append(c)
                i += 1
            starts.append(i + 1)
        keep.append(c)
        i += 1
    return bool(quote) or depth > 0, starts, "".join(keep)


@settings(max_examples=600, deadline=None)
@given(st.text(alphabet="ab \t\n\\'\"`#();&|$=", max_size=40))
def test_shell_scan_is_the_character_by_character_one(text):
    assert jobscript._scan_shell(text) == _reference_scan(text)


@settings(max_examples=600, deadline=None)
@given(st.text(alphabet="ab \t\r\n\x0b\x0c\u00a0\u2003\\'\"#$=", max_size=30))
def test_shell_words_are_shlex_words(text):
    try:
        want = shlex.split(text)
    except ValueError:
        with pytest.raises(ValueError):
            jobscript.shell_words(text)
    else:
        assert jobscript.shell_words(text) == want


@settings(max_examples=600, deadline=None)
@given(st.lists(st.sampled_from(["a", "bc", " ", "\t", "\n", "\\", "'", '"', "#", "--x=1", "\\\"", "''"]),
                max_size=16).map("".join))
def test_sbatch_line_words_are_shlex_words_with_comments(text):
    try:
        want = shlex.split(text, comments=True)
    except ValueError:
        want = text.split("#", 1)[0].split()
    assert jobscript._split_words(text) == want


# ---------------------------------------------------------------- submission (fake sbatch)


def _psbatch(args, tmp_path, stdin=b"", rc=0, extra_env=None, sbatch=str(FAKE),
             entry=(sys.executable, "-m", "pipeswift_slurm.submit.psbatch")):
    log_file = tmp_path / "calls.jsonl"
    if log_file.exists():
        log_file.unlink()
    env = dict(os.environ, PIPESWIFT_SBATCH=sbatch, FAKE_SBATCH_LOG=str(log_file), FAKE_SBATCH_RC=str(rc))
    env.update(extra_env or {})
    done = subprocess.run([*entry, *args], input=stdin,
                          capture_output=True, cwd=tmp_path, env=env, timeout=60, check=False)
    calls = [json.loads(line) for line in log_file.read_text().splitlines()] if log_file.exists() else []
    return done, calls


def test_plain_job_is_byte_identical(tmp_path):
    script = tmp_path / "plain.sh"
    script.write_text("#!/bin/bash\n#SBATCH -N 1\necho hello\n")
    done, calls = _psbatch(["-p", "gpu", "--parsable", "plain.sh", "a b"], tmp_path)
    assert done.returncode == 0 and done.stdout == b"42\n" and done.stderr == b""
    assert calls == [{"argv": ["-p", "gpu", "--parsable", "plain.sh", "a b"], "stdin": None,
                      "script": script.read_text(), "script_name": "plain.sh"}]


def test_plain_stdin_job_passes_same_bytes(tmp_path):
    data = b"#!/bin/bash\n#SBATCH -n1\necho \xff\xfe odd bytes\n"
    done, calls = _psbatch(["-J", "x"], tmp_path, stdin=data)
    assert done.returncode == 0
    assert calls[0]["argv"] == ["-J", "x"]
    assert calls[0]["stdin"].encode("utf-8", "surrogateescape") == data


def test_exit_code_and_stderr_pass_through(tmp_path):
    done, calls = _psbatch(["--wrap", "true", "-p", "nope"], tmp_path, rc=1)
    assert done.returncode == 1 and b"sbatch: error: fake failure" in done.stderr
    assert calls[0]["argv"] == ["--wrap", "true", "-p", "nope"]


def test_megatron_script_file_is_enriched(tmp_path):
    src = DATA / "scripts" / "torchrun_vars.sh"
    (tmp_path / "train.sh").write_bytes(src.read_bytes())
    done, calls = _psbatch(["--pipeswift-pp=1,2,4", "-p", "gpu", "train.sh", "x"], tmp_path)
    assert done.returncode == 0 and done.stderr == b"", done.stderr
    argv = calls[0]["argv"]
    assert argv[0].startswith("--comment=pswift1;") and argv[0].endswith(" my note") and argv[1:4] == ["--begin=now+60", "-p", "gpu"] and argv[-1] == "x"
    assert calls[0]["script_name"] == "train.sh" and not os.path.exists(argv[-2])  # temp file cleaned up
    assert "pipeswift-launch -- torchrun" in calls[0]["script"]
    request = decode_profile(argv[0])
    assert request.allowed_pp == (1, 2, 4) and request.gpus == (4, 16) and "--num-layers" in request.argv


def test_a_token_in_the_users_own_comment_is_not_the_one_read(tmp_path):
    """psbatch's checked token goes first: the controller and the launcher read the first
    token of the comment, so a forged one the user wrote there is not what they plan with."""
    from pipeswift_slurm.core.token import decode_profile

    (tmp_path / "job.sh").write_text(CHECKED)
    done, calls = _psbatch(["--comment=pswift1;args=W10=;gpus=1-100000;world=1", "job.sh"], tmp_path)
    assert done.returncode == 0 and done.stderr == b""
    comment = calls[0]["argv"][0][len("--comment="):]
    assert comment.endswith(" pswift1;args=W10=;gpus=1-100000;world=1")
    assert decode_profile(comment).gpus == (2, 8)  # the #PSWIFT gpus=2-8 of the script


def test_a_comment_too_long_for_the_token_goes_unchanged(tmp_path):
    (tmp_path / "job.sh").write_text(CHECKED)
    done, calls = _psbatch(["--comment=" + "x" * 60_000, "job.sh"], tmp_path)
    assert done.returncode == 0 and calls[0]["argv"] == ["--comment=" + "x" * 60_000, "job.sh"]
    assert "over the 60000 the controller reads; shorten --comment; submitted unchanged" in done.stderr.decode()
    # with no comment, the training command's own arguments are what is too long, and the
    # line says so (the fuzzed script behind the word budget above blamed a comment it did not have)
    long_args = CHECKED.replace("pretrain_gpt.py", "pretrain_gpt.py " + " ".join(["--bf16"] * 9000))
    (tmp_path / "job.sh").write_text(long_args)
    done, calls = _psbatch(["job.sh"], tmp_path)
    assert done.returncode == 0 and calls[-1]["argv"] == ["job.sh"]
    assert "the profile token of the training command on line" in done.stderr.decode()
    assert "pass fewer arguments there; submitted unchanged" in done.stderr.decode()


def test_megatron_wrap_and_stdin_are_enriched(tmp_path):
    cmd = ("torchrun pretrain_gpt.py --num-layers 4 --hidden-size 64 --num-attention-heads 4 "
           "--seq-length 64 --global-batch-size 8 --train-iters 10")
    done, calls = _psbatch(["--gpus=2", "--comment", "mine", "--wrap", cmd], tmp_path)
    assert done.returncode == 0, done.stderr
    argv = calls[0]["argv"]
    assert argv[0].startswith("--comment=pswift1;") and argv[0].endswith(" mine") and argv[1] == "--wrap=pipeswift-launch -- " + cmd
    assert argv[2:] == ["--begin=now+60", "--gpus=2"]  # the first look (test_first_look_...)
    done, calls = _psbatch(["--gpus=2"], tmp_path, stdin=("#!/bin/sh\n" + cmd + "\n").encode())
    assert calls[-1]["stdin"] == "#!/bin/sh\npipeswift-launch -- " + cmd + "\n"


def test_invalid_megatron_job_submitted_unchanged_with_one_warning(tmp_path):
    text = ("#!/bin/bash\ntorchrun pretrain_gpt.py --num-layers 5 --hidden-size 64 --num-attention-heads 4"
            " --seq-length 64 --pipeline-model-parallel-size 2\n")
    (tmp_path / "bad.sh").write_text(text)
    done, calls = _psbatch(["--pipeswift-gpus=2-4", "--gpus=2", "bad.sh"], tmp_path)
    assert done.returncode == 0
    lines = done.stderr.decode().splitlines()
    assert len(lines) == 1 and lines[0].startswith("psbatch: warning: ") and lines[0].endswith("; submitted unchanged")
    assert calls[0]["argv"] == ["--gpus=2", "bad.sh"] and calls[0]["script"] == text


def test_internal_error_falls_back_to_unchanged_submission(tmp_path):
    (tmp_path / "t.sh").write_text("#!/bin/bash\npython pretrain_gpt.py\n")
    boom = tmp_path / "boom.py"
    boom.write_text("import sys\nimport pipeswift_slurm.submit.psbatch as p\n"
                    "def bad(*a, **k):\n    raise RuntimeError('boom')\n"
                    "p.plan_job = bad\nsys.exit(p.main())\n")
    done, calls = _psbatch(["--pipeswift-gpus=2", "t.sh"], tmp_path, entry=(sys.executable, str(boom)))
    assert done.returncode == 0
    assert done.stderr.decode() == "psbatch: warning: psbatch internal error (RuntimeError: boom); submitted unchanged\n"
    assert calls[0]["argv"] == ["t.sh"]


def test_a_script_that_is_a_pipe_is_left_to_sbatch(tmp_path):
    """``psbatch <(...)`` or a FIFO: psbatch once read the pipe (or waited on a FIFO with no
    writer), so sbatch got an empty script. It now reads plain files only."""
    data = b"#!/bin/bash\npython pretrain_gpt.py --num-layers 4\n"
    read_end, write_end = os.pipe()
    os.write(write_end, data)
    os.close(write_end)
    try:
        assert psbatch.read_source(["-J", "x", "/dev/fd/%d" % read_end], None) == (None, None, "", False)
        assert os.read(read_end, 1000) == data  # every byte left for sbatch
    finally:
        os.close(read_end)
    os.mkfifo(tmp_path / "fifo")
    done, calls = _psbatch(["--pipeswift-gpus=2", "fifo"], tmp_path)  # no writer: no hang either
    assert done.returncode == 0 and calls[0]["argv"] == ["fifo"]
    assert done.stderr.decode() == "psbatch: warning: Megatron job not opted in to PipeSwift: cannot read the job" \
        " script; submitted unchanged\n"


@pytest.mark.parametrize("stdin", [False, True])
def test_a_megatron_script_too_big_to_read_says_so(tmp_path, stdin):
    big = CHECKED + "#" * (1 << 20)
    (tmp_path / "job.sh").write_text(big)
    done, calls = _psbatch([] if stdin else ["job.sh"], tmp_path, stdin=big.encode() if stdin else b"")
    assert done.returncode == 0 and calls[0]["argv"] == ([] if stdin else ["job.sh"])
    assert done.stderr.decode() == "psbatch: warning: Megatron job not opted in to PipeSwift: the job script is" \
        " over 1048576 bytes, more than psbatch reads; submitted unchanged\n"
    (tmp_path / "plain.sh").write_text("#!/bin/bash\necho hi\n" + "#" * (1 << 20))
    assert _psbatch(["plain.sh"], tmp_path)[0].stderr == b""  # a plain job: not a word
    checked = _psbatch(["--pipeswift=check", "plain.sh"], tmp_path)[0]  # asked: the size, not "cannot read"
    assert checked.returncode == 1 and "the job script is over 1048576 bytes" in checked.stdout.decode()


def test_opt_out_and_sbatch_missing(tmp_path):
    cmd = "python pretrain_gpt.py --num-layers 4 --hidden-size 64 --num-attention-heads 4 --seq-length 64"
    done, calls = _psbatch(["--pipeswift=off", "--wrap", cmd], tmp_path)
    assert calls[0]["argv"] == ["--wrap", cmd] and done.stderr == b""
    done, calls = _psbatch(["--wrap", "true"], tmp_path, sbatch="/nonexistent/sbatch")
    assert done.returncode != 0 and calls == []


# ---------------------------------------------------------------- --pipeswift=check

CHECKED = ("#!/bin/bash\n#SBATCH --gres=gpu:4\n#PSWIFT gpus=2-8\nexport X=1\n"
           "torchrun --nproc_per_node 4 pretrain_gpt.py --num-layers 8 --hidden-size 1024 --num-attention-heads 8"
           " \\\n  --seq-length 1024 --global-batch-size 64 --micro-batch-size 2 --train-iters 1000"
           " --tensor-model-parallel-size 2 --save /ck --load /ck --save-interval 100\n")


def _rows(stdout: str) -> dict[int, tuple[str, bool]]:
    """The prediction table: GPU count -> (run time, marked fastest)."""
    rows = {}
    for line in stdout.splitlines():
        parts = line.split()
        if parts and parts[0].isdigit() and "gpu=" in line:
            rows[int(parts[0])] = (parts[-1], parts[1] == "*")
    return rows


def test_check_reports_what_psbatch_would_do_and_submits_nothing(tmp_path):
    (tmp_path / "meg.sh").write_text(CHECKED)
    done, calls = _psbatch(["--pipeswift=check", "-p", "gpu", "meg.sh", "x"], tmp_path)
    out = done.stdout.decode()
    assert done.returncode == 0 and calls == [] and done.stderr == b""
    assert out.startswith("psbatch: this Megatron job would be opted in to PipeSwift")
    assert "line 5: torchrun --nproc_per_node 4 pretrain_gpt.py --num-layers 8" in out
    assert "line 5 becomes     pipeswift-launch -- torchrun" in out
    assert "your config        4gpu=1x4 tp2 pp1 dp2 mbs2 M16" in out
    assert "2-8 GPUs" in out and "checkpoints every 100 iterations" in out
    assert "'--comment=pswift1;args=<" in out and ";gpus=2-8;world=4;look=1' --begin=now+60 -p gpu meg.sh x" in out
    rows = _rows(out)
    # 8 heads, 8 layers, a batch of 64: 3, 5, 6 and 7 GPUs run as that many stages (uneven first/last)
    assert set(rows) == {2, 3, 4, 5, 6, 7, 8}
    assert "no valid layout" not in out
    assert [g for g, (_, fastest) in rows.items() if fastest] == [8]
    # the same job submitted for real is what the report said
    done, calls = _psbatch(["-p", "gpu", "meg.sh", "x"], tmp_path)
    assert done.returncode == 0 and calls[0]["argv"][0].endswith(";gpus=2-8;world=4;look=1")
    assert "pipeswift-launch -- torchrun" in calls[0]["script"]


def test_check_reads_the_script_from_stdin_and_the_gpu_type_from_the_environment(tmp_path):
    done, calls = _psbatch(["--pipeswift=check"], tmp_path, stdin=CHECKED.encode(),
                           extra_env={"PIPESWIFT_GPU_TYPE": "H100-80GB"})
    assert done.returncode == 0 and calls == []
    assert "Predicted run time on H100-80GB, 4 GPUs per node, by the cost model alone" in done.stdout.decode()


def test_check_predicts_with_the_site_model_the_controller_publishes(tmp_path):
    from pipeswift_slurm.core import site_model

    published = tmp_path / "site-model.json"
    site_model.write(str(published), site_model.SiteModel({}, "H100-80GB", written_at=1.7e9))
    done, calls = _psbatch(["--pipeswift=check"], tmp_path, stdin=CHECKED.encode(),
                           extra_env={site_model.ENV: str(published)})
    assert done.returncode == 0 and calls == []
    assert "Predicted run time on H100-80GB, 4 GPUs per node, by the site model of 2023-11-14T22:13:20Z" \
        in done.stdout.decode()


@pytest.mark.parametrize("script, why", [
    ("#!/bin/bash\necho hello\n", "not a Megatron job: no training command found"),
    (CHECKED.replace("--num-attention-heads 8", "--num-attention-heads 7"), "invalid Megatron arguments"),
    (CHECKED.replace(" --train-iters 1000", ""), "--train-iters: neither it nor --train-samples is given"),
    (CHECKED.replace("\n", "\r\n"), "the script has DOS line breaks (\\r\\n), which sbatch refuses"),
    (CHECKED.replace(" --train-iters 1000", " --train-iters 1000 --num-experts 8 --expert-model-parallel-size 2"),
     "a model PipeSwift does not plan (--num-experts: mixture-of-experts"),  # layouts Megatron would refuse
    (CHECKED.replace("#PSWIFT gpus=2-8", "#PSWIFT off"), "opted out"),
    (CHECKED.replace("#PSWIFT gpus=2-8", "#PSWIFT gpus=8-2"), "bad value '8-2' for --pipeswift-gpus"),
])
def test_check_says_why_a_job_would_go_unchanged(tmp_path, script, why):
    (tmp_path / "job.sh").write_text(script)
    done, calls = _psbatch(["--pipeswift=check", "job.sh"], tmp_path)
    out = done.stdout.decode()
    assert done.returncode == 1 and calls == [] and out.count("\n") == 1
    assert why in out and out.endswith("psbatch would submit the job unchanged (--pipeswift=check: nothing submitted)\n")


def test_check_is_a_command_line_option_only(tmp_path):
    (tmp_path / "job.sh").write_text(CHECKED.replace("#PSWIFT gpus=2-8", "#PSWIFT check"))
    done, calls = _psbatch(["job.sh"], tmp_path)
    assert "unknown option --pipeswift-check" in done.stderr.decode() and calls[0]["argv"] == ["job.sh"]


@pytest.mark.parametrize("tmpdir", ["/nonexistent", "/proc", "/etc/hostname"])
def test_an_unusable_tmpdir_costs_nothing(tmp_path, tmpdir):
    """sbatch never reads TMPDIR: psbatch writes the rewritten script to /tmp instead."""
    (tmp_path / "job.sh").write_text(CHECKED)
    done, calls = _psbatch(["job.sh"], tmp_path, extra_env={"TMPDIR": tmpdir})
    assert done.returncode == 0 and done.stderr == b"" and calls[0]["argv"][0].startswith("--comment=pswift1;")


def test_a_script_that_cannot_be_written_is_submitted_as_written(tmp_path):
    """No folder anywhere for the rewritten script: the job goes as written (own options
    removed), with one warning, never a traceback."""
    (tmp_path / "job.sh").write_text(CHECKED)
    entry = (sys.executable, "-c", "import sys; from pipeswift_slurm.submit import psbatch\n"
             "def no(environ): raise OSError('no folder for it (/tmp: No space left on device)')\n"
             "psbatch._private_folder = no\nsys.exit(psbatch.main())")
    done, calls = _psbatch(["--pipeswift-gpus=2-8", "job.sh"], tmp_path, entry=entry)
    assert done.returncode == 0 and calls[0]["argv"] == ["job.sh"]
    assert done.stderr.decode() == "psbatch: warning: Megatron job not opted in to PipeSwift: cannot write the" \
        " rewritten script: no folder for it (/tmp: No space left on device); submitted unchanged\n"


def test_an_own_option_that_took_the_script_as_its_value_submits_nothing(tmp_path):
    """Found by fuzzing: ``--pipeswift-gpus job.sh`` took the script's name as the range and
    left sbatch no script ("submitted unchanged", reading stdin). A value its option cannot
    take, in the last word, with no script after it, is refused; a good one (the script on
    stdin) is not."""
    (tmp_path / "job.sh").write_text(CHECKED)
    done, calls = _psbatch(["--pipeswift-gpus", "job.sh"], tmp_path, stdin=b"echo INJECTED\n")
    assert done.returncode == 2 and calls == []
    assert done.stderr.decode() == ("psbatch: error: --pipeswift-gpus took the last word, job.sh, as its value,"
                                    " which leaves no script; write --pipeswift-gpus=VALUE before the script;"
                                    " nothing submitted\n")
    done, calls = _psbatch(["--pipeswift-gpus", "2-8"], tmp_path, stdin=CHECKED.encode())
    assert done.returncode == 0 and calls[0]["argv"][0].startswith("--comment=pswift1;")


@pytest.mark.parametrize("args", [["--pipeswift-check", "job.sh"], ["--pipeswift-gpu", "job.sh"],
                                  ["--pipeswift-check", "--pipeswift=check", "job.sh"]])
def test_an_unknown_own_option_submits_nothing_and_keeps_the_script(tmp_path, args):
    """A typo of an own option is refused as sbatch refuses an unknown option: the job is not
    submitted (``--pipeswift-check`` must not submit what the user only wanted checked),
    and the option does not take the script's name as its value."""
    (tmp_path / "job.sh").write_text(CHECKED)
    done, calls = _psbatch(args, tmp_path, stdin=b"echo INJECTED\n")
    assert done.returncode == 2 and calls == []
    err = done.stderr.decode()
    assert err.startswith("psbatch: error: unknown option --%s (known: --pipeswift-gpus, " % args[0][2:])
    assert err.endswith("; nothing submitted\n") and err.count("\n") == 1
    from pipeswift_slurm.submit.sbatch_args import scan_argv

    assert scan_argv(args).script_index == len(args) - 1  # the script is still the script


@pytest.mark.parametrize("lo, hi, requested, expected", [
    (2, 8, 4, [2, 3, 4, 5, 6, 7, 8]),
    (1, 512, 24, [1, 2, 4, 8, 16, 24, 32, 64, 128, 256, 512]),
    (12, 100, 12, [12, 16, 24, 32, 40, 48, 56, 64, 72, 80, 88, 96, 100]),
])
def test_check_shows_a_bounded_set_of_gpu_counts(lo, hi, requested, expected):
    from pipeswift_slurm.submit.check import MAX_ROWS, gpu_counts

    counts = gpu_counts(lo, hi, requested, 8)
    assert counts == expected and len(counts) <= MAX_ROWS


def test_find_sbatch_skips_itself(tmp_path, monkeypatch):
    (tmp_path / "sbatch").write_text("#!/bin/sh\n")
    (tmp_path / "sbatch").chmod(0o755)
    monkeypatch.setattr(sys, "argv", [str(tmp_path / "sbatch")])
    assert psbatch.find_sbatch({"PATH": str(tmp_path)}) is None
    monkeypatch.setattr(sys, "argv", ["/usr/bin/psbatch"])
    assert psbatch.find_sbatch({"PATH": str(tmp_path)}) == str(tmp_path / "sbatch")


def test_import_is_light(tmp_path):
    """The submit path imports no logging, SQLAlchemy or click (and no dataclass module until
    a Megatron job needs the core), whether or not the job is a Megatron job."""
    script = tmp_path / "meg.sh"
    script.write_text("#!/bin/bash\n#SBATCH --gpus=2\ntorchrun pretrain_gpt.py --num-layers 4 --hidden-size 64"
                      " --num-attention-heads 4 --seq-length 64 --global-batch-size 8 --train-iters 10\n")
    code = ("import sys, pipeswift_slurm.submit.psbatch as p\n"
            "def heavy(): return sorted(m for m in sys.modules if m.split('.')[0] in ('logging', 'sqlalchemy',"
            " 'click', 'dataclasses') or m.startswith('pipeswift_slurm.core'))\n"
            "print(heavy())\n"
            "a = p.decide([sys.argv[1]], {}, lambda argv: p.read_source(argv, None))\n"
            "assert a.argv[0].startswith('--comment=pswift1;'), a\n"
            "print(heavy())\n")
    out = subprocess.run([sys.executable, "-c", code, str(script)], capture_output=True, text=True,
                         check=True).stdout.splitlines()
    assert out[0] == "[]"  # a plain job: psbatch's own light modules only
    assert "logging" not in out[1] and "sqlalchemy" not in out[1] and "click" not in out[1]
    assert "pipeswift_slurm.core.request" in out[1]  # a Megatron job: validated by the core


@pytest.mark.parametrize("text, seconds", [
    ("90", 5400), ("90:30", 5430), ("2:00:00", 7200), ("1-0", 86400), ("1-2", 93600), ("1-2:30", 95400),
    ("1-2:30:15", 95415), ("UNLIMITED", None), ("infinite", None), ("", None), (None, None), ("x:1", None),
])
def test_time_limit_is_read_as_sbatch_reads_it(text, seconds):
    from pipeswift_slurm.submit.sbatch_args import time_limit_s

    assert time_limit_s(text) == seconds


def _user_run_time(out: str) -> str:
    return out.split("your config: ")[1].split(" on ")[0]


@pytest.mark.parametrize("header, argv, warned", [
    ("#SBATCH -t 1\n", [], True),                 # one minute
    ("#SBATCH --time=30-0\n", [], False),         # thirty days
    ("#SBATCH -t 30-0\n", ["-t", "1"], True),     # the command line wins
    ("#SBATCH -t 1\n", ["--time=30-0"], False),
    ("", [], False),                              # no limit: no warning
])
def test_check_warns_when_the_run_time_exceeds_the_time_limit(tmp_path, header, argv, warned):
    (tmp_path / "job.sh").write_text(CHECKED.replace("#SBATCH --gres=gpu:4\n", "#SBATCH --gres=gpu:4\n" + header))
    done, calls = _psbatch(["--pipeswift=check", *argv, "job.sh"], tmp_path)
    out = done.stdout.decode()
    assert done.returncode == 0 and calls == []
    said = [line for line in out.splitlines() if "exceeds the job's time limit" in line]
    assert len(said) == int(warned)
    if warned:  # one line, naming the predicted run time and the limit
        assert said[0].startswith("warning: your config's predicted run time %s exceeds the job's time limit 60s"
                                  % _user_run_time(out))


def test_a_job_the_controller_resized_keeps_a_valid_profile():
    """Issue 28 item 1: -N1 --gpus-per-node=4, tp2 pp2 mbs4, global batch 256, gpus=4-16. The
    controller resized it to 12 GPUs (a layout valid there, e.g. pp6 or tp4 pp3); on the next
    tick it must not re-check the user's tp2 pp2 mbs4 at 12 GPUs (256 % (4*3) != 0). The size
    submitted is what the controller's own decision token (AdminComment) says, not the
    Comment's world=, which the user can edit: a job of another size that claims 4 without
    our token is refused, with the reason."""
    from pipeswift_slurm.core.model import ExecConfig, Job
    from pipeswift_slurm.core.token import encode_decision
    from pipeswift_slurm.slurm.controller import parse_profile

    text = ("#!/bin/bash\n#SBATCH -N1 --gpus-per-node=4\n#PSWIFT gpus=4-16\n"
            "torchrun pretrain_gpt.py --num-layers 24 --hidden-size 1024 --num-attention-heads 16"
            " --seq-length 1024 --tensor-model-parallel-size 2 --pipeline-model-parallel-size 2"
            " --micro-batch-size 4 --global-batch-size 256 --train-iters 100\n")
    plan = psbatch.plan_job(["x.sh"], [], text, {})
    comment = next(w.split("=", 1)[1] for w in plan.argv if w.startswith("--comment="))
    assert decode_profile(comment).world_size == 4
    for gpus in (4, 12, 16):
        nodes = 1 if gpus == 4 else 2
        ours = encode_decision(ExecConfig(tp=1, pp=1, dp=gpus, micro_batch_size=1, num_micro_batches=256 // gpus,
                                          num_nodes=nodes, gpus_per_node=gpus // nodes), 1, asked_gpus=4)
        assert ("asked=4" in ours) == (gpus != 4)
        job = Job(1, "PENDING", 0.0, gpus=gpus, num_nodes=nodes, opted_in=True, comment=comment, admin_comment=ours)
        profile, why = parse_profile(job, 8, 16)
        assert profile is not None, why
        assert profile.requested.gpus == 4 and (profile.min_gpus, profile.max_gpus) == (4, 16)
        if gpus != 4:
            profile, why = parse_profile(replace(job, admin_comment=""), 8, 16)
            assert profile is None and why == "world=4, but the job was submitted with %d GPUs" % gpus


def test_a_range_above_the_submitted_size_is_not_widened_by_the_controller():
    """Issue 28 item 6: '#PSWIFT gpus=16' on a 4-GPU request means 16 GPUs, as check says."""
    from pipeswift_slurm.core.model import Job
    from pipeswift_slurm.slurm.controller import parse_profile

    text = ("#!/bin/bash\n#SBATCH --gpus=4\n#PSWIFT gpus=16\n"
            "torchrun pretrain_gpt.py --num-layers 24 --hidden-size 1024 --num-attention-heads 16"
            " --seq-length 1024 --global-batch-size 256 --train-iters 100\n")
    plan = psbatch.plan_job(["x.sh"], [], text, {})
    comment = next(w.split("=", 1)[1] for w in plan.argv if w.startswith("--comment="))
    profile, why = parse_profile(Job(1, "PENDING", 0.0, gpus=4, opted_in=True, comment=comment), 8, 64)
    assert profile is not None, why
    assert (profile.min_gpus, profile.max_gpus) == (16, 16)
    profile, why = parse_profile(Job(1, "PENDING", 0.0, gpus=4, opted_in=True, comment=comment), 8, 8)
    assert profile is not None and (profile.min_gpus, profile.max_gpus) == (8, 8)  # clipped to the cluster


_TRAIN = ("torchrun pretrain_gpt.py --num-layers 8 --hidden-size 1024 --num-attention-heads 8 --seq-length 1024"
          " --global-batch-size 64 --micro-batch-size 2 --train-iters 1000")


@pytest.mark.parametrize("line, becomes", [
    ("2>&1 %s" % _TRAIN, "pipeswift-launch -- 2>&1 torchrun"),  # a redirection is no command separator
    ("&>log %s" % _TRAIN, "pipeswift-launch -- &>log torchrun"),
    ("time %s &> log" % _TRAIN, "time pipeswift-launch -- torchrun"),
    ("%s >&2 | tee x" % _TRAIN, "pipeswift-launch -- torchrun"),
    ("( %s )" % _TRAIN, None),  # a subshell, a group, a function: the prefix cannot go there
    ("{ %s; }" % _TRAIN, None),
    ("f() { %s; }; f" % _TRAIN, None),
    ("time -p %s" % _TRAIN, None),  # a prefix word with options
    ("exec -a name %s" % _TRAIN, None),
    ("command -p %s" % _TRAIN, None),
])
def test_the_rewritten_script_is_still_valid_shell(tmp_path, line, becomes):
    """The prefix lands on the training command's name, or the job goes as written with
    one warning: never a script that fails when the job starts."""
    (tmp_path / "job.sh").write_text("#!/bin/bash\n#SBATCH --gpus-per-node=4\n%s\n" % line)
    done, calls = _psbatch(["job.sh"], tmp_path)
    script = calls[0]["script"]
    assert subprocess.run(["bash", "-n"], input=script, text=True, check=False).returncode == 0
    if becomes is None:
        assert script.endswith(line + "\n") and calls[0]["argv"] == ["job.sh"]
        assert "cannot put pipeswift-launch before the training command on line 3" in done.stderr.decode()
    else:
        assert script.splitlines()[2].startswith(becomes) and done.stderr == b""


FIRST_LOOK_TEXT = ("#!/bin/bash\ntorchrun pretrain_gpt.py --num-layers 4 --hidden-size 64 --num-attention-heads 4"
                   " --seq-length 64 --global-batch-size 8 --train-iters 10\n")


@pytest.mark.parametrize("options, environ, look_s", [
    ([], {}, 60),
    ([], {"PIPESWIFT_FIRST_LOOK_S": "15"}, 15),
    ([], {"PIPESWIFT_FIRST_LOOK_S": "0"}, 0),
    (["--begin=now+1hour"], {}, 0),  # the user's own begin time is kept, and no mark
    (["-b", "16:00"], {}, 0),
    ([], {"SBATCH_BEGIN": "now+10"}, 0),
    (["--hold"], {}, 0),
    (["-H"], {}, 0),
    (["--array=0-3"], {}, 0),  # the controller never changes an array's tasks
])
def test_the_first_look_gives_the_controller_a_begin_time_to_clear(options, environ, look_s):
    plan = psbatch.plan_job([*options, "x.sh"], [], FIRST_LOOK_TEXT, environ)
    assert plan is not None
    added = [a for a in plan.argv if a.startswith("--begin=") and a not in options]
    assert added == (["--begin=now+%d" % look_s] if look_s else [])
    assert decode_profile(plan.argv[0]).first_look is bool(look_s)


@pytest.mark.parametrize("value", ["x", "-5", "3601", "1.5", "\u00b2"])  # "²".isdigit(): an internal error
def test_a_bad_first_look_setting_is_one_clear_error(value):
    with pytest.raises(sbatch_args.PsbatchError, match="PIPESWIFT_FIRST_LOOK_S=.* from 0 to 3600"):
        psbatch.plan_job(["x.sh"], [], FIRST_LOOK_TEXT, {"PIPESWIFT_FIRST_LOOK_S": value})


@pytest.mark.parametrize("options, warned", [(["--pipeswift-pp=16"], True), ([], False)])
def test_check_warns_when_no_layout_it_may_use_runs(tmp_path, options, warned):
    """A pipeline size that no allowed GPU count can take (16 stages of 8 layers):
    the check said "would be opted in" and nothing else but a "no valid layout" line."""
    (tmp_path / "job.sh").write_text(CHECKED)
    done, calls = _psbatch(["--pipeswift=check", *options, "job.sh"], tmp_path)
    out = done.stdout.decode()
    assert done.returncode == 0 and calls == []
    assert ("warning: no layout PipeSwift may use runs on the GPU counts you allow" in out) == warned, out
