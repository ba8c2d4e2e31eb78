#!/usr/bin/env bash
# Per-layer profiler on a lent GPU (e.g. one H200): fwd+bwd of one transformer layer, bf16,
# CUDA-event timing, 2 warm-ups + median of 5, for two shapes at micro-batch sizes 1,2,4,8:
#   gpt-1.3b  h=2048 s=2048 a=16 ffn=8192 (GPT-3 1.3B layer)
#   gpt-7b    h=4096 s=4096 a=32 ffn=16384 (a 7B-class GPT layer at 4k context)
# Writes $OUT/profile_<name>.toml (the file `pipeswift profile` writes, read by the cost model),
# $OUT/gpu_profile_check.json (all figures + environment) and $OUT/gpu_profile_check.log.
# Installs nothing: it needs torch with CUDA; megatron-core's TransformerLayer is used when it
# imports (TE spec if transformer_engine imports, else the local spec), else a plain torch layer.
# Prints figures; never passes/fails on speed. Budget: < 3 minutes (usually ~1).
#
# Usage (repository root):  OUT=./out bash bench/gpu_profile_check.sh
# Env: OUT (default ./out), PYTHON (default python3), MBS (default 1,2,4,8),
#      ALLOW_CPU=1 to run anyway without a GPU, SMOKE=1 to swap in tiny shapes (checks the script).
set -euo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-./out}"
PYTHON="${PYTHON:-python3}"
MBS="${MBS:-1,2,4,8}"
mkdir -p "$OUT"

if ! cuda=$("$PYTHON" -c 'import torch; print(torch.cuda.is_available())' 2>/dev/null); then
    echo "gpu_profile_check: torch is not importable with $PYTHON; nothing to measure" >&2
    exit 2
fi
if [[ "$cuda" != "True" && "${ALLOW_CPU:-0}" != "1" ]]; then
    echo "gpu_profile_check: torch sees no CUDA device (set ALLOW_CPU=1 to run on the CPU)" >&2
    exit 3
fi
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv 2>/dev/null | tee "$OUT/nvidia-smi.csv" || true

PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" OUT="$OUT" MBS="$MBS" SMOKE="${SMOKE:-0}" timeout 170 "$PYTHON" - <<'PY' 2>&1 | tee "$OUT/gpu_profile_check.log"
import importlib.util, json, logging, os, sys, time

logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s", stream=sys.stdout)
import torch
from pipeswift_slurm.core.model import ModelShape
from pipeswift_slurm.measure.profiler import main_profile, megatron_available, profile_to_dict

out, mbs = os.environ["OUT"], [int(x) for x in os.environ["MBS"].split(",")]
shapes = {
    "gpt-1.3b": ModelShape(num_layers=24, hidden_size=2048, num_attention_heads=16, seq_length=2048,
                           ffn_hidden_size=8192, kv_channels=128, num_query_groups=16),
    "gpt-7b": ModelShape(num_layers=32, hidden_size=4096, num_attention_heads=32, seq_length=4096,
                         ffn_hidden_size=16384, kv_channels=128, num_query_groups=32),
}
if os.environ["SMOKE"] == "1":
    shapes = {name: ModelShape(num_layers=2, hidden_size=h, num_attention_heads=4, seq_length=h,
                               ffn_hidden_size=4 * h, kv_channels=h // 4, num_query_groups=4)
              for name, h in (("smoke-128", 128), ("smoke-256", 256))}
summary = {"python": sys.version.split()[0], "torch": torch.__version__,
           "cuda": torch.version.cuda, "cuda_available": torch.cuda.is_available(),
           "device_name": torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu",
           "megatron_core": megatron_available(),
           "transformer_engine": importlib.util.find_spec("transformer_engine") is not None,
           "micro_batch_sizes": mbs, "profiles": {}}
print("environment:", json.dumps(summary), flush=True)
for name, shape in shapes.items():
    start_s = time.perf_counter()
    if torch.cuda.is_available():
        torch.cuda.reset_peak_memory_stats()
    try:
        profile = main_profile(shape, mbs, None, os.path.join(out, f"profile_{name}.toml"))
    except Exception as exc:  # report and go on to the next shape
        summary["profiles"][name] = {"error": repr(exc)}
        print(f"{name}: FAILED {exc!r}", flush=True)
        continue
    entry = profile_to_dict(profile)
    entry["wall_s"] = round(time.perf_counter() - start_s, 1)
    if torch.cuda.is_available():
        entry["peak_memory_gib"] = round(torch.cuda.max_memory_allocated() / 2**30, 2)
    summary["profiles"][name] = entry
    print(f"\n{name}: backend={profile.backend} spec={profile.layer_spec} dtype={profile.dtype} "
          f"device={profile.device}")
    print(f"{'mbs':>4} {'fwd_bwd_ms':>11} {'TFLOP/s':>8} {'ms/sample':>10}")
    for t in profile.timings:
        print(f"{t.micro_batch_size:4d} {t.fwd_bwd_ms:11.3f} {t.tflops:8.1f} "
              f"{t.fwd_bwd_ms / t.micro_batch_size:10.3f}", flush=True)
with open(os.path.join(out, "gpu_profile_check.json"), "w") as fh:
    json.dump(summary, fh, indent=1)
print(f"\nwrote {out}/gpu_profile_check.json and profile_*.toml")
PY
