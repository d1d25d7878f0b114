#!/usr/bin/env bash
# Session 35's first call (carry [".gpu-pack35p"]: anvil at f664f9e, extra/anvil-probe, and anvil-base
# at 701d58b, taken from session 34's .gpu-pack34r).
# 1. The main build (anvil) at the bars' batch-1 settings, twice per model: step_ms against the new
#    graph_replay_ms (the device's share of a step), i.e. what the host adds between replays.
# 2. The probe build (extra/anvil-probe) now stamps every batch-1 kernel of a layer: qkv, RoPE,
#    attention, o_proj, routing, gate_up and down. 20b at the default 512-token decode context twice
#    and at 128 once, 120b at 512 once.
# 3. On an H200 only: session 34's lease18 A/B, 0319c9a (here f664f9e) against 701d58b.
set -uo pipefail
source "$(dirname "$0")/../session25/unpack.sh" .gpu-pack35p /tmp/lease35a
cp $C/anvil /tmp/anvil-main; cp $C/extra/anvil-probe /tmp/anvil-probe
name=$(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$OUT_ROOT/gpu.txt")
echo "$name"
for run in gpt-oss-20b-1 gpt-oss-20b-2 gpt-oss-120b-1 gpt-oss-120b-2; do
  timeout 90 /tmp/anvil-main bench-gpu --model configs/${run%-*} --load-format dummy --device cuda --batches 1 \
    --prefill-tokens 128 --decode-steps 64 > "$OUT_ROOT/replay-$run.json" 2> "$OUT_ROOT/replay-$run.log"
  echo "== $run: $(grep -oE '"(tokens_per_s|step_ms|graph_replay_ms)": [0-9.]*' "$OUT_ROOT/replay-$run.json" | tail -3 | tr '\n' ' ')"
done
for run in gpt-oss-20b-512-1 gpt-oss-20b-512-2 gpt-oss-20b-128-1 gpt-oss-120b-512-1; do
  model=${run%-*}; context=${model##*-}; model=${model%-*}
  timeout 90 /tmp/anvil-probe bench-gpu --model configs/$model --load-format dummy --device cuda --batches 1 \
    --prefill-tokens 128 --decode-prompt $context > "$OUT_ROOT/bench-$run.json" 2> "$OUT_ROOT/probe-$run.txt"
  echo "== $run: $(grep -o '"tokens_per_s": [0-9.]*' "$OUT_ROOT/bench-$run.json" | tail -1)"
done
grep PROBE "$OUT_ROOT/probe-gpt-oss-20b-512-1.txt" | grep -v "SMs with"
(cd "$OUT_ROOT" && tar -czf probe.tgz bench-*.json probe-*.txt replay-* && rm -f bench-*.json replay-*)
case "$name" in *H200*) ;; *) exit 0 ;; esac
OUT=$OUT_ROOT/ab ANVIL_AB_BATCHES=1,64 ANVIL_AB_ROUNDS=2 ANVIL_AB_PREFILL=2048 timeout 280 \
  bash scripts/gpu_ab.sh main=$C/anvil-base f664f9e=$C/anvil > "$OUT_ROOT/ab.txt" 2>&1
tail -n 10 "$OUT_ROOT/ab.txt"
tar -czf "$OUT_ROOT/ab.tgz" -C "$OUT_ROOT" ab && rm -rf "$OUT_ROOT/ab"
