#!/bin/bash
# Re-record the Slurm outputs in this folder from a live test cluster:
#   tests/slurm/testbed.sh up && source $SLURM_TESTBED_DIR/env.sh && tests/data/slurm/record.sh
# Needs an empty queue; leaves the cluster with no jobs of its own.
#   tests/data/slurm/record.sh typed   (on a cluster started with GPU_TYPE=a100)
#   tests/data/slurm/record.sh partitions   (on a cluster started with GPU_PARTITIONS="a100:2 h100:2:4")
#   tests/data/slurm/record.sh sacct   (on a fresh cluster started with ACCOUNTING=dbd NODES=2:
#                                       sacct-$V-live.json, the jobs of sacct-22.05.json)
set -euo pipefail
OUT=$(cd "$(dirname "$0")" && pwd)
V=$(scontrol -V | awk '{print $2}' | cut -d. -f1,2)   # e.g. 22.05
cd /tmp
sb() { sbatch --parsable -o /dev/null "$@"; }
if [ "${1:-}" = typed ]; then
  R=$(sb -J typed-run -N1 --gpus-per-node=a100:2 --wrap 'sleep 60')
  T1=$(sb -J typed-node -H -N1 --gpus-per-node=a100:1 --wrap 'sleep 20')
  T2=$(sb -J typed-job -H --gpus=a100:3 --wrap 'sleep 20')
  sleep 2
  squeue --json --states=all > "$OUT/squeue-$V-typed.json"
  scontrol -o show job > "$OUT/scontrol-jobs-$V-typed.txt"
  scontrol -d -o show node > "$OUT/scontrol-nodes-$V-typed.txt"
  { scontrol update JobId="$T1" TresPerNode=gres:gpu:2 2>&1 || true; } > "$OUT/err-typed-untyped-$V.txt"
  scancel "$R" "$T1" "$T2"
  echo "recorded typed Slurm $V into $OUT"; exit 0
fi
if [ "${1:-}" = partitions ]; then
  B=$(sb -J blocker -p a100 -N2 --exclusive --gpus-per-node=8 --wrap 'sleep 60')
  for _ in $(seq 1 50); do [ "$(squeue -h -j "$B" -o %T)" = RUNNING ] && break; sleep 0.2; done
  M=$(sb -J multi -H -p a100,h100 -N1 --gpus-per-node=2 --wrap 'sleep 20')
  T=$(sb -J typed -H -p a100 -N1 --gpus-per-node=a100:1 --wrap 'sleep 20')
  U=$(sb -J untyped -H -p a100 --gpus=8 --wrap 'sleep 20')
  sleep 2
  squeue --json --states=all > "$OUT/squeue-$V-partitions.json"
  scontrol -d -o show node > "$OUT/scontrol-nodes-$V-partitions.txt"
  # the moves as the backends send them: partition and size in one update (24.11 refuses
  # some partition changes at random, "Resource temporarily unavailable": sent again)
  upd() { for _ in 1 2 3 4 5 6 7 8; do scontrol update "$@" 2>/dev/null && return; done; scontrol update "$@"; }
  G=$(squeue -h -j "$M" -o %b | sed 's/:[0-9]*$//')   # gres:gpu or gres/gpu, as this Slurm spells it
  upd JobId="$M" Partition=h100 NumNodes=2-2 TresPerNode="$G:4"
  upd JobId="$U" Partition=h100 NumNodes=2-2 TresPerJob="$G:8"
  sleep 1
  squeue --json --states=all > "$OUT/squeue-$V-partitions-moved.json"
  scancel "$B" "$M" "$T" "$U"
  echo "recorded partitions Slurm $V into $OUT"; exit 0
fi
if [ "${1:-}" = sacct ]; then
  # a psbatch profile (GPU range 2-8), two plain GPU jobs, a CPU-only one, one that fails,
  # and one cancelled while it waits behind the 2-node job
  TOKEN='pswift1;args=WyJwcmV0cmFpbl9ncHQucHkiLCAiLS1udW0tbGF5ZXJzIiwgIjI0IiwgIi0taGlkZGVuLXNpemUiLCAiMTAyNCIsICItLW51bS1hdHRlbnRpb24taGVhZHMiLCAiMTYiLCAiLS1zZXEtbGVuZ3RoIiwgIjEwMjQiLCAiLS1tYXgtcG9zaXRpb24tZW1iZWRkaW5ncyIsICIxMDI0IiwgIi0tbWljcm8tYmF0Y2gtc2l6ZSIsICI0IiwgIi0tZ2xvYmFsLWJhdGNoLXNpemUiLCAiNjQiLCAiLS10cmFpbi1pdGVycyIsICIxMDAwIl0=;gpus=2-8;world=4'
  IDS=$(sb -J mega1 -N1 --gres=gpu:4 -t 10 --comment="$TOKEN" --wrap 'sleep 3')
  IDS=$IDS,$(sb -J plain2 -N1 --gres=gpu:2 -t 5 --wrap 'sleep 2')
  IDS=$IDS,$(sb -J wide -N2 --gres=gpu:8 -t 60 --wrap 'sleep 4')
  IDS=$IDS,$(sb -J cpuonly -t 60 --wrap 'sleep 1')
  IDS=$IDS,$(sb -J fails --gres=gpu:1 -t 60 --wrap 'sleep 1; exit 3')
  CANC=$(sb -J cancelled -N2 --gres=gpu:8 -t 60 --wrap 'true'); IDS=$IDS,$CANC
  scancel "$CANC"
  for _ in $(seq 1 120); do  # every job's end has reached slurmdbd
    [ "$(sacct -n -X -j "$IDS" -o End | grep -c Unknown)" = 0 ] && break; sleep 0.5
  done
  sacct --json -j "$IDS" > "$OUT/sacct-$V-live.json"
  echo "recorded sacct --json of Slurm $V into $OUT"; exit 0
fi
PROFILE='pswift1;args=WyItLW51bS1sYXllcnMiLCAiOCJd;gpus=1-8;class=gpt-small'
DONE=$(sb -J done --wrap 'true')
CANC=$(sb -J cancelled -H --wrap 'true'); scancel "$CANC"
BLOCK=$(sb -J blocker -N4 --exclusive --gpus-per-node=8 --wrap 'sleep 300')
for _ in $(seq 1 50); do [ "$(squeue -h -j "$BLOCK" -o %T)" = RUNNING ] && break; sleep 0.2; done
P1=$(sb -J pernode -N1 --gpus-per-node=1 --comment="$PROFILE" --wrap 'sleep 20')
P2=$(sb -J perjob --gpus=4 --comment="note $PROFILE" -t 30 --wrap 'sleep 20')
P3=$(sb -J held -H -N2 --gres=gpu:2 --wrap 'sleep 20')
P4=$(sb -J array --array=1-3 --gpus-per-node=1 --wrap 'sleep 20')
P5=$(sb -J pertask -n2 --gpus-per-task=1 --wrap 'sleep 20')
P6=$(sb -J nogpu -n1 --wrap 'sleep 20')
scontrol update JobId="$P1" AdminComment='pswift-decision1;tp=1;pp=2;dp=1;mbs=1;M=8;nodes=2;gpn=1;at=1700000000'
scontrol update JobId="$P2" SiteFactor=5000
sleep 3
squeue --json --states=all > "$OUT/squeue-$V.json"   # the backend's argv
scontrol -o show job > "$OUT/scontrol-jobs-$V.txt"
scontrol -d -o show node > "$OUT/scontrol-nodes-$V.txt"
sinfo --json > "$OUT/sinfo-$V.json"
sprio -h -o '%i|%Y|%S' > "$OUT/sprio-$V.txt"
squeue -h -t all -o '%i|%T|%r|%D|%b|%Q|%y|%k' > "$OUT/squeue-text-$V.txt"
scancel "$BLOCK" "$P1" "$P2" "$P3" "$P4" "$P5" "$P6"
sleep 1
# error outputs
{ scontrol update JobId=999999 SiteFactor=1 2>&1 || true; } > "$OUT/err-invalid-job-$V.txt"
{ scontrol update JobId="$DONE" NumNodes=2-2 2>&1 || true; } > "$OUT/err-finished-job-$V.txt"
echo "recorded Slurm $V into $OUT"
