#!/bin/sh
#SBATCH --gres=gpu:2
#SBATCH -t 10
python train.py --num-layers 4 --hidden-size 256 --num-attention-heads 4 --seq-length 512 --micro-batch-size 4 --global-batch-size 32 --pipeline-model-parallel-size 2 --train-iters 10
