#!/usr/bin/env bash
# Session 34's sixth call (carry [".gpu-pack34e"], the same pack as lease 5): on the H200 that
# lease 5 got, the resident o_proj (ANVIL_RESIDENT_GEMV=1) with all 8 KB of each row before its
# wait, and with 6 (ANVIL_RESIDENT_EARLY_KB=6), against main's bulk GEMV; batch 1, both models,
# three rounds; then 20b traces of base and resident.
set -uo pipefail
source "$(dirname "$0")/../session25/unpack.sh" .gpu-pack34e /tmp/lease34f
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$OUT_ROOT/gpu.txt"
A=$C/anvil
R=ANVIL_RESIDENT_GEMV=1
OUT=$OUT_ROOT/ab ANVIL_AB_MODELS="gpt-oss-20b gpt-oss-120b" ANVIL_AB_BATCHES=1 ANVIL_AB_ROUNDS=3 \
  ANVIL_AB_PREFILL=512 timeout 300 bash scripts/gpu_ab.sh base=$A e8=$A,$R e6=$A,$R,ANVIL_RESIDENT_EARLY_KB=6 \
  > "$OUT_ROOT/ab.txt" 2>&1
tail -n 19 "$OUT_ROOT/ab.txt"
tar -czf "$OUT_ROOT/ab.tgz" -C "$OUT_ROOT" ab && rm -rf "$OUT_ROOT/ab"
