"""FLOPs of a transformer layer and of a training iteration, and the time of a ring
all-reduce: the formulas the cost model (``core/costmodel.py``) composes. Pure; imports
only ``core.model``.

Sources: [N21] Narayanan et al., SC'21; [MLM] Megatron-LM training.py
``num_floating_point_operations`` (core_r0.16.0); see ``core/costmodel.py``.
"""

from __future__ import annotations

from pipeswift_slurm.core.model import ModelShape


def flops_per_iteration(shape: ModelShape, global_batch_size: int) -> float:
    """Model FLOPs of one iteration (forward + backward, recompute not counted) [MLM]:

    F = B*s*[ L*( 12*h*ffn*(1.5 if swiglu) + 6*(h*(q+k+v) + q*s + q*h) ) + 6*h*V_pad ]
    with q = kv_channels*heads, k = v = kv_channels*query_groups; the causal attention
    term q*s is already halved (s/2 * 2 matmuls); 6 = 3 passes (fwd, 2x bwd) * 2 (FMA).
    """
    s, h = shape.seq_length, shape.hidden_size
    q = shape.kv_channels * shape.num_attention_heads
    kv = shape.kv_channels * shape.num_query_groups
    mlp = 12 * h * shape.ffn_hidden_size * (1.5 if shape.swiglu else 1.0)
    attn = 6 * (h * (q + 2 * kv) + q * s + q * h)
    return global_batch_size * s * (shape.num_layers * (mlp + attn) + 6 * h * shape.padded_vocab_size(1))


def layer_fwd_flops(shape: ModelShape, micro_batch_size: int) -> float:
    """Forward FLOPs of one transformer layer for one micro-batch: one third of the
    per-layer term of :func:`flops_per_iteration` (backward = 2x forward)."""
    s, h = shape.seq_length, shape.hidden_size
    q = shape.kv_channels * shape.num_attention_heads
    kv = shape.kv_channels * shape.num_query_groups
    mlp = 4 * h * shape.ffn_hidden_size * (1.5 if shape.swiglu else 1.0)
    attn = 2 * (h * (q + 2 * kv) + q * s + q * h)
    return micro_batch_size * s * (mlp + attn)


def attention_core_fwd_flops(shape: ModelShape, micro_batch_size: int) -> float:
    """Forward FLOPs of QK^T and attention-times-V (causal): what selective recompute redoes."""
    q = shape.kv_channels * shape.num_attention_heads
    return 2 * micro_batch_size * shape.seq_length * q * shape.seq_length


def ring_allreduce_s(nbytes: float, ranks: int, bandwidth_gbps: float, latency_s: float) -> float:
    """Ring all-reduce: each rank sends and receives 2*(n-1)/n of the buffer, in 2*(n-1) steps."""
    if ranks <= 1 or nbytes <= 0:
        return 0.0
    return 2 * (ranks - 1) / ranks * nbytes / (bandwidth_gbps * 1e9) + 2 * (ranks - 1) * latency_s
