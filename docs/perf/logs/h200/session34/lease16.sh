#!/usr/bin/env bash
# Session 34's sixteenth call (carry [".gpu-pack34p"]): the probe build of 0319c9a (extra/anvil-probe)
# with a mark after gate_up stages its token, to split gate_up's 2.6-2.8 us prologue into the
# token's staging and the scales' round trip; 20b twice, 120b once. On an H200 it then runs
# lease15's A/B (0319c9a against 701d58b at the bars' settings).
set -uo pipefail
source "$(dirname "$0")/../session25/unpack.sh" .gpu-pack34p /tmp/lease34p
name=$(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$OUT_ROOT/gpu.txt")
echo "$name"
for run in gpt-oss-20b-1 gpt-oss-20b-2 gpt-oss-120b-1; do
  timeout 60 $C/extra/anvil-probe bench-gpu --model configs/${run%-*} --load-format dummy --device cuda --batches 1 \
    --prefill-tokens 128 > "$OUT_ROOT/bench-$run.json" 2> "$OUT_ROOT/probe-$run.txt"
  echo "== $run: $(grep -o '"tokens_per_s": [0-9.]*' "$OUT_ROOT/bench-$run.json" | tail -1)"
  grep -E "PROBE (gate_up|  (waited|routing|token|prologue|loop|end) )" "$OUT_ROOT/probe-$run.txt" | head -n 7
done
(cd "$OUT_ROOT" && tar -czf probe.tgz bench-*.json probe-*.txt && rm -f bench-*.json probe-*.txt)
case "$name" in *H200*) ;; *) exit 0 ;; esac
OUT=$OUT_ROOT/ab ANVIL_AB_BATCHES=1,64 ANVIL_AB_ROUNDS=2 ANVIL_AB_PREFILL=2048 timeout 280 \
  bash scripts/gpu_ab.sh main=$C/anvil-base f16act=$C/anvil > "$OUT_ROOT/ab.txt" 2>&1
tail -n 10 "$OUT_ROOT/ab.txt"
tar -czf "$OUT_ROOT/ab.tgz" -C "$OUT_ROOT" ab && rm -rf "$OUT_ROOT/ab"
