#!/bin/bash
#SBATCH --job-name=gpt-array
#SBATCH --gpus=8
set -euo pipefail
MODEL_ARGS=(
    --num-layers 32
    --hidden-size 4096
    --num-attention-heads 32   # MHA
    --seq-length 4096
)
TRAIN_ARGS=(--micro-batch-size 1 --global-batch-size 128 --train-iters 500 --bf16)
srun python pretrain_gpt.py "${MODEL_ARGS[@]}" "${TRAIN_ARGS[@]}" \
    --tensor-model-parallel-size 2 --pipeline-model-parallel-size 4
