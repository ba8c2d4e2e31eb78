"""pipeswift-launch: allocation from Slurm's environment, decisions (valid, stale, forged in
the user Comment, missing, malformed) always ending in a config Megatron accepts for the
allocation, torchrun rewriting, and the emulation mode."""

from __future__ import annotations

import json

import pytest

from pipeswift_slurm.submit import launcher
from pipeswift_slurm.submit.launcher import Allocation
from pipeswift_slurm.core.megatron import parse_argv
from pipeswift_slurm.core.megatron_rules import check_config, enumerate_configs
from pipeswift_slurm.core.token import ProfileRequest, encode_decision, encode_profile

MEGATRON = ["pretrain_gpt.py", "--num-layers", "8", "--hidden-size", "512", "--num-attention-heads", "8",
            "--seq-length", "1024", "--micro-batch-size", "2", "--global-batch-size", "32",
            "--pipeline-model-parallel-size", "2", "--train-iters", "100"]
TORCHRUN = ["torchrun", "--nnodes", "1", "--nproc_per_node", "2", "--node_rank", "0"] + MEGATRON


@pytest.mark.parametrize("env, expected", [
    ({"SLURM_JOB_NUM_NODES": "2", "SLURM_GPUS_ON_NODE": "4", "CUDA_VISIBLE_DEVICES": "0"}, (2, 4, "SLURM_GPUS_ON_NODE")),
    ({"SLURM_NNODES": "1", "SLURM_JOB_GPUS": "0,1,2"}, (1, 3, "SLURM_JOB_GPUS")),
    ({"CUDA_VISIBLE_DEVICES": "0,1"}, (1, 2, "CUDA_VISIBLE_DEVICES")),
    ({"SLURM_JOB_NUM_NODES": "2", "SLURM_GPUS_PER_NODE": "a100:8"}, (2, 8, "SLURM_GPUS_PER_NODE")),
    ({"SLURM_JOB_NUM_NODES": "2", "SLURM_GPUS": "8"}, (2, 4, "SLURM_GPUS")),
    ({"SLURM_TRES_PER_TASK": "gres/gpu:2", "SLURM_NTASKS_PER_NODE": "2"}, (1, 4, "SLURM_TRES_PER_TASK")),
    # a value that is no count is none (its trailing digits were read: 1e3 nodes was 3)
    ({"SLURM_JOB_NUM_NODES": "1e3", "SLURM_NNODES": "2", "SLURM_GPUS_ON_NODE": "4"}, (2, 4, "SLURM_GPUS_ON_NODE")),
    ({"SLURM_GPUS_ON_NODE": "-8", "SLURM_JOB_GPUS": "0,1"}, (1, 2, "SLURM_JOB_GPUS")),
    ({"SLURM_GPUS_PER_NODE": "a100:-8", "SLURM_GPUS": "gpu:3"}, (1, 3, "SLURM_GPUS")),
])
def test_allocation_from_env(env, expected):
    alloc = launcher.allocation_from_env(env)
    assert (alloc.num_nodes, alloc.gpus_per_node, alloc.source) == expected


def test_allocation_without_gpus_is_an_error():
    with pytest.raises(launcher.LaunchError, match="--local-gpus"):
        launcher.allocation_from_env({"SLURM_JOB_ID": "3", "CUDA_VISIBLE_DEVICES": "NoDevFiles"})


def test_a_count_of_thousands_of_digits_is_no_count():
    """int() refuses 4,300 digits and more: such a value was a traceback before the command ran."""
    huge = "9" * 5000
    with pytest.raises(launcher.LaunchError, match="no GPU count"):
        launcher.allocation_from_env({"SLURM_GPUS_ON_NODE": huge, "SLURM_TRES_PER_TASK": "gres/gpu:" + huge})
    alloc = launcher.allocation_from_env({"SLURM_JOB_ID": huge, "SLURM_JOB_NUM_NODES": huge, "SLURM_GPUS_ON_NODE": "4"})
    assert (alloc.job_id, alloc.num_nodes, alloc.gpus_per_node) == (None, 1, 4)


@pytest.mark.parametrize("env, fault", [
    ({}, None),  # no GPU count: the job is not lost for it
    ({"SLURM_GPUS_ON_NODE": "2"}, RuntimeError("a fault no check foresaw")),
])
def test_a_job_that_cannot_be_planned_runs_its_command_as_written(env, fault, capsys, monkeypatch):
    if fault is not None:
        monkeypatch.setattr(launcher, "choose", lambda *a: (_ for _ in ()).throw(fault))
    seen = []
    code = launcher.launch(["--"] + TORCHRUN, env, run=lambda a: "", execvp=lambda f, a: seen.append(a))
    assert code == 0 and seen == [TORCHRUN]
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "running the command unchanged" in err


def test_a_command_that_cannot_start_is_one_line_and_127_when_measured_too(tmp_path, capsys):
    env = {"SLURM_JOB_ID": "5", "SLURM_GPUS_ON_NODE": "1", "PIPESWIFT_MEASURE_DIR": str(tmp_path)}
    missing = [str(tmp_path / "bin" / "python3")] + MEGATRON  # measured: run as a child, not exec'd
    assert launcher.launch(["--"] + missing, env, run=lambda a: "",
                           execvp=lambda *a: pytest.fail("exec'd: nothing measured")) == 127
    planned, failed = capsys.readouterr().err.splitlines()
    assert planned.startswith("pipeswift-launch: running ") and "error: cannot run %s" % missing[0] in failed


def _runner(admin: str = "", comment: str = "", job_id: int = 7):
    """A fake squeue --json (22.05 lists every job, ours among them)."""
    payload = {"jobs": [{"job_id": 1, "admin_comment": "pswift-decision1;tp=8", "comment": ""},
                        {"job_id": job_id, "admin_comment": admin, "comment": comment}]}
    calls = []

    def run(argv):
        calls.append(list(argv))
        return json.dumps(payload)
    run.calls = calls  # type: ignore[attr-defined]
    return run


def _profile(alloc: Allocation):
    return launcher.job_profile(TORCHRUN, ProfileRequest(()), alloc)


def _valid_other(alloc: Allocation):
    """A valid config for the allocation, not the first one enumerated."""
    return list(enumerate_configs(_profile(alloc), alloc.gpus, alloc.gpus_per_node))[-1]


ALLOCS = [Allocation(1, 4, 7), Allocation(2, 4, 7), Allocation(1, 2, 7), Allocation(1, 8, 7)]


def _decisions(alloc: Allocation):
    good = _valid_other(alloc)
    wrong = Allocation(alloc.num_nodes, alloc.gpus_per_node * 2, 7)
    stale = next(enumerate_configs(_profile(wrong), wrong.gpus, wrong.gpus_per_node))
    forged = encode_decision(good, 1700000000)
    return {
        "valid": (encode_decision(good, 1700000000), "", good),
        "stale": (encode_decision(stale, 1700000000), "", None),
        "forged_in_comment": ("", "note " + forged, None),
        "missing": ("", "", None),
        "malformed": ("pswift-decision1;tp=x;pp=2", "", None),
        "invalid_for_job": (encode_decision(good.__class__(**{**good.__dict__, "micro_batch_size": 3}), 1), "", None),
    }


@pytest.mark.parametrize("alloc", ALLOCS, ids=lambda a: "%dx%d" % (a.num_nodes, a.gpus_per_node))
@pytest.mark.parametrize("case", ["valid", "stale", "forged_in_comment", "missing", "malformed", "invalid_for_job"])
def test_decisions_always_end_in_a_valid_config(alloc, case):
    admin, comment, expected = _decisions(alloc)[case]
    cfg, profile, why = launcher.choose(TORCHRUN, alloc, {}, _runner(admin, comment))
    assert cfg is not None and profile is not None
    assert check_config(profile, cfg, alloc.gpus_per_node) == []
    assert (cfg.num_nodes, cfg.gpus_per_node) == (alloc.num_nodes, alloc.gpus_per_node)
    if expected is not None:
        assert cfg == expected and why.startswith("decision from controller at 2023-11-14T22:13:20Z")
    else:
        assert "best for the allocation" in why


def test_comment_request_limits_the_search_but_never_decides():
    alloc = Allocation(1, 4, 7)
    request = encode_profile(ProfileRequest((), allowed_pp=(4,), min_micro_batch_size=2))
    cfg, _, _ = launcher.choose(TORCHRUN, alloc, {}, _runner("", request))
    assert cfg is not None and cfg.pp == 4 and cfg.micro_batch_size >= 2
    cfg, _, _ = launcher.choose(TORCHRUN, alloc, {}, _runner("", request.replace("pp=4", "pp=1")))
    assert cfg is not None and cfg.pp == 1


def test_launch_execs_rewritten_argv(capsys):
    env = {"SLURM_JOB_ID": "7", "SLURM_JOB_NUM_NODES": "1", "SLURM_GPUS_ON_NODE": "4"}
    alloc = Allocation(1, 4, 7)
    good = _valid_other(alloc)
    run = _runner(encode_decision(good, 1700000000))
    seen = []
    rc = launcher.launch(["--"] + TORCHRUN, env, run=run, execvp=lambda f, a: seen.append((f, a)))
    assert rc == 0 and run.calls == [["squeue", "--json", "-j", "7"]]
    file, argv = seen[0]
    assert file == "torchrun" and argv[:4] == ["torchrun", "--nnodes=1", "--nproc-per-node=4", "--node-rank=0"]
    values = parse_argv(argv).values
    assert values["--pipeline-model-parallel-size"] == good.pp
    assert values["--micro-batch-size"] == good.micro_batch_size
    assert values["--global-batch-size"] == 32
    err = capsys.readouterr().err
    assert err == ("pipeswift-launch: running %s (decision from controller at 2023-11-14T22:13:20Z);"
                   " torchrun: 4 processes = 1 node(s) x 4\n" % good.short())


def test_local_mode_and_emulation(capsys):
    slept = []
    rc = launcher.launch(["--emulate", "--local-gpus", "2", "--"] + MEGATRON, {"PIPESWIFT_EMULATE_SCALE": "1e-6"},
                         run=_runner(), execvp=lambda f, a: pytest.fail("emulation must not exec"),
                         sleep=slept.append)
    assert rc == 0 and len(slept) == 1 and 0 < slept[0] < 1
    err = capsys.readouterr().err.splitlines()
    assert err[0].startswith("pipeswift-launch: running 2gpu=1x2 ") and "(no decision: best for the allocation by the cost model alone)" in err[0]
    assert err[1].startswith("pipeswift-launch: emulating: predicted ")


@pytest.mark.parametrize("value, emulates, warns", [
    ("1", True, False), ("TRUE", True, False), ("yes", True, False), ("on", True, False),
    ("", False, False), ("0", False, False), ("false", False, False), ("No", False, False), ("off", False, False),
    ("maybe", False, True), ("2", False, True),
])
def test_only_a_yes_emulates(capsys, value, emulates, warns):
    """PIPESWIFT_EMULATE=false used to replace the training by a sleep that exits 0."""
    assert launcher.parse_options(["--", "python", "t.py"], {"PIPESWIFT_EMULATE": value}).emulate is emulates
    assert ("is not 1/true/yes/on or 0/false/no/off; running the training" in capsys.readouterr().err) is warns


@pytest.mark.parametrize("value, scale", [("1e-6", 1e-6), ("0", 0.0), ("", 0.001), ("inf", 0.001),
                                          ("1e308", 0.001), ("nan", 0.001), ("-1", 0.001), ("x", 0.001)])
def test_the_emulation_scale_is_a_bounded_number(capsys, value, scale):
    assert launcher.emulate_scale({"PIPESWIFT_EMULATE_SCALE": value}) == scale
    assert ("is not a number in 0..1000; using 0.001" in capsys.readouterr().err) is (scale == 0.001 and value != "")


def test_non_megatron_command_runs_unchanged(capsys):
    seen = []
    launcher.launch(["--local-gpus=2", "--", "python", "train.py", "--lr", "1"], {}, execvp=lambda f, a: seen.append(a))
    assert seen == [["python", "train.py", "--lr", "1"]]
    assert "running the command unchanged" in capsys.readouterr().err


@pytest.mark.parametrize("argv", [[], ["--"], ["--bogus", "--", "x"], ["--local-gpus", "0", "--", "x"],
                                  ["--local-gpus", "\u00b2", "--", "x"],  # isdigit(), and int() refused it
                                  ["--local-gpus=99999999999999999999", "--", "x"]])
def test_usage_errors(argv):
    with pytest.raises(launcher.LaunchError):
        launcher.parse_options(argv, {})


def test_read_job_comments_ignores_other_jobs_and_bad_json():
    assert launcher.read_job_comments(7, _runner("A", "C")) == ("A", "C")
    assert launcher.read_job_comments(99, _runner("A", "C")) == ("", "")
    assert launcher.read_job_comments(7, lambda argv: "not json") == ("", "")


def test_a_form_the_launcher_cannot_set_runs_exactly_as_written(capsys):
    env = {"SLURM_JOB_ID": "7", "SLURM_JOB_NUM_NODES": "2", "SLURM_GPUS_ON_NODE": "8"}
    command = ["deepspeed", "--num_gpus", "1"] + MEGATRON
    seen = []
    launcher.launch(["--"] + command, env, run=_runner(), execvp=lambda f, a: seen.append(a))
    assert seen == [command]
    assert "deepspeed is not a launcher pipeswift-launch can set" in capsys.readouterr().err


def test_a_single_node_torchrun_grown_to_two_nodes_runs_on_both(capsys):
    env = {"SLURM_JOB_ID": "7", "SLURM_JOB_NUM_NODES": "2", "SLURM_GPUS_ON_NODE": "8"}
    seen = []
    launcher.launch(["--", "torchrun", "--nproc_per_node", "4"] + MEGATRON, env, run=_runner(),
                    execvp=lambda f, a: seen.append(a))
    argv = seen[0]
    assert argv[:4] == ["srun", "--nodes=2", "--ntasks=2", "--ntasks-per-node=1"]
    assert argv[4:7] == ["torchrun", "--nnodes=2", "--nproc-per-node=8"]
    assert "torchrun: 16 processes = 2 node(s) x 8" in capsys.readouterr().err
