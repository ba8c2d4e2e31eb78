#!/bin/bash
#SBATCH -N 2 --gpus-per-node=4
#SBATCH --comment="my note"
#PSWIFT gpus=4-16 min-micro-batch=2

GPT_ARGS="
    --num-layers 24 \
    --hidden-size 1024
    --num-attention-heads 16 --seq-length 2048
"
export CUDA_DEVICE_MAX_CONNECTIONS=1
cd $HOME && CUDA_DEVICE_MAX_CONNECTIONS=1 torchrun --nproc_per_node 4 pretrain_gpt.py $GPT_ARGS \
    --micro-batch-size 2 --global-batch-size 64 \
    --pipeline-model-parallel-size 2 --train-iters 100   # a comment
echo done
