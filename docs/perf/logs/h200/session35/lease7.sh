#!/usr/bin/env bash
# Session 35's seventh call, built but not run (the device budget ran out). Carry [".gpu-pack35g"]:
# anvil at main (66d4ba2); three variants of it, three rounds each at batch 1 (512-token decode context):
# - extra/anvil-ropeslide (rope-sliding-layers-variant.patch): the SM90 row names the RoPE inside
#   the decode attention, for sliding-window layers only. Lease 5: on every layer it was level;
#   lease 6: on full layers only it lost 1.7-2.5 %, so the sliding layers may gain.
# - extra/anvil-onesplit (attention-one-wide-split-variant.patch): the wide (20-warp) decode
#   attention launches one block per KV head. At a 512-token context the graph's 1,024-key bound
#   launches two per KV head, and one of the two returns at once. Lease 3: o_proj's wait returns
#   1.0-1.5 us after the attention's last block, against 0.3-0.5 at every other boundary.
# - extra/anvil-merge (attention-merge-factors-variant.patch): the decode attention's cross-warp
#   merge makes each (warp, head) weight expf(max_w - max) once instead of once per output element
#   (bit for bit the same sums). Lease 3: the merge and store took 1.5-1.8 us. Landing it needs the
#   GPU tests as well (the decode-attention tests compare its outputs bit for bit).
set -uo pipefail
source "$(dirname "$0")/../session25/unpack.sh" .gpu-pack35g /tmp/lease35g
name=$(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$OUT_ROOT/gpu.txt")
echo "$name"
OUT=$OUT_ROOT/ab ANVIL_AB_BATCHES=1 ANVIL_AB_ROUNDS=3 ANVIL_AB_PREFILL=512 timeout 280 \
  bash scripts/gpu_ab.sh main=$C/anvil ropeslide=$C/extra/anvil-ropeslide onesplit=$C/extra/anvil-onesplit \
  merge=$C/extra/anvil-merge \
  > "$OUT_ROOT/ab.txt" 2>&1
tail -n 25 "$OUT_ROOT/ab.txt"
tar -czf "$OUT_ROOT/ab.tgz" -C "$OUT_ROOT" ab && rm -rf "$OUT_ROOT/ab"
