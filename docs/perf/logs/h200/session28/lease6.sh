#!/usr/bin/env bash
# Session 28's sixth call (carry [".gpu-pack9"]): bash docs/perf/logs/h200/session28/lease6.sh
# Where batch 1's down spends its ~11 us past gate_up's end (lease4's H200 trace): the pack is main
# at 4ed1fad plus `moe-stamps-probe.patch` (per-block %globaltimer stamps in gate_up and down,
# written out by bench-gpu under ANVIL_X_STAMPS; the last layer of the last step).
# `ANVIL_CARRY_DIR=.gpu-pack9 ANVIL_CARRY_VARIANTS=none ANVIL_CARRY_TESTS=0 bash scripts/gpu_carry.sh build-h`
set -uo pipefail
source "$(dirname "$0")/../session25/unpack.sh" .gpu-pack9 /tmp/lease28f
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$OUT_ROOT/gpu.txt"
for m in gpt-oss-20b gpt-oss-120b; do
  ANVIL_X_STAMPS=$OUT_ROOT/stamps-$m.csv timeout 120 $C/anvil bench-gpu --model configs/$m --load-format dummy \
    --device cuda --batches 1 --prefill-tokens 128 > "$OUT_ROOT/bench-$m.json" 2> "$OUT_ROOT/bench-$m.err"
  echo "== $m: $(grep -o '"tokens_per_s": [0-9.]*' "$OUT_ROOT/bench-$m.json" | tail -1)"
  python3 docs/perf/logs/h200/session28/stamps_summary.py "$OUT_ROOT/stamps-$m.csv"
done
