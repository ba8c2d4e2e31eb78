"""The cost model's terms beyond GEMM FLOPs (``core/overheads.py``): collective bandwidth
by ranks per node, what Megatron's overlap flags hide, and elementwise work."""

from dataclasses import replace

import pytest

from pipeswift_slurm.cli.model import unread_flags
from pipeswift_slurm.core.costmodel import CostModel
from pipeswift_slurm.core.hardware import get_gpu_type
from pipeswift_slurm.core.megatron import profile_from_argv
from pipeswift_slurm.core.model import ExecConfig, ModelShape
from pipeswift_slurm.core.overheads import (elementwise_fwd_values, exposed_s, group_bandwidth_gbps,
                                            tp_backward_exposed_s, tp_exposed_s)

H100 = get_gpu_type("H100-80GB")
OVERLAP = ["--overlap-grad-reduce", "--overlap-param-gather", "--tp-comm-overlap"]


def test_a_group_leaving_the_node_gets_one_nic_per_rank_it_has_there() -> None:
    assert group_bandwidth_gbps(H100, 8, 1, 8) == H100.nvlink_gbps  # one node
    assert group_bandwidth_gbps(H100, 16, 1, 8) == min(H100.nvlink_gbps, 8 * H100.inter_node_gbps)
    assert group_bandwidth_gbps(H100, 16, 4, 8) == 2 * H100.inter_node_gbps  # tp 4: 2 replicas per node
    assert group_bandwidth_gbps(H100, 16, 8, 8) == H100.inter_node_gbps  # tp 8: one per node
    assert group_bandwidth_gbps(H100, 16, 16, 8) == H100.inter_node_gbps  # tp x cp spans nodes
    assert group_bandwidth_gbps(H100, 4, 2, 0) == H100.nvlink_gbps  # no node size: the GPU type's


def test_an_overlapped_collective_exposes_what_its_window_cannot_hide() -> None:
    assert exposed_s(1.0, 0.3, 0.01) == pytest.approx(0.7)
    assert exposed_s(1.0, 5.0, 0.01) == 0.01  # the last bucket
    assert exposed_s(0.005, 5.0, 0.01) == 0.005
    assert tp_exposed_s(0.8, 4, 10.0) == pytest.approx(0.2)  # one of 4 ring steps
    assert tp_exposed_s(0.8, 4, 0.1) == pytest.approx(0.2 + 0.5)  # the rest beyond the GEMMs
    assert tp_exposed_s(0.8, 1, 0.0) == 0.0
    assert tp_backward_exposed_s(0.8, 10.0) == pytest.approx(0.4)
    assert tp_backward_exposed_s(0.8, 0.1) == pytest.approx(0.4 + 0.3)


def test_sequence_parallelism_splits_the_elementwise_work_of_the_norms_and_residuals() -> None:
    shape = ModelShape(num_layers=2, hidden_size=1000, num_attention_heads=10, seq_length=10,
                       ffn_hidden_size=4000, kv_channels=100, num_query_groups=10)
    cfg = ExecConfig(tp=4, pp=1, dp=1, micro_batch_size=2, num_micro_batches=1)
    assert elementwise_fwd_values(shape, cfg, False) == 20 * (10 * 1000 + 2 * 4000 / 4)
    assert elementwise_fwd_values(shape, cfg, True) == 20 * (10 * 1000 / 4 + 2 * 4000 / 4)
    swiglu = replace(shape, swiglu=True)
    assert elementwise_fwd_values(swiglu, replace(cfg, cp=2), True) == 10 * (10 * 1000 / 4 + 3 * 4000 / 4)


def _argv(extra: list[str]) -> list[str]:
    return ["--num-layers", "32", "--hidden-size", "6144", "--ffn-hidden-size", "24576", "--num-attention-heads", "48",
            "--group-query-attention", "--num-query-groups", "8", "--seq-length", "4096",
            "--max-position-embeddings", "4096", "--vocab-size", "256000", "--tensor-model-parallel-size", "2",
            "--micro-batch-size", "2", "--global-batch-size", "256", "--train-iters", "1", "--bf16",
            "--use-distributed-optimizer", "--sequence-parallel", *extra]


def test_the_overlap_flags_are_read_and_hide_communication() -> None:
    plain = profile_from_argv(_argv([]), world_size=64, gpus_per_node=8)
    flagged = profile_from_argv(_argv(OVERLAP), world_size=64, gpus_per_node=8)
    plan = flagged.plan
    assert plan.overlap_grad_reduce and plan.overlap_param_gather and plan.tp_comm_overlap
    assert not (plain.plan.overlap_grad_reduce or plain.plan.overlap_param_gather or plain.plan.tp_comm_overlap)
    assert unread_flags(_argv(OVERLAP)) == []
    cost = CostModel(H100)
    slow, fast = cost.estimate(plain, plain.requested), cost.estimate(flagged, flagged.requested)
    assert fast.dp_allreduce_s < 0.5 * slow.dp_allreduce_s and fast.pipeline_s < slow.pipeline_s
    assert fast.iter_time_s < slow.iter_time_s
    # one flag at a time: each hides only its own collective
    grads = profile_from_argv(_argv(OVERLAP[:1]), world_size=64, gpus_per_node=8)
    assert cost.estimate(grads, grads.requested).pipeline_s == slow.pipeline_s
    tp_only = profile_from_argv(_argv(OVERLAP[2:]), world_size=64, gpus_per_node=8)
    assert cost.estimate(tp_only, tp_only.requested).dp_allreduce_s == slow.dp_allreduce_s
