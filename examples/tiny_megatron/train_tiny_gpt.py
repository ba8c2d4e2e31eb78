"""Train a tiny megatron-core GPT with the parallel layout given by Megatron-LM flags.

This is the end-to-end witness that the launcher's injected Megatron arguments are the ones
that ran. It takes Megatron-LM flag names (unknown Megatron flags such as ``--bf16`` are
accepted and ignored), runs under ``torchrun`` (gloo on CPU, nccl on GPU), derives
DP = world / (TP*PP) and M = GBS / (MBS*DP) with megatron-core's own calculator, and prints:

  PIPESWIFT_RUN {"pp": 2, "vp": 1, "dp": 1, "tp": 1, "num_micro_batches": 4, ...}   (rank 0)
  PIPESWIFT_LOSS {"iteration": 0, "loss": 4.8656054, "iter_ms": 81.2}   (last stage, DP rank 0)

``--save-init`` (PP=1, TP=1) saves the initial weights; ``--load-init`` loads them into any
PP/VP layout, so a PP=2 run reproduces the PP=1 losses. Embeddings are always untied
(tied embeddings with PP>1 need CUDA in megatron-core 0.16.1), and the attention mask is
explicit. On a CPU-only torch the test-only ``cpu_shims`` are applied first.

Run:  torchrun --nproc_per_node=2 train_tiny_gpt.py --pipeline-model-parallel-size 2 \
          --micro-batch-size 2 --global-batch-size 8 --train-iters 4
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import torch
import torch.distributed as dist


def parse_args(argv=None):
    """Parse the Megatron-LM flags this script honours; unknown flags are returned apart."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0], allow_abbrev=False)
    arg = p.add_argument
    arg("--num-layers", type=int, default=4)
    arg("--hidden-size", type=int, default=64)
    arg("--num-attention-heads", type=int, default=4)
    arg("--seq-length", type=int, default=32)
    arg("--max-position-embeddings", type=int, default=None)
    arg("--vocab-size", type=int, default=128)
    arg("--micro-batch-size", type=int, default=2)
    arg("--global-batch-size", type=int, default=None)
    arg("--train-iters", type=int, default=4)
    arg("--tensor-model-parallel-size", type=int, default=1)
    arg("--pipeline-model-parallel-size", type=int, default=1)
    vp = p.add_mutually_exclusive_group()
    vp.add_argument("--num-layers-per-virtual-pipeline-stage", type=int, default=None)
    vp.add_argument("--num-virtual-stages-per-pipeline-rank", type=int, default=None)
    arg("--lr", type=float, default=1e-3)
    arg("--seed", type=int, default=1234)
    arg("--save-init", default=None, help="save the initial weights here (PP=1, TP=1 only)")
    arg("--load-init", default=None, help="load weights saved by --save-init into this layout")
    return p.parse_known_args(argv)


def virtual_stages(args) -> int:
    """Megatron's rule: VP = (L/PP) / layers-per-virtual-stage, or the explicit count."""
    per_rank, rest = divmod(args.num_layers, args.pipeline_model_parallel_size)
    if rest:
        sys.exit(f"--num-layers {args.num_layers} is not divisible by PP")
    if args.num_virtual_stages_per_pipeline_rank:
        return args.num_virtual_stages_per_pipeline_rank
    if args.num_layers_per_virtual_pipeline_stage:
        if per_rank % args.num_layers_per_virtual_pipeline_stage:
            sys.exit("layers per pipeline rank not divisible by --num-layers-per-virtual-pipeline-stage")
        return per_rank // args.num_layers_per_virtual_pipeline_stage
    return 1


def init_distributed():
    """gloo on CPU, nccl on GPU; a single process without torchrun needs no rendezvous."""
    backend = "nccl" if torch.cuda.is_available() else "gloo"
    if "WORLD_SIZE" in os.environ:
        local_world = int(os.environ.get("LOCAL_WORLD_SIZE", os.environ["WORLD_SIZE"]))
        if torch.cuda.is_available():
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
        dist.init_process_group(backend=backend)
    else:
        local_world = 1
        dist.init_process_group(backend=backend, store=dist.HashStore(), rank=0, world_size=1)
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // local_world))
    return torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu")


def build_model(args, vp: int):
    """One GPTModel chunk per virtual stage of this pipeline rank (local layer spec)."""
    from megatron.core import parallel_state as ps
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.transformer import TransformerConfig

    config = TransformerConfig(
        num_layers=args.num_layers, hidden_size=args.hidden_size,
        num_attention_heads=args.num_attention_heads,
        tensor_model_parallel_size=args.tensor_model_parallel_size,
        pipeline_model_parallel_size=args.pipeline_model_parallel_size,
        virtual_pipeline_model_parallel_size=vp if vp > 1 else None,
        pipeline_dtype=torch.float32, use_cpu_initialization=True,
        hidden_dropout=0.0, attention_dropout=0.0,
        # Megatron-LM's defaults (overlap on, hence no batched p2p). Batched p2p on gloo also
        # crosses the two messages between a PP=2 pair (same peer, same tag) when interleaved.
        overlap_p2p_comm=vp > 1, batch_p2p_comm=False)
    torch.manual_seed(args.seed)
    chunks = []
    for stage in range(vp):
        vp_stage = stage if vp > 1 else None
        chunks.append(GPTModel(
            config=config, transformer_layer_spec=get_gpt_layer_local_spec(),
            vocab_size=args.vocab_size,
            max_sequence_length=args.max_position_embeddings or args.seq_length,
            pre_process=ps.is_pipeline_first_stage(ignore_virtual=False, vp_stage=vp_stage),
            post_process=ps.is_pipeline_last_stage(ignore_virtual=False, vp_stage=vp_stage),
            share_embeddings_and_output_weights=False, vp_stage=vp_stage))
    return config, chunks


def load_init(chunks, path: str) -> None:
    """Load a PP=1 state dict: local layer i of a chunk is global layer ``layer_number - 1``."""
    full = torch.load(path, map_location="cpu")
    for chunk in chunks:
        local = {}
        for key in chunk.state_dict():
            parts = key.split(".")
            if key.startswith("decoder.layers."):
                parts[2] = str(chunk.decoder.layers[int(parts[2])].layer_number - 1)
            local[key] = full[".".join(parts)]
        chunk.load_state_dict(local, strict=True)


def wrap_for_training(args, config, chunks):
    """megatron DDP (grad all-reduce over DP) and megatron's Adam, with clip_grad=0."""
    from megatron.core.distributed import (
        DistributedDataParallel,
        DistributedDataParallelConfig,
        finalize_model_grads,
    )
    from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer

    ddp_config = DistributedDataParallelConfig(overlap_grad_reduce=False, use_distributed_optimizer=False)
    model = [DistributedDataParallel(config=config, ddp_config=ddp_config, module=c) for c in chunks]
    config.finalize_model_grads_func = finalize_model_grads
    opt_config = OptimizerConfig(optimizer="adam", lr=args.lr, weight_decay=0.0, clip_grad=0.0,
                                 bf16=False, fp16=False, use_distributed_optimizer=False)
    return model, get_megatron_optimizer(opt_config, model)


def global_batches(args, dp_rank: int, num_micro: int):
    """Each iteration draws the same global batch on every rank (seeded); DP rank d takes
    samples [d*M*b, (d+1)*M*b), so the loss does not depend on the layout."""
    gen = torch.Generator().manual_seed(args.seed)
    s, b, gbs = args.seq_length, args.micro_batch_size, args.global_batch_size
    while True:
        tokens = torch.randint(0, args.vocab_size, (gbs, s + 1), generator=gen)
        mine = tokens[dp_rank * num_micro * b:(dp_rank + 1) * num_micro * b]
        yield [mine[i * b:(i + 1) * b] for i in range(num_micro)]


def make_forward_step(args, device):
    s = args.seq_length
    mask = torch.triu(torch.ones(1, 1, s, s, dtype=torch.bool, device=device), diagonal=1)
    positions = torch.arange(s, device=device).unsqueeze(0)

    def loss_func(output_tensor):
        loss = output_tensor.float().mean()
        return loss, {"lm loss": loss.detach().clone()}  # the schedule scales `loss` in place

    def forward_step(data_iterator, model):
        tok = next(data_iterator).to(device)
        out = model(tok[:, :-1], positions.expand(tok.shape[0], s), mask, labels=tok[:, 1:])
        return out, loss_func
    return forward_step


def emit(tag: str, payload: dict) -> None:
    print(f"{tag} {json.dumps(payload, sort_keys=True)}", flush=True)


def train(args, model, optimizer, num_micro: int, device) -> None:
    from megatron.core import parallel_state as ps
    from megatron.core.pipeline_parallel import get_forward_backward_func

    fwd_bwd = get_forward_backward_func()
    if dist.get_rank() == 0:
        emit("PIPESWIFT_RUN", {
            "pp": ps.get_pipeline_model_parallel_world_size(), "vp": len(model),
            "tp": ps.get_tensor_model_parallel_world_size(), "dp": ps.get_data_parallel_world_size(),
            "num_micro_batches": num_micro, "micro_batch_size": args.micro_batch_size,
            "global_batch_size": args.global_batch_size, "num_layers": args.num_layers,
            "world_size": dist.get_world_size(), "schedule": fwd_bwd.__name__})
    last = ps.is_pipeline_last_stage(ignore_virtual=True)
    reports = last and ps.get_data_parallel_rank() == 0 and ps.get_tensor_model_parallel_rank() == 0
    batches = global_batches(args, ps.get_data_parallel_rank(), num_micro)
    forward_step = make_forward_step(args, device)
    for iteration in range(args.train_iters):
        start_s = time.perf_counter()
        micro = next(batches)
        for chunk in model:
            chunk.zero_grad_buffer()
        optimizer.zero_grad()
        results = fwd_bwd(forward_step_func=forward_step,
                          data_iterator=[iter(micro) for _ in model] if len(model) > 1 else iter(micro),
                          model=model if len(model) > 1 else model[0], num_microbatches=num_micro,
                          seq_length=args.seq_length, micro_batch_size=args.micro_batch_size,
                          forward_only=False)
        optimizer.step()
        iter_ms = (time.perf_counter() - start_s) * 1e3
        if last:
            loss = torch.stack([r["lm loss"] for r in results]).mean()
            dist.all_reduce(loss, group=ps.get_data_parallel_group())
            if reports:
                emit("PIPESWIFT_LOSS", {"iteration": iteration, "iter_ms": round(iter_ms, 1),
                                        "loss": loss.item() / ps.get_data_parallel_world_size()})


def main(argv=None) -> int:
    args, ignored = parse_args(argv)
    device = init_distributed()
    if ignored and dist.get_rank() == 0:
        print(f"train_tiny_gpt: ignoring Megatron flags {' '.join(ignored)}", file=sys.stderr)
    if not torch.cuda.is_available():
        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
        import cpu_shims
        cpu_shims.apply(training=True)
    from megatron.core import parallel_state as ps
    from megatron.core.num_microbatches_calculator import (
        get_num_microbatches,
        init_num_microbatches_calculator,
    )

    vp = virtual_stages(args)
    ps.initialize_model_parallel(tensor_model_parallel_size=args.tensor_model_parallel_size,
                                 pipeline_model_parallel_size=args.pipeline_model_parallel_size,
                                 virtual_pipeline_model_parallel_size=vp if vp > 1 else None)
    dp = ps.get_data_parallel_world_size()
    args.global_batch_size = args.global_batch_size or args.micro_batch_size * dp
    init_num_microbatches_calculator(dist.get_rank(), None, args.global_batch_size,
                                     args.micro_batch_size, dp)
    config, chunks = build_model(args, vp)
    if args.save_init:
        if dist.get_world_size() > 1 or vp > 1:
            sys.exit("--save-init needs a single-process PP=1 TP=1 run")
        torch.save(chunks[0].state_dict(), args.save_init)
    if args.load_init:
        if args.tensor_model_parallel_size > 1:
            sys.exit("--load-init does not slice tensor-parallel weights")
        load_init(chunks, args.load_init)
    for chunk in chunks:
        chunk.to(device).train()
    model, optimizer = wrap_for_training(args, config, chunks)
    train(args, model, optimizer, get_num_microbatches(), device)
    dist.barrier()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
