#!/bin/bash
#SBATCH --gpus=4
pipeswift-launch -- torchrun --nproc-per-node 4 pretrain_gpt.py --num-layers 8 --hidden-size 512 --num-attention-heads 8 --seq-length 1024 --global-batch-size 32 --train-iters 100 --pipeline-model-parallel-size 2
