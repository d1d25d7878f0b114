#!/usr/bin/env bash
# Session 35's sixth call (carry [".gpu-pack35f"]: anvil at main; extra/anvil-ropefull, main with the
# RoPE inside the decode attention on the SM90 row for layers without a sliding window only,
# rope-full-layers-variant.patch). Lease 5: the fused form was level over the whole model while
# the probe's last (full) layer ran its qkv-to-o_proj chain 4.6 us shorter, so the sliding layers
# may lose what the full ones gain. A/B at batch 1 (512-token decode context), three rounds; on an
# H200 also batch 64 and the 2,048-token prefill, one round.
set -uo pipefail
source "$(dirname "$0")/../session25/unpack.sh" .gpu-pack35f /tmp/lease35f
name=$(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$OUT_ROOT/gpu.txt")
echo "$name"
OUT=$OUT_ROOT/ab ANVIL_AB_BATCHES=1 ANVIL_AB_ROUNDS=3 ANVIL_AB_PREFILL=512 timeout 150 \
  bash scripts/gpu_ab.sh main=$C/anvil ropefull=$C/extra/anvil-ropefull > "$OUT_ROOT/ab.txt" 2>&1
tail -n 13 "$OUT_ROOT/ab.txt"
tar -czf "$OUT_ROOT/ab.tgz" -C "$OUT_ROOT" ab && rm -rf "$OUT_ROOT/ab"
