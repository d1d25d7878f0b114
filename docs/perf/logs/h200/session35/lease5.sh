#!/usr/bin/env bash
# Session 35's fifth call (carry [".gpu-pack35e"]: anvil at main; extra/anvil-rope, main with the
# SM90 row naming the RoPE inside the decode attention (session 30's kRope, measured level in
# session 31); extra/anvil-rope-probe, the same as a probe build).
# Lease 3's probe: the RoPE + KV write kernel holds ~2.3 us of a layer between qkv's last block and
# the attention's wait, and the attention's q load ~1.0 us, which the fused kernel shares.
# A/B at batch 1 (512-token decode context), three rounds; rope-off is the variant binary with
# ANVIL_FUSED_ROPE=0 (the same kernels as main). Then the probe of the fused form, 20b and 120b.
set -uo pipefail
source "$(dirname "$0")/../session25/unpack.sh" .gpu-pack35e /tmp/lease35e
name=$(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$OUT_ROOT/gpu.txt")
echo "$name"
OUT=$OUT_ROOT/ab ANVIL_AB_BATCHES=1 ANVIL_AB_ROUNDS=3 ANVIL_AB_PREFILL=512 timeout 200 \
  bash scripts/gpu_ab.sh main=$C/anvil rope=$C/extra/anvil-rope rope-off=$C/extra/anvil-rope,ANVIL_FUSED_ROPE=0 \
  > "$OUT_ROOT/ab.txt" 2>&1
tail -n 19 "$OUT_ROOT/ab.txt"
tar -czf "$OUT_ROOT/ab.tgz" -C "$OUT_ROOT" ab && rm -rf "$OUT_ROOT/ab"
for run in gpt-oss-20b-1 gpt-oss-120b-1; do
  timeout 90 $C/extra/anvil-rope-probe bench-gpu --model configs/${run%-*} --load-format dummy --device cuda --batches 1 \
    --prefill-tokens 128 > "$OUT_ROOT/bench-$run.json" 2> "$OUT_ROOT/probe-$run.txt"
  echo "== $run: $(grep -o '"tokens_per_s": [0-9.]*' "$OUT_ROOT/bench-$run.json" | tail -1)"
done
grep -A7 "PROBE attention" "$OUT_ROOT/probe-gpt-oss-20b-1.txt"
grep -A2 "PROBE o_proj" "$OUT_ROOT/probe-gpt-oss-20b-1.txt"
(cd "$OUT_ROOT" && tar -czf probe.tgz bench-*.json probe-*.txt && rm -f bench-*.json)
