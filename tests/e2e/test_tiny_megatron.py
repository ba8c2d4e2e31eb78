"""A real megatron-core pipeline on CPU: the layout the flags ask for is the one that ran, and
pipelining does not change the numbers (same initial weights, same data -> same losses)."""

from __future__ import annotations

import pytest
from tiny_megatron import megatron_missing, parse_log, run_tiny

pytestmark = [pytest.mark.megatron, pytest.mark.e2e]

_MISSING = megatron_missing()
if _MISSING:
    print(f"skipping tiny Megatron e2e tests: {_MISSING}")
    pytest.skip(_MISSING, allow_module_level=True)

BASE = ["--num-layers", "4", "--hidden-size", "64", "--num-attention-heads", "4",
        "--seq-length", "32", "--max-position-embeddings", "32", "--vocab-size", "128",
        "--micro-batch-size", "2", "--global-batch-size", "8", "--train-iters", "3",
        "--lr", "1e-3", "--seed", "1234"]
ONE_F_ONE_B = "forward_backward_pipelining_without_interleaving"


def _check(result):
    assert result.returncode == 0, f"trainer failed:\n{result.stdout[-2000:]}\n{result.stderr[-4000:]}"
    return result


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """PP=1 on one process; saves the initial weights that the other layouts load."""
    init = tmp_path_factory.mktemp("tiny_megatron") / "init.pt"
    result = _check(run_tiny([*BASE, "--save-init", str(init), "--bf16"], nproc=1))
    return init, result


def test_reference_run_is_unpipelined(reference):
    _, result = reference
    assert result.run_info["pp"] == 1
    assert result.run_info["schedule"] == "forward_backward_no_pipelining"
    assert result.run_info["num_micro_batches"] == 4
    assert len(result.losses) == 3


def test_pp2_runs_1f1b_and_matches_pp1(reference):
    init, ref = reference
    result = _check(run_tiny([*BASE, "--pipeline-model-parallel-size", "2", "--load-init", str(init),
                              "--use-distributed-optimizer"], nproc=2))
    info = result.run_info
    assert (info["pp"], info["vp"], info["dp"], info["tp"]) == (2, 1, 1, 1)
    assert info["schedule"] == ONE_F_ONE_B
    assert info["num_micro_batches"] == 8 // (2 * 1)
    assert info["world_size"] == 2
    assert result.losses == pytest.approx(ref.losses, abs=1e-5)


def test_pp2_interleaved_matches_pp1(reference):
    init, ref = reference
    argv = [*BASE, "--pipeline-model-parallel-size", "2", "--num-layers-per-virtual-pipeline-stage", "1",
            "--load-init", str(init)]
    result = _check(run_tiny(argv, nproc=2))
    assert (result.run_info["pp"], result.run_info["vp"]) == (2, 2)
    assert result.run_info["schedule"] == "forward_backward_pipelining_with_interleaving"
    assert result.losses == pytest.approx(ref.losses, abs=1e-5)


def test_dp2_splits_the_global_batch(reference):
    init, ref = reference
    result = _check(run_tiny([*BASE, "--load-init", str(init)], nproc=2))
    assert (result.run_info["dp"], result.run_info["num_micro_batches"]) == (2, 2)
    assert result.losses == pytest.approx(ref.losses, abs=1e-5)


def test_parse_log_reads_prefixed_lines():
    text = ('0: PIPESWIFT_RUN {"pp": 2, "schedule": "x"}\nnoise\n'
            '1: PIPESWIFT_LOSS {"iteration": 1, "loss": 2.5}\n1: PIPESWIFT_LOSS {"iteration": 0, "loss": 3.0}\n')
    assert parse_log(text) == ({"pp": 2, "schedule": "x"}, [3.0, 2.5])
