#!/bin/bash
#SBATCH --gpus-per-node=2
cat > cfg.txt <<EOT
torchrun pretrain_gpt.py --num-layers 4 --hidden-size 256 --num-attention-heads 4 --seq-length 512
EOT
if true; then
    exec torchrun --nnodes=1 --nproc-per-node=2 --node_rank=0 pretrain_gpt.py --num-layers 4 --hidden-size 256 --num-attention-heads 4 --seq-length 512 --global-batch-size 16 --train-iters 100
fi
