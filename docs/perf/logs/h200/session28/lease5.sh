#!/usr/bin/env bash
# Session 28's fifth call (carry [".gpu-pack5"]): bash docs/perf/logs/h200/session28/lease5.sh
# Session 27's pack again (anvil-base = 3ab2cd3, anvil = the sum-in-down kernels that landed in
# 4ed1fad): every bar's figure (prefill 2048, batches 1 and 64) for both, two rounds, on whatever
# card comes (lease1 was an H100; the bars are an H200's).
set -uo pipefail
source "$(dirname "$0")/../session25/unpack.sh" .gpu-pack5 /tmp/lease28e
OUT=$OUT_ROOT/ab ANVIL_AB_BATCHES=1,64 ANVIL_AB_ROUNDS=2 ANVIL_AB_PREFILL=2048 timeout 400 \
  bash scripts/gpu_ab.sh base=$C/anvil-base sumdown=$C/anvil > "$OUT_ROOT/ab.txt" 2>&1
tail -n 12 "$OUT_ROOT/ab.txt"
tar -czf "$OUT_ROOT/ab.tgz" -C "$OUT_ROOT" ab && rm -rf "$OUT_ROOT/ab"
