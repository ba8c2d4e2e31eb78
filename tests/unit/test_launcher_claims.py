"""Issue 23, claims meet reality in the launcher: the controller plans from the request in the
job's Comment, the launcher runs the job's own command. When the command's model shape,
global batch or training length differ from the request's, the launcher applies no decision
and runs the user's command unchanged, with one warning; when only the layout differs (the
controller's to choose), the decision applies as before."""

from __future__ import annotations

import json

import pytest

from pipeswift_slurm.core.megatron_rules import enumerate_configs
from pipeswift_slurm.core.token import ProfileRequest, encode_decision, encode_profile
from pipeswift_slurm.submit import launcher
from pipeswift_slurm.submit.launcher import Allocation

ARGS = ["--num-layers", "8", "--hidden-size", "512", "--num-attention-heads", "8", "--seq-length", "1024",
        "--micro-batch-size", "2", "--global-batch-size", "32", "--pipeline-model-parallel-size", "2",
        "--train-iters", "100"]
COMMAND = ["torchrun", "--nnodes", "1", "--nproc_per_node", "2", "--node_rank", "0", "pretrain_gpt.py", *ARGS]
ALLOC = Allocation(1, 4, 7)
ENV = {"SLURM_JOB_ID": "7", "SLURM_JOB_NUM_NODES": "1", "SLURM_GPUS_ON_NODE": "4"}


def claimed(flag: str, value: str) -> list[str]:
    argv = list(ARGS)
    argv[argv.index(flag) + 1] = value
    return argv


def runner(request_argv: list[str]):  # type: ignore[no-untyped-def]
    profile = launcher.job_profile(COMMAND, ProfileRequest(()), ALLOC)
    decision = encode_decision(list(enumerate_configs(profile, ALLOC.gpus, ALLOC.gpus_per_node))[-1], 1700000000)
    comment = encode_profile(ProfileRequest(tuple(request_argv), gpus=(2, 4)))
    payload = {"jobs": [{"job_id": 7, "admin_comment": decision, "comment": comment}]}
    return lambda argv: json.dumps(payload)


@pytest.mark.parametrize("request_argv, differs", [
    (claimed("--train-iters", "1"), "train_iters 1 in the request, 100 in the command"),
    (claimed("--global-batch-size", "8"), "global_batch_size 8 in the request, 32 in the command"),
    (claimed("--num-layers", "2"), "num_layers 2 in the request, 8 in the command"),
    (claimed("--seq-length", "128") + ["--max-position-embeddings", "1024"], "seq_length 128"),
    (["--num-layers", "8", "--hidden-size", "512", "--num-attention-heads", "8", "--seq-length", "1024",
      "--global-batch-size", "32", "--train-samples", "3200"], "train_samples 3200 in the request, None"),
])
def test_a_command_that_trains_more_than_its_request_runs_unchanged_with_a_warning(
        request_argv: list[str], differs: str, capsys: pytest.CaptureFixture[str]) -> None:
    seen: list[tuple[str, list[str]]] = []
    rc = launcher.launch(["--", *COMMAND], ENV, run=runner(request_argv), execvp=lambda f, a: seen.append((f, a)))
    assert rc == 0 and seen == [("torchrun", COMMAND)]
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].startswith("pipeswift-launch: warning: the command is not what the job's request")
    assert differs in err[0] and "no decision is applied" in err[0]


@pytest.mark.parametrize("request_argv", [
    ARGS,
    claimed("--pipeline-model-parallel-size", "1"),   # the layout: the controller's to choose
    claimed("--micro-batch-size", "1"),
    ["--tag", "x", *ARGS],
])
def test_the_same_claim_in_another_layout_takes_the_decision(request_argv: list[str],
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    seen: list[tuple[str, list[str]]] = []
    launcher.launch(["--", *COMMAND], ENV, run=runner(request_argv), execvp=lambda f, a: seen.append((f, a)))
    err = capsys.readouterr().err
    assert "decision from controller" in err and "warning" not in err
    assert seen and seen[0][1] != COMMAND
