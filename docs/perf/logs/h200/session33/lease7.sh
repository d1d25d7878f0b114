#!/usr/bin/env bash
# Session 33's seventh call (carry [".gpu-pack33k"]): deeper cp.async rings for batch 1's experts,
# same binary, both models, two rounds, batch 1 with the 128-token prefill figure: gate_up
# (split 2) with 4 or 5 stages (ANVIL_MOE_STAGES_GATE_UP), down with the sum (split 4) with 4
# (ANVIL_MOE_STAGES_DOWN; 3 blocks of 69 KB still fit an SM), both, against main's 3 and 3.
set -uo pipefail
source "$(dirname "$0")/../session25/unpack.sh" .gpu-pack33k /tmp/lease33g
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$OUT_ROOT/gpu.txt"
A=$C/anvil
OUT=$OUT_ROOT/ab ANVIL_AB_MODELS="${ANVIL_AB_MODELS:-gpt-oss-20b gpt-oss-120b}" ANVIL_AB_BATCHES=1 ANVIL_AB_ROUNDS=2 \
  ANVIL_AB_PREFILL=128 timeout "${ANVIL_AB_S:-400}" \
  bash scripts/gpu_ab.sh main=$A gu4=$A,ANVIL_MOE_STAGES_GATE_UP=4 gu5=$A,ANVIL_MOE_STAGES_GATE_UP=5 \
  down4=$A,ANVIL_MOE_STAGES_DOWN=4 both4=$A,ANVIL_MOE_STAGES_GATE_UP=4,ANVIL_MOE_STAGES_DOWN=4 > "$OUT_ROOT/ab.txt" 2>&1
tail -n 24 "$OUT_ROOT/ab.txt"
tar -czf "$OUT_ROOT/ab.tgz" -C "$OUT_ROOT" ab && rm -rf "$OUT_ROOT/ab"
