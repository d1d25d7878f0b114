#!/usr/bin/env bash
# Session 34's seventh call, only on an H200 (carry [".gpu-pack34e"]): main's kernels (the pack's
# anvil with every lease switch off) at the bars' settings (batches 1 and 64, 2,048-token prefill),
# two rounds, then a batch-1 trace of each model.
set -uo pipefail
source "$(dirname "$0")/../session25/unpack.sh" .gpu-pack34e /tmp/lease34g
name=$(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$OUT_ROOT/gpu.txt")
echo "$name"
case "$name" in *H200*) ;; *) echo "not an H200: nothing run"; exit 0 ;; esac
OUT=$OUT_ROOT/ab ANVIL_AB_BATCHES=1,64 ANVIL_AB_ROUNDS=2 ANVIL_AB_PREFILL=2048 timeout 280 \
  bash scripts/gpu_ab.sh main=$C/anvil > "$OUT_ROOT/ab.txt" 2>&1
tail -n 6 "$OUT_ROOT/ab.txt"
tar -czf "$OUT_ROOT/ab.tgz" -C "$OUT_ROOT" ab && rm -rf "$OUT_ROOT/ab"
