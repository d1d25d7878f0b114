#!/usr/bin/env bash
# Session 33's eighth call (carry [".gpu-pack33g"]): the one-launch routing, once it has picked,
# asks L2 for the first 4 KB of each 16-row tile of the picked experts' gate_up codes (the first
# two ring stages of each gate_up warp; ANVIL_ROUTE_L2_GATE_UP=1), against main, same binary, both
# models, three rounds, batch 1 with the 128-token prefill figure.
set -uo pipefail
source "$(dirname "$0")/../session25/unpack.sh" .gpu-pack33g /tmp/lease33h
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$OUT_ROOT/gpu.txt"
A=$C/anvil
OUT=$OUT_ROOT/ab ANVIL_AB_MODELS="${ANVIL_AB_MODELS:-gpt-oss-20b gpt-oss-120b}" ANVIL_AB_BATCHES=1 ANVIL_AB_ROUNDS=3 \
  ANVIL_AB_PREFILL=128 timeout "${ANVIL_AB_S:-300}" \
  bash scripts/gpu_ab.sh main=$A l2gu=$A,ANVIL_ROUTE_L2_GATE_UP=1 > "$OUT_ROOT/ab.txt" 2>&1
tail -n 14 "$OUT_ROOT/ab.txt"
tar -czf "$OUT_ROOT/ab.tgz" -C "$OUT_ROOT" ab && rm -rf "$OUT_ROOT/ab"
