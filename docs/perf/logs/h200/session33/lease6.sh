#!/usr/bin/env bash
# Session 33's sixth call (carry [".gpu-pack33d"]): batch 1's gate_up asking L2 for its expert's
# down weights (each block a slice, cp.async.bulk.prefetch.L2; ANVIL_MOE_L2_DOWN=1 after its first
# copies, =2 after its products) against main (=0), same binary, both models, two rounds, batch 1
# with the 128-token prefill figure.
set -uo pipefail
source "$(dirname "$0")/../session25/unpack.sh" .gpu-pack33d /tmp/lease33f
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$OUT_ROOT/gpu.txt"
A=$C/anvil
OUT=$OUT_ROOT/ab ANVIL_AB_MODELS="${ANVIL_AB_MODELS:-gpt-oss-20b gpt-oss-120b}" ANVIL_AB_BATCHES=1 ANVIL_AB_ROUNDS=2 \
  ANVIL_AB_PREFILL=128 timeout "${ANVIL_AB_S:-300}" \
  bash scripts/gpu_ab.sh main=$A down1=$A,ANVIL_MOE_L2_DOWN=1 down2=$A,ANVIL_MOE_L2_DOWN=2 > "$OUT_ROOT/ab.txt" 2>&1
tail -n 16 "$OUT_ROOT/ab.txt"
tar -czf "$OUT_ROOT/ab.tgz" -C "$OUT_ROOT" ab && rm -rf "$OUT_ROOT/ab"
