"""The ``estimate`` and ``plan`` commands: text and JSON output, and bad input (one error
line naming the flag, exit code 2, never a traceback)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from pipeswift_slurm.cli.main import pipeswift

ESTIMATE_KEYS = {"gpus", "config", "iter_time_s", "tflops_per_gpu", "mem_gib", "fits", "bubble_fraction",
                 "num_micro_batches", "data_parallel_size", "job_time_s", "error_band", "error_band_group",
                 "gpu_type", "gpu_type_source"}
PLAN_KEYS = {"gpu_type", "gpu_type_source", "gpus", "valid_configs", "configs", "no_layout", "user_layout_kept",
             "excluded"}
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def runner() -> CliRunner:
    return CliRunner()


def invoke(runner: CliRunner, *args: str) -> Result:
    return runner.invoke(pipeswift, list(args), catch_exceptions=False)


def layout_argv(gpt_argv: list[str]) -> list[str]:
    return gpt_argv + ["--tensor-model-parallel-size", "2", "--pipeline-model-parallel-size", "2"]


def test_estimate_text(runner: CliRunner, gpt_argv: list[str]) -> None:
    result = invoke(runner, "estimate", "--num-gpus", "8", "--", *layout_argv(gpt_argv))
    assert result.exit_code == 0, result.output
    out = result.stdout
    for label in ("config", "gpu type", "iteration time", "model TFLOP/s per GPU", "memory per GPU",
                  "bubble fraction", "micro-batches (M)", "data-parallel size", "job time"):
        assert label in out, label
    assert "tp2 pp2 dp2" in out and "A100-80GB" in out
    assert "1000 iterations" in out
    assert result.stderr == ""


def test_estimate_json(runner: CliRunner, gpt_argv: list[str]) -> None:
    result = invoke(runner, "estimate", "--num-gpus", "8", "--gpu-type", "h100-80gb", "--json", "--",
                    *layout_argv(gpt_argv))
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert set(data) == ESTIMATE_KEYS
    assert data["gpus"] == 8 and data["gpu_type"] == "H100-80GB" and data["gpu_type_source"] == "--gpu-type"
    assert (data["config"]["tp"], data["config"]["pp"], data["config"]["dp"]) == (2, 2, 2)
    assert data["data_parallel_size"] == 2 and data["num_micro_batches"] == 256
    assert data["fits"] is True and 0 < data["mem_gib"] < 80
    assert 0 < data["bubble_fraction"] < 1 and data["iter_time_s"] > 0 and data["tflops_per_gpu"] > 0
    assert data["job_time_s"] > 1000 * data["iter_time_s"]  # plus the startup


def test_estimate_reports_a_config_that_does_not_fit(runner: CliRunner) -> None:
    big = ["--num-layers", "80", "--hidden-size", "8192", "--num-attention-heads", "64", "--seq-length", "2048",
           "--global-batch-size", "512", "--bf16", "--train-iters", "10"]
    text = invoke(runner, "estimate", "--", *big)
    assert text.exit_code == 1 and "DOES NOT FIT" in text.stdout
    as_json = invoke(runner, "estimate", "--json", "--", *big)
    data = json.loads(as_json.stdout)
    assert data["fits"] is False and data["mem_gib"] > 80 and as_json.exit_code == 1  # as docs/json.md says
    assert "Exits 1 when the config does not fit" in invoke(runner, "estimate", "--help").stdout


@pytest.mark.parametrize("command", [["estimate"], ["plan", "--gpus", "8"]])
def test_flags_the_cost_model_does_not_read_are_named(runner: CliRunner, gpt_argv: list[str], command) -> None:
    result = invoke(runner, *command, "--", *gpt_argv, "--foo", "3", "--lr=1e-4", "--foo", "4")
    assert result.exit_code == 0, result.output
    [warning] = [line for line in result.stderr.splitlines() if line.startswith("warning:")]
    assert warning == "warning: not read by the cost model (no effect on this answer): --foo --lr"
    clean = invoke(runner, *command, "--", *gpt_argv)
    assert "warning:" not in clean.stderr


def test_plan_json_top_3(runner: CliRunner, gpt_argv: list[str]) -> None:
    result = invoke(runner, "plan", "--gpus", "4-16", "--json", "--top", "3", "--", *gpt_argv)
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert set(data) == PLAN_KEYS - {"excluded"}  # only with --explain (it would always be empty)
    assert data["gpu_type"] == "A100-80GB" and data["gpus"] == [4, 16]
    assert len(data["configs"]) == 3 and data["valid_configs"] > 3
    times = [row["iter_time_s"] for row in data["configs"]]
    assert times == sorted(times)
    for row in data["configs"]:
        assert set(row) == ESTIMATE_KEYS - {"gpu_type", "gpu_type_source"} | {"chosen"}
        assert 4 <= row["gpus"] <= 16 and row["fits"] is True
        cfg = row["config"]
        assert cfg["tp"] * cfg["pp"] * cfg["cp"] * cfg["dp"] == row["gpus"]
        assert 24 % cfg["pp"] == 0


def test_plan_text_and_explain(runner: CliRunner, gpt_argv: list[str]) -> None:
    result = invoke(runner, "plan", "--gpus", "5-6", "--explain", "--top", "2", "--", *gpt_argv)
    assert result.exit_code == 0, result.output
    out = result.stdout
    assert "valid configs on A100-80GB" in out
    assert "excluded (" in out
    assert "gpus=5" in out and "cannot be split over 5 pipeline stages" in out


def test_plan_explain_json_lists_reasons(runner: CliRunner, gpt_argv: list[str]) -> None:
    result = invoke(runner, "plan", "--gpus", "25", "--json", "--explain", "--", *gpt_argv)
    data = json.loads(result.stdout)
    assert data["valid_configs"] == 0 and data["configs"] == [] and result.exit_code == 1  # none valid: 1
    assert data["excluded"] and all(x["reason"] and x["gpus"] == 25 for x in data["excluded"])


def test_plan_with_no_valid_config_fails_politely(runner: CliRunner, gpt_argv: list[str]) -> None:
    result = invoke(runner, "plan", "--gpus", "25", "--", *gpt_argv)
    assert result.exit_code == 1
    assert "no valid config" in result.stderr and "Traceback" not in result.output


def test_plan_names_the_rule_not_memory_when_divisibility_excludes_a_count(runner: CliRunner,
                                                                           gpt_argv: list[str]) -> None:
    """24 layers and a global batch of 512 have no split over 25 or 27 GPUs (5 or 7 run as 5 or 7
    uneven stages): the rules say so."""
    result = invoke(runner, "plan", "--gpus", "24-27", "--", *gpt_argv)
    assert result.exit_code == 0
    line = next(x for x in result.stdout.splitlines() if x.startswith("no valid layout"))
    assert line.startswith("no valid layout on 25, 27 GPUs: every tp x pp x dp split breaks a Megatron rule")
    assert "global batch 512 not divisible" in line and "24 layers not divisible" in line
    assert "memory" not in line
    data = json.loads(invoke(runner, "plan", "--gpus", "24-27", "--json", "--", *gpt_argv).stdout)
    assert [x["gpus"] for x in data["no_layout"]] == [[25, 27]]


def test_plan_names_a_few_counts_without_a_layout_and_counts_the_rest(runner: CliRunner,
                                                                       gpt_argv: list[str]) -> None:
    """A wide range names the first counts of each cause and how many more there are (the
    line for 1-2048 was 5 KB); --json lists every one."""
    result = invoke(runner, "plan", "--gpus", "1-2048", "--top", "1", "--", *gpt_argv)
    assert result.exit_code == 0
    lines = [x for x in result.stdout.splitlines() if x.startswith("no valid layout")]
    data = json.loads(invoke(runner, "plan", "--gpus", "1-2048", "--json", "--", *gpt_argv).stdout)
    assert len(lines) == len(data["no_layout"]) >= 1
    for line, group in zip(lines, data["no_layout"]):
        head = line.split(":")[0]
        assert len(head) < 400
        if " more counts" in head:
            named = head.split(" GPUs and ")[0].removeprefix("no valid layout on ")
            shown = sum(int(b) - int(a) + 1 if a else 1 for a, _, b in
                        (w.partition("-") if "-" in w else ("", "", w) for w in named.split(", ")))
            more = int(head.split(" GPUs and ")[1].split(" more")[0].replace(",", ""))
            assert shown + more == len(group["gpus"]) and more > 0
    assert any(" more counts (--json lists them)" in x for x in lines)


def test_plan_says_memory_when_memory_is_the_cause(runner: CliRunner) -> None:
    big = ["--num-layers", "80", "--hidden-size", "8192", "--num-attention-heads", "64", "--seq-length", "2048",
           "--global-batch-size", "64", "--bf16", "--train-iters", "10"]
    result = invoke(runner, "plan", "--gpus", "1-2", "--", *big)
    assert result.exit_code == 1
    assert "no valid layout on 1, 2 GPUs: memory: the smallest valid layout needs" in result.stderr
    assert "A100-80GB has 80 GiB per GPU" in result.stderr


def test_estimate_and_plan_say_which_gpu_type_they_assume(runner: CliRunner, gpt_argv: list[str],
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PIPESWIFT_GPU_TYPE", raising=False)
    out = invoke(runner, "estimate", "--", *gpt_argv).stdout
    assert "A100-80GB (default; --gpu-type or PIPESWIFT_GPU_TYPE to change)" in out
    out = invoke(runner, "plan", "--gpus", "8", "--top", "1", "--", *gpt_argv).stdout
    assert out.splitlines()[0] == "GPU type: A100-80GB (default; --gpu-type or PIPESWIFT_GPU_TYPE to change)"
    out = invoke(runner, "plan", "--gpus", "8", "--gpu-type", "h100-80gb", "--", *gpt_argv).stdout
    assert out.splitlines()[0] == "GPU type: H100-80GB (from --gpu-type)"
    monkeypatch.setenv("PIPESWIFT_GPU_TYPE", "H100-80GB")
    data = json.loads(invoke(runner, "estimate", "--json", "--", *gpt_argv).stdout)
    assert (data["gpu_type"], data["gpu_type_source"]) == ("H100-80GB", "PIPESWIFT_GPU_TYPE")


def _without(argv: list[str], flag: str) -> list[str]:
    i = argv.index(flag)
    return argv[:i] + argv[i + 2:]


BAD_INPUT = {
    "unknown gpu type": (["estimate", "--gpu-type", "X100-1TB", "--"], None, "--gpu-type"),
    "non-integer layers": (["estimate", "--"], ("--num-layers", "abc"), "--num-layers"),
    "heads not divisible by tp": (["estimate", "--"], ("--tensor-model-parallel-size", "3"),
                                  "--tensor-model-parallel-size"),
    "missing shape flag": (["estimate", "--"], ("drop", "--hidden-size"), "--hidden-size"),
    "plan with non-integer layers": (["plan", "--gpus", "8", "--"], ("--num-layers", "abc"), "--num-layers"),
    "plan with bad gpu range": (["plan", "--gpus", "16-4", "--"], None, "--gpus"),
    "plan with unknown gpu type": (["plan", "--gpus", "8", "--gpu-type", "nope", "--"], None, "--gpu-type"),
}


def bad_argv(case: str, gpt_argv: list[str]) -> tuple[list[str], str]:
    head, change, flag = BAD_INPUT[case]
    megatron = list(gpt_argv)
    if change and change[0] == "drop":
        megatron = _without(megatron, change[1])
    elif change and change[0] in megatron:
        megatron[megatron.index(change[0]) + 1] = change[1]
    elif change:
        megatron += list(change)
    return head + megatron, flag


@pytest.mark.parametrize("case", sorted(BAD_INPUT))
def test_bad_input_is_one_line_naming_the_flag(runner: CliRunner, gpt_argv: list[str], case: str) -> None:
    args, flag = bad_argv(case, gpt_argv)
    result = runner.invoke(pipeswift, args)
    assert result.exit_code == 2, (result.output, result.exception)
    assert isinstance(result.exception, SystemExit)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert flag in lines[0], lines[0]
    assert "Traceback" not in result.output
    assert result.stdout == ""


def test_bad_input_through_a_real_process(gpt_argv: list[str]) -> None:
    args, flag = bad_argv("non-integer layers", gpt_argv)
    proc = subprocess.run([sys.executable, "-m", "pipeswift_slurm.cli", *args], cwd=REPO, capture_output=True,
                          text=True, timeout=60, check=False)
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and flag in lines[0] and "abc" in lines[0], proc.stderr
    assert proc.stdout == ""
