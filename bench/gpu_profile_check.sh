#!/usr/bin/env bash
# `pipeswift profile` on a lent GPU (e.g. one H200), then the measured layer time against the
# cost model's table (bench/profile_vs_model.py). For each shape below, the CLI times fwd+bwd of
# one transformer layer (bf16, CUDA events, 2 warm-ups + median of 5) at micro-batch sizes
# $MBS and writes $OUT/profile_<shape>_$TAG.toml. Shapes (the layers of published models):
#   gpt-1.3b      h=2048  s=2048 a=16          ffn=8192  GeLU    (small: the efficiency knee)
# and, with SHAPES=knee, GPT-3's smaller sizes for the knee: gpt-350m (h 1024), gpt-760m (h 1536),
# gpt-1.3b, gpt-2.7b (h 2560), gpt-6.7b (h 4096), all at s=2048.
#   gpt3-175b     h=12288 s=2048 a=96          ffn=49152 GeLU
#   llama31-8b    h=4096  s=8192 a=32 groups=8 ffn=14336 SwiGLU
#   nemotron4-15b h=6144  s=4096 a=48 groups=8 ffn=24576 (squared ReLU, profiled as GeLU)
#   llama31-70b   h=8192  s=8192 a=64 groups=8 ffn=28672 SwiGLU
# The layer is megatron-core's TransformerLayer when megatron-core imports (Transformer-Engine
# spec when transformer_engine imports, else the local spec with unfused attention), else a
# plain torch layer (SDPA attention): run it once without and once with megatron-core on the
# path, with TAG naming which. Installs nothing. Prints figures; never passes/fails on speed.
# Writes $OUT/profile_vs_model_$TAG.json and $OUT/gpu_profile_check_$TAG.log.
#
# Usage (repository root):  OUT=./out TAG=torch bash bench/gpu_profile_check.sh
# Env: OUT (default ./out), TAG (default run), PYTHON (default python3), MBS (default 1,2,4,8),
#      SHAPES (default all, comma-separated names), ALLOW_CPU=1 to run without a GPU (the
#      comparison is then skipped: a CPU says nothing about a GPU type), SMOKE=1 for one tiny shape.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-./out}"
TAG="${TAG:-run}"
PYTHON="${PYTHON:-python3}"
MBS="${MBS:-1,2,4,8}"
mkdir -p "$OUT"
LOG="$OUT/gpu_profile_check_$TAG.log"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"

if ! cuda=$("$PYTHON" -c 'import torch; print(torch.cuda.is_available())' 2>/dev/null); then
    echo "gpu_profile_check: torch is not importable with $PYTHON; nothing to measure" >&2
    exit 2
fi
if [[ "$cuda" != "True" && "${ALLOW_CPU:-0}" != "1" ]]; then
    echo "gpu_profile_check: torch sees no CUDA device (set ALLOW_CPU=1 to run on the CPU)" >&2
    exit 3
fi
{
    nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv 2>/dev/null || true
    "$PYTHON" -c 'import importlib.util as u, sys, torch
from pipeswift_slurm.measure.profiler import megatron_available
print("python", sys.version.split()[0], "torch", torch.__version__, "cuda", torch.version.cuda,
      "megatron-core", megatron_available(), "transformer_engine", u.find_spec("transformer_engine") is not None)'
} 2>&1 | tee "$LOG"

common=(--micro-batch-size 1 --global-batch-size 64 --bf16 --train-iters 10)
declare -A shape_args=(
    [gpt-350m]="--num-layers 24 --hidden-size 1024 --num-attention-heads 16 --seq-length 2048 --max-position-embeddings 2048"
    [gpt-760m]="--num-layers 24 --hidden-size 1536 --num-attention-heads 16 --seq-length 2048 --max-position-embeddings 2048"
    [gpt-1.3b]="--num-layers 24 --hidden-size 2048 --num-attention-heads 16 --seq-length 2048 --max-position-embeddings 2048"
    [gpt-2.7b]="--num-layers 32 --hidden-size 2560 --num-attention-heads 32 --seq-length 2048 --max-position-embeddings 2048"
    [gpt-6.7b]="--num-layers 32 --hidden-size 4096 --num-attention-heads 32 --seq-length 2048 --max-position-embeddings 2048"
    [gpt3-175b]="--num-layers 96 --hidden-size 12288 --num-attention-heads 96 --seq-length 2048 --max-position-embeddings 2048"
    [llama31-8b]="--num-layers 32 --hidden-size 4096 --ffn-hidden-size 14336 --num-attention-heads 32 --group-query-attention --num-query-groups 8 --swiglu --seq-length 8192 --max-position-embeddings 8192"
    [nemotron4-15b]="--num-layers 32 --hidden-size 6144 --ffn-hidden-size 24576 --num-attention-heads 48 --group-query-attention --num-query-groups 8 --seq-length 4096 --max-position-embeddings 4096"
    [llama31-70b]="--num-layers 80 --hidden-size 8192 --ffn-hidden-size 28672 --num-attention-heads 64 --group-query-attention --num-query-groups 8 --swiglu --seq-length 8192 --max-position-embeddings 8192"
    [smoke]="--num-layers 2 --hidden-size 256 --num-attention-heads 4 --seq-length 256 --max-position-embeddings 256"
)
if [[ "${SMOKE:-0}" == "1" ]]; then
    SHAPES=smoke
elif [[ "${SHAPES:-}" == "knee" ]]; then
    SHAPES=gpt-350m,gpt-760m,gpt-1.3b,gpt-2.7b,gpt-6.7b
fi
IFS=, read -r -a names <<< "${SHAPES:-gpt-1.3b,gpt3-175b,llama31-8b,nemotron4-15b,llama31-70b}"

written=()
for name in "${names[@]}"; do
    if [[ -z "${shape_args[$name]:-}" ]]; then
        echo "gpu_profile_check: unknown shape $name (known: ${!shape_args[*]})" >&2
        exit 2
    fi
    file="$OUT/profile_${name}_$TAG.toml"
    echo "== $name ($TAG)" | tee -a "$LOG"
    # shellcheck disable=SC2086  # the shape's arguments are words
    if timeout 100 "$PYTHON" -m pipeswift_slurm.cli profile --micro-batch-sizes "$MBS" --out "$file" \
            -- ${shape_args[$name]} "${common[@]}" 2>&1 | grep -v -E "UserWarning|warnings\.warn\(" | tee -a "$LOG"; then
        [[ -f "$file" ]] && written+=("$file")
    else
        echo "$name: pipeswift profile failed (exit ${PIPESTATUS[0]})" | tee -a "$LOG"
    fi
done

if [[ "$cuda" == "True" && ${#written[@]} -gt 0 ]]; then
    "$PYTHON" bench/profile_vs_model.py "${written[@]}" > "$OUT/profile_vs_model_$TAG.json" \
        && echo "wrote $OUT/profile_vs_model_$TAG.json" | tee -a "$LOG"
fi
echo "profiles written: ${#written[@]} of ${#names[@]}" | tee -a "$LOG"
[[ ${#written[@]} -gt 0 ]]  # no profile at all: fail the run
