#!/usr/bin/env bash
# Session 35's seventh call (carry [".gpu-pack35g"]: anvil at main; extra/anvil-ropeslide, main with
# the RoPE inside the decode attention on the SM90 row for sliding-window layers only,
# rope-sliding-layers-variant.patch). Lease 5: the fused form on every layer was level; lease 6: on
# the full layers only it lost 1.6-2.2 %, so the sliding layers may be where it gains.
# A/B at batch 1 (512-token decode context), three rounds.
set -uo pipefail
source "$(dirname "$0")/../session25/unpack.sh" .gpu-pack35g /tmp/lease35g
name=$(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$OUT_ROOT/gpu.txt")
echo "$name"
OUT=$OUT_ROOT/ab ANVIL_AB_BATCHES=1 ANVIL_AB_ROUNDS=3 ANVIL_AB_PREFILL=512 timeout 150 \
  bash scripts/gpu_ab.sh main=$C/anvil ropeslide=$C/extra/anvil-ropeslide > "$OUT_ROOT/ab.txt" 2>&1
tail -n 13 "$OUT_ROOT/ab.txt"
tar -czf "$OUT_ROOT/ab.tgz" -C "$OUT_ROOT" ab && rm -rf "$OUT_ROOT/ab"
