#!/usr/bin/env bash
# Session 28's second call (carry [".gpu-pack6"]): bash docs/perf/logs/h200/session28/lease2.sh
# The pack: main at 4ed1fad plus the lease switch ANVIL_X_PREFETCH (launch.cuh), whose bits have
# kernels ask L2 for their weights up front with cp.async.bulk.prefetch.L2: 1 batch-1 gate_up
# (each block its tiles' rows, right after it learns its expert), 2 the bulk GEMV (each row's
# bytes past the ring's first fill, right after the wait), 4 batch-1 down (before its wait).
# `ANVIL_CARRY_DIR=.gpu-pack6 ANVIL_CARRY_VARIANTS=none ANVIL_CARRY_TRACE=1 bash scripts/gpu_carry.sh build-h`
#   1. the GPU suite with every bit on  2. A/B of 0, 1, 2, 4, 7 at batch 1, two rounds
#   3. per-kernel traces of 20b batch 1 with 0 and 7.
set -uo pipefail
source "$(dirname "$0")/../session25/unpack.sh" .gpu-pack6 /tmp/lease28b
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$OUT_ROOT/gpu.txt"

ANVIL_X_PREFETCH=7 ANVIL_FIXTURES_DIR=$PWD/$C/fixtures timeout 150 $C/anvil_gpu_tests > "$OUT_ROOT/gpu_tests.log" 2>&1
echo "gpu tests (prefetch 7) exit $?"
grep -E "^\[  (PASSED|FAILED) |^\[  FAILED|tests ran" "$OUT_ROOT/gpu_tests.log" | tail -n 8

A=$C/anvil
OUT=$OUT_ROOT/ab ANVIL_AB_BATCHES=1 ANVIL_AB_ROUNDS=2 ANVIL_AB_PREFILL=128 timeout 330 \
  bash scripts/gpu_ab.sh off=$A,ANVIL_X_PREFETCH=0 p1=$A,ANVIL_X_PREFETCH=1 p2=$A,ANVIL_X_PREFETCH=2 \
  p4=$A,ANVIL_X_PREFETCH=4 p7=$A,ANVIL_X_PREFETCH=7 > "$OUT_ROOT/ab.txt" 2>&1
tail -n 22 "$OUT_ROOT/ab.txt"
tar -czf "$OUT_ROOT/ab.tgz" -C "$OUT_ROOT" ab && rm -rf "$OUT_ROOT/ab"

for v in 0 7; do
  ANVIL_X_PREFETCH=$v CUDA_INJECTION64_PATH=$PWD/$C/libkernel_trace.so ANVIL_TRACE_OUT=$OUT_ROOT/trace-$v.csv timeout 40 \
    $C/anvil bench-gpu --model configs/gpt-oss-20b --load-format dummy --device cuda --batches 1 \
    --prefill-tokens 128 > /dev/null 2>&1
  python3 tools/cuda-harness/graph_timeline.py $OUT_ROOT/trace-$v.csv --top 20 --chain 20:40 > "$OUT_ROOT/timeline-$v.txt" 2>&1
  gzip -f $OUT_ROOT/trace-$v.csv
done
tar -czf "$OUT_ROOT/traces.tgz" -C "$OUT_ROOT" trace-0.csv.gz trace-7.csv.gz && rm -f $OUT_ROOT/trace-*.csv.gz
head -n 30 "$OUT_ROOT/timeline-7.txt"
