#!/usr/bin/env bash
# Session 35's fourth call (carry [".gpu-pack35c"], as lease 3), only on an H200: session 34's lease18
# A/B, main (0319c9a and later) against 701d58b at the bars' settings. On another card it stops.
set -uo pipefail
source "$(dirname "$0")/../session25/unpack.sh" .gpu-pack35c /tmp/lease35d
name=$(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$OUT_ROOT/gpu.txt")
echo "$name"
case "$name" in *H200*) ;; *) echo "not an H200: nothing run"; exit 0 ;; esac
OUT=$OUT_ROOT/ab ANVIL_AB_BATCHES=1,64 ANVIL_AB_ROUNDS=2 ANVIL_AB_PREFILL=2048 timeout 280 \
  bash scripts/gpu_ab.sh base=$C/anvil-base main=$C/anvil > "$OUT_ROOT/ab.txt" 2>&1
tail -n 10 "$OUT_ROOT/ab.txt"
tar -czf "$OUT_ROOT/ab.tgz" -C "$OUT_ROOT" ab && rm -rf "$OUT_ROOT/ab"
