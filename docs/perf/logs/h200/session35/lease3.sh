#!/usr/bin/env bash
# Session 35's third call (carry [".gpu-pack35c"]: anvil at main, extra/anvil-probe, anvil-base at
# 701d58b). Lease 1's probe saw only the MoE kernels' stamps: without relocatable device code each
# translation unit has its own stamp table, and only moe_quantized.cu's was printed. Now each unit
# merges its table at exit. 20b and 120b at the default 512-token decode context, once each.
# On an H200 only: session 34's lease18 A/B, main (0319c9a and later) against 701d58b.
set -uo pipefail
source "$(dirname "$0")/../session25/unpack.sh" .gpu-pack35c /tmp/lease35c
name=$(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$OUT_ROOT/gpu.txt")
echo "$name"
for run in gpt-oss-20b-1 gpt-oss-120b-1; do
  timeout 90 $C/extra/anvil-probe bench-gpu --model configs/${run%-*} --load-format dummy --device cuda --batches 1 \
    --prefill-tokens 128 > "$OUT_ROOT/bench-$run.json" 2> "$OUT_ROOT/probe-$run.txt"
  echo "== $run: $(grep -o '"tokens_per_s": [0-9.]*' "$OUT_ROOT/bench-$run.json" | tail -1)"
done
grep PROBE "$OUT_ROOT/probe-gpt-oss-20b-1.txt" | grep -v "SMs with"
(cd "$OUT_ROOT" && tar -czf probe.tgz bench-*.json probe-*.txt && rm -f bench-*.json)
case "$name" in *H200*) ;; *) exit 0 ;; esac
OUT=$OUT_ROOT/ab ANVIL_AB_BATCHES=1,64 ANVIL_AB_ROUNDS=2 ANVIL_AB_PREFILL=2048 timeout 280 \
  bash scripts/gpu_ab.sh base=$C/anvil-base main=$C/anvil > "$OUT_ROOT/ab.txt" 2>&1
tail -n 10 "$OUT_ROOT/ab.txt"
tar -czf "$OUT_ROOT/ab.tgz" -C "$OUT_ROOT" ab && rm -rf "$OUT_ROOT/ab"
