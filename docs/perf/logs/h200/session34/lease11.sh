#!/usr/bin/env bash
# Session 34's eleventh call (carry [".gpu-pack34k"]): the probe with finer marks. gate_up: its
# routing read back (after its wait), its prologue, its loop; down: its tokens landed (warp 0),
# their largest magnitudes found, their fp16 form staged, its loop. Main's settings, both models,
# two runs each.
set -uo pipefail
source "$(dirname "$0")/../session25/unpack.sh" .gpu-pack34k /tmp/lease34k
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$OUT_ROOT/gpu.txt"
for model in gpt-oss-20b gpt-oss-120b; do
  for run in 1 2; do
    timeout 60 $C/anvil-base bench-gpu --model configs/$model --load-format dummy --device cuda --batches 1 \
      --prefill-tokens 128 > "$OUT_ROOT/bench-$model-$run.json" 2> "$OUT_ROOT/probe-$model-$run.txt"
    echo "== $model run $run: $(grep -o '"tokens_per_s": [0-9.]*' "$OUT_ROOT/bench-$model-$run.json" | tail -1)"
    grep PROBE "$OUT_ROOT/probe-$model-$run.txt" | grep -v "SMs with"
  done
done
cd "$OUT_ROOT" && tar -czf probe.tgz bench-*.json probe-*.txt && rm -f bench-*.json probe-*.txt
