"""Shared fixtures for every test layer.

Keep the names stable: other test modules rely on ``gpt_argv``, ``profile``, ``a100``,
``cost``, ``tiny_cluster`` and ``clock``.
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from pipeswift_slurm.core import hardware
from pipeswift_slurm.core import megatron
from pipeswift_slurm.core import model
from pipeswift_slurm.core.costmodel import CostModel

GPT_ARGV = (
    "--num-layers", "24", "--hidden-size", "2048", "--num-attention-heads", "16",
    "--seq-length", "2048", "--max-position-embeddings", "2048",
    "--global-batch-size", "512", "--bf16", "--train-iters", "1000",
)


@pytest.fixture
def gpt_argv() -> list[str]:
    """A small GPT-style Megatron command line (24 layers, h=2048, a=16, s=2048, gbs=512)."""
    return list(GPT_ARGV)


@pytest.fixture
def profile(gpt_argv: list[str]) -> model.JobProfile:
    """``gpt_argv`` parsed as submitted: tp=pp=cp=dp=1, micro batch 1, M=512."""
    return megatron.profile_from_argv(gpt_argv)


@pytest.fixture
def a100() -> hardware.GpuType:
    return hardware.get_gpu_type("A100-80GB")


@pytest.fixture
def cost(a100: hardware.GpuType) -> CostModel:
    return CostModel(a100)


@pytest.fixture
def tiny_cluster() -> model.ClusterView:
    """Two idle nodes of 8 GPUs each, no jobs, at time 0."""
    nodes = (model.Node("node01", gpus=8), model.Node("node02", gpus=8))
    return model.ClusterView(now=0, nodes=nodes, jobs=())


@dataclass
class Clock:
    """A settable clock (seconds): read ``now`` or call it; ``advance`` moves it forward."""

    now: float = 0.0

    def __call__(self) -> float:
        return self.now

    def set(self, now: float) -> None:
        self.now = now

    def advance(self, seconds: float) -> float:
        self.now += seconds
        return self.now


@pytest.fixture
def clock() -> Clock:
    return Clock()
