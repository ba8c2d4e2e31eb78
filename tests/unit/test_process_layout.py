"""submit.layout: every launcher form the launcher accepts starts exactly one process per
allocated GPU on every allocated node (issue 28, item 3), and unknown forms are refused."""

from __future__ import annotations

import pytest

from pipeswift_slurm.submit.layout import LayoutError, Target, set_processes

ARGS = ["pretrain_gpt.py", "--num-layers", "8"]


def _value(words: list[str], flag: str) -> str:
    for i, w in enumerate(words):
        name, eq, value = w.partition("=")
        if name == flag:
            return value if eq else words[i + 1]
    raise AssertionError("%s not in %s" % (flag, words))


def _processes(words: list[str]) -> int:
    """How many processes the command starts: srun tasks x torchrun processes per task."""
    tasks = int(_value(words, "--ntasks")) if words[0] == "srun" else 1
    torch_at = next((i for i, w in enumerate(words) if w in ("torchrun", "torch.distributed.run", "torch.distributed.launch")), None)
    if torch_at is None:
        return tasks
    nodes = int(_value(words[torch_at:], "--nnodes"))
    per_node = int(_value(words[torch_at:], "--nproc-per-node"))
    assert tasks == nodes, "one torchrun per node"
    return nodes * per_node


FORMS = [
    ["torchrun", "--nproc_per_node", "4"] + ARGS,
    ["torchrun", "--nnodes=1", "--nproc-per-node=4", "--node_rank", "0", "--master_addr", "h", "--master_port",
     "1234"] + ARGS,
    ["torchrun", "--standalone", "--nproc_per_node=2"] + ARGS,
    ["python3", "-m", "torch.distributed.run", "--nproc-per-node=1"] + ARGS,
    ["python", "-u", "-m", "torch.distributed.launch", "--nproc_per_node", "2", "--use-env"] + ARGS,
    ["python"] + ARGS,
    ["python3.11", "-u"] + ARGS,
    ["python", "-X", "faulthandler", "-Wignore", "-O"] + ARGS,
    ["srun", "-l", "torchrun", "--nproc_per_node", "4"] + ARGS,
    ["srun", "--ntasks-per-node=4", "python"] + ARGS,
    ["srun", "-N", "1", "-n", "4", "python3"] + ARGS,
    list(ARGS),  # the script run directly
]


@pytest.mark.parametrize("nodes, per_node", [(1, 1), (1, 4), (1, 8), (2, 8), (4, 4), (3, 2)])
@pytest.mark.parametrize("command", FORMS, ids=lambda c: " ".join(c[:4]))
def test_every_form_starts_one_process_per_allocated_gpu(command, nodes, per_node):
    out = set_processes(command, Target(nodes, per_node, "batchhost", 42)).command
    assert _processes(out) == nodes * per_node, out
    assert out[-len(ARGS):] == ARGS  # the program and its arguments are untouched
    if nodes > 1:
        assert out[0] == "srun" and _value(out, "--nodes") == str(nodes)
        if "torchrun" in out or "torch.distributed.run" in out or "torch.distributed.launch" in out:
            assert "--rdzv-endpoint=batchhost:29500" in out and "--rdzv-id=42" in out
            assert not any(w.startswith(("--node-rank", "--node_rank", "--master")) for w in out)


def test_a_single_process_stays_a_plain_python():
    assert set_processes(["python"] + ARGS, Target(1, 1)).command == ["python"] + ARGS


def test_single_node_keeps_the_users_rendezvous():
    command = ["torchrun", "--nproc_per_node=1", "--master_addr=127.0.0.1", "--master_port=2999"] + ARGS
    out = set_processes(command, Target(1, 2)).command
    assert out == ["torchrun", "--nnodes=1", "--nproc-per-node=2", "--master-addr=127.0.0.1",
                   "--master-port=2999"] + ARGS


@pytest.mark.parametrize("command", [
    ["deepspeed"] + ARGS,
    ["bash", "-c", "torchrun pretrain_gpt.py"],
    ["mpirun", "-np", "8", "python"] + ARGS,
    ["srun", "--weird-option", "torchrun"] + ARGS,
    ["torchrun", "--unknown-flag", "3"] + ARGS,
    ["srun"],
    ["torchrun", "--nnodes"],
    # python's own forms whose program the rewrite would misplace (found by fuzzing: -c CODE
    # became "python -c -m torch.distributed.run ... CODE")
    ["python", "-c", "import runpy; runpy.run_path('pretrain_gpt.py')"] + ARGS,
    ["python", "--", "pretrain_gpt.py"] + ARGS,
    ["python", "-", "--num-layers", "2"],
    ["python", "-um", "megatron.pretrain"] + ARGS,
    ["python", "-u", "-m"],
    ["python", "-u"],
])
def test_forms_it_cannot_read_are_refused(command):
    with pytest.raises(LayoutError):
        set_processes(command, Target(2, 8))
