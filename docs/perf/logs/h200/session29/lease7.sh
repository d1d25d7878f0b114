#!/usr/bin/env bash
# Session 29's seventh call (carry [".gpu-pack17"]): lease6's build with the wide decode block
# kept to batches whose (sequence, KV head) pairs leave one 160 KB block per SM
# (decode_attention_wide_splits): batch 8 and 64 back on 8-warp blocks. anvil-base is 2afc355.
#   1. the attention tests  2. A/B at batches 1, 4, 8, 64, and 1 and 8 with a 4096-token prompt.
set -uo pipefail
source "$(dirname "$0")/../session25/unpack.sh" .gpu-pack17 /tmp/lease29g
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$OUT_ROOT/gpu.txt"
ANVIL_FIXTURES_DIR=$PWD/$C/fixtures timeout 20 $C/anvil_gpu_tests --gtest_filter='CudaAttention*' > "$OUT_ROOT/gpu_tests.log" 2>&1
echo "attention tests exit $?"; grep -E "^\[  (PASSED|FAILED) |^\[  FAILED" "$OUT_ROOT/gpu_tests.log" | tail -n 4
A=$C/anvil
OUT=$OUT_ROOT/ab ANVIL_AB_BATCHES=1,4,8,64 ANVIL_AB_ROUNDS=2 ANVIL_AB_PREFILL=128 timeout 100 \
  bash scripts/gpu_ab.sh head=$C/anvil-base new=$A > "$OUT_ROOT/ab.txt" 2>&1
tail -n 10 "$OUT_ROOT/ab.txt"
OUT=$OUT_ROOT/ablong ANVIL_AB_BATCHES=1,8 ANVIL_AB_ROUNDS=1 ANVIL_AB_PREFILL=128 ANVIL_AB_EXTRA="--decode-prompt 4096" \
  timeout 35 bash scripts/gpu_ab.sh head=$C/anvil-base new=$A > "$OUT_ROOT/ablong.txt" 2>&1
tail -n 6 "$OUT_ROOT/ablong.txt"
tar -czf "$OUT_ROOT/ab.tgz" -C "$OUT_ROOT" ab ablong && rm -rf "$OUT_ROOT/ab" "$OUT_ROOT/ablong"
