#!/usr/bin/env bash
# Session 34's tenth call (carry [".gpu-pack34i"], lease 9's pack): what down's ~3 us token
# staging after its wait is made of. The probe build at each (early stages, release point) pair
# of {2, 0} x {0, 2}: with 0 early stages and the release after its loop nothing else is asked of
# memory while down stages its tokens (qkv's ring fills come later, down's own weights after).
set -uo pipefail
source "$(dirname "$0")/../session25/unpack.sh" .gpu-pack34i /tmp/lease34j
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$OUT_ROOT/gpu.txt"
for early in 2 0; do
  for release in 0 2; do
    for model in gpt-oss-20b; do
      ANVIL_X_DOWN_EARLY_STAGES=$early ANVIL_X_DOWN_RELEASE_AT=$release timeout 60 $C/anvil-base bench-gpu \
        --model configs/$model --load-format dummy --device cuda --batches 1 --prefill-tokens 128 \
        > "$OUT_ROOT/bench-$early-$release.json" 2> "$OUT_ROOT/probe-$early-$release.txt"
      echo "== early $early release $release: $(grep -o '"tokens_per_s": [0-9.]*' "$OUT_ROOT/bench-$early-$release.json" | tail -1)"
      grep -E "PROBE (down|  (start|waited|tokens|loop|end) )" "$OUT_ROOT/probe-$early-$release.txt" | tail -n 6
    done
  done
done
cd "$OUT_ROOT" && tar -czf probe.tgz bench-*.json probe-*.txt && rm -f bench-*.json probe-*.txt
