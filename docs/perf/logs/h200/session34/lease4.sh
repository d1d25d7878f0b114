#!/usr/bin/env bash
# Session 34's fourth call (carry [".gpu-pack34d"]): where batch 1's gate_up and down spend their
# time, block by block. anvil-base is main built with -DANVIL_PHASE_PROBE (phase-probe.patch):
# thread 0 of each block of the last gate_up and down launches stamps %globaltimer at its start,
# after its wait, after its prologue / tokens, after its chunk loop and at its end; the percentiles
# against gate_up's last block end are printed at exit. Both models, batch 1, three runs each.
set -uo pipefail
source "$(dirname "$0")/../session25/unpack.sh" .gpu-pack34d /tmp/lease34d
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$OUT_ROOT/gpu.txt"
for model in gpt-oss-20b gpt-oss-120b; do
  for run in 1 2 3; do
    timeout 60 $C/anvil-base bench-gpu --model configs/$model --load-format dummy --device cuda --batches 1 \
      --prefill-tokens 128 > "$OUT_ROOT/bench-$model-$run.json" 2> "$OUT_ROOT/probe-$model-$run.txt"
    echo "== $model run $run: $(grep -o '"tokens_per_s": [0-9.]*' "$OUT_ROOT/bench-$model-$run.json" | tail -1)"
    grep PROBE "$OUT_ROOT/probe-$model-$run.txt"
  done
done
cd "$OUT_ROOT" && tar -czf probe.tgz bench-*.json probe-*.txt && rm -f bench-*.json probe-*.txt
