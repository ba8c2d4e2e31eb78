"""Terms of the cost model beyond a layer's GEMM FLOPs: the memory-bound elementwise work of a
layer, the bandwidth a ring collective of a parallel group gets, and how much of a collective
that Megatron overlaps with computation stays exposed.

Sources:
[K22]  Korthikanti et al., "Reducing Activation Recomputation in Large Transformer Models",
       2022, arXiv 2205.05198, sec. 4.2.2 and Table 2: the tensors a layer's norms, dropouts,
       residual adds and activation function read and write, h- or ffn-sized per token;
       with sequence parallelism they are split over tp.
[MLM]  Megatron-LM ``core/tensor_parallel/layers.py`` (core_r0.16.0): without
       ``--tp-comm-overlap`` the backward pass of a column-parallel linear overlaps its
       input-gradient reduce-scatter (all-reduce) with its weight-gradient GEMM.
[NCCL] NCCL's ring algorithm (docs.nvidia.com/deeplearning/nccl, "Performance"; nccl-tests
       doc/PERFORMANCE.md, bus bandwidth): a ring over several nodes runs one channel per
       NIC; on a rail-optimised DGX/HGX node (one NIC per GPU) the node-crossing traffic of
       a group with k ranks per node is spread over those k NICs, so its bus bandwidth per
       rank is min(NVLink, k x NIC).
[MCORE] megatron-core ``distributed/param_and_grad_buffer.py`` and ``distributed_data_parallel.py``
       (core_r0.16.0): with ``--overlap-grad-reduce`` a bucket's gradient reduce-scatter starts
       as soon as its gradients are ready in the backward pass of the last micro-batch (the
       earlier micro-batches accumulate without communicating); with
       ``--overlap-param-gather`` a bucket's all-gather runs ahead of the forward pass of the
       first micro-batch of the next iteration. Buckets hold max(40M, 1M x dp) parameters.
[TPO]  Wang et al., "Overlap Communication with Dependent Computation via Decomposition in
       Large Deep Learning Models", ASPLOS'23, as Transformer Engine's userbuffers run it
       (``--tp-comm-overlap``): a tensor-parallel all-gather / reduce-scatter is split into tp
       ring steps, each overlapped with the GEMM chunk that uses (or produces) it; one step
       cannot overlap.
Pure; imports only core types and ``core.flops``.
"""

from __future__ import annotations

from pipeswift_slurm.core.flops import ring_allreduce_s
from pipeswift_slurm.core.hardware import GpuType
from pipeswift_slurm.core.model import ExecConfig, ModelShape, TrainingPlan

# Megatron's DDP bucket: max(40M, 1M x dp) parameters [MCORE].
BUCKET_PARAMS = 40_000_000


def group_bandwidth_gbps(gpu: GpuType, ranks: int, stride: int, gpus_per_node: int) -> float:
    """Bus bandwidth per rank (GB/s) of a ring collective over ``ranks`` ranks spaced
    ``stride`` apart in Megatron's rank order (tp fastest, then cp, dp, pp), on nodes of
    ``gpus_per_node`` GPUs joined by NVLink: NVLink when the group stays in one node, else
    min(NVLink, k x NIC) with k the group's ranks per node [NCCL]."""
    node = gpus_per_node or gpu.gpus_per_node
    if ranks * stride <= node:
        return gpu.nvlink_gbps
    per_node = max(1, min(ranks, node // stride)) if stride <= node else 1
    return min(gpu.nvlink_gbps, per_node * gpu.inter_node_gbps)


def exposed_s(comm_s: float, window_s: float, bucket_s: float) -> float:
    """Seconds of an overlapped collective that stay on the critical path: what does not fit
    in the computation it overlaps (``window_s``), and never less than its last bucket
    (``bucket_s``, which has nothing left to overlap) [MCORE]."""
    return max(min(comm_s, bucket_s), comm_s - window_s)


def tp_exposed_s(comm_s: float, tp: int, gemm_s: float) -> float:
    """Exposed seconds of a layer's tensor-parallel collectives under ``--tp-comm-overlap``
    [TPO]: one of the tp ring steps, plus whatever the rest takes beyond the layer's GEMMs."""
    if tp <= 1:
        return 0.0
    step = comm_s / tp
    return step + max(0.0, comm_s - step - gemm_s)


def elementwise_fwd_values(shape: ModelShape, cfg: ExecConfig, sequence_parallel: bool) -> float:
    """Values one GPU reads and writes in one layer's memory-bound (non-GEMM, non-attention)
    forward work for one micro-batch [K22], per token: two norms (read h, write h: 4h), two
    bias-dropout-residual adds (read 2h, write h: 6h), the activation function (SwiGLU: read
    2 ffn, write ffn; GeLU or squared ReLU: read ffn, write ffn). The ffn part is split over
    tp; the 10h part too with sequence parallelism, else every tensor-parallel rank does it
    whole. Tokens: b*s/cp. The backward pass moves about twice as much."""
    h, ffn = shape.hidden_size, shape.ffn_hidden_size
    per_token = 10 * h / (cfg.tp if sequence_parallel else 1) + (3 if shape.swiglu else 2) * ffn / cfg.tp
    return per_token * cfg.micro_batch_size * shape.seq_length / cfg.cp


def tp_backward_exposed_s(comm_s: float, wgrad_s: float) -> float:
    """Exposed seconds of a layer's backward tensor-parallel collectives without
    ``--tp-comm-overlap`` [MLM]: the column-parallel half overlaps the weight-gradient GEMMs
    (``wgrad_s``, as long as the forward GEMMs), the row-parallel half does not."""
    return comm_s / 2 + max(0.0, comm_s / 2 - wgrad_s)


def data_parallel_s(gpu: GpuType, plan: TrainingPlan, cfg: ExecConfig, params: float,
                    windows_s: tuple[float, float]) -> float:
    """Exposed seconds of the gradient reduction across cfg.dp replicas of a rank holding
    ``params`` weights, term by term. Volume: ring all-reduce of fp32 main grads (2 bytes with
    fp16); with the distributed optimizer, reduce-scatter of the grads plus all-gather of the
    16-bit params, (d-1)/d * (4 + 2) bytes per param. Bandwidth: ``group_bandwidth_gbps`` of the
    data-parallel group (ranks tp*cp apart). Overlap [MCORE]: ``--overlap-grad-reduce`` hides
    the reduction behind the backward pass of the last micro-batch (``windows_s[1]``: the
    rank's layers), ``--overlap-param-gather`` the all-gather behind the forward pass of the
    first (``windows_s[0]``), each but a last bucket (``exposed_s``); without them nothing hides."""
    lat = gpu.latency_s
    grad_bytes = 2 if plan.precision == "fp16" else 4
    bw = group_bandwidth_gbps(gpu, cfg.dp, cfg.tp * cfg.cp, cfg.gpus_per_node)
    if plan.use_distributed_optimizer:
        share = (cfg.dp - 1) / cfg.dp * params / (bw * 1e9)
        reduce_s, gather_s = share * grad_bytes + (cfg.dp - 1) * lat, share * 2 + (cfg.dp - 1) * lat
    else:
        reduce_s, gather_s = ring_allreduce_s(params * grad_bytes, cfg.dp, bw, lat), 0.0
    bucket = min(1.0, max(BUCKET_PARAMS, 1e6 * cfg.dp) / max(params, 1.0))
    if plan.overlap_grad_reduce:
        reduce_s = exposed_s(reduce_s, windows_s[1], reduce_s * bucket)
    if plan.overlap_param_gather:
        gather_s = exposed_s(gather_s, windows_s[0], gather_s * bucket)
    return reduce_s + gather_s
