#!/usr/bin/env bash
# Session 28's third call (carry [".gpu-pack7"]): bash docs/perf/logs/h200/session28/lease3.sh
# The pack: main at 4ed1fad plus the lease switch ANVIL_X_SUM_STAGES=4 (moe_quantized.cu): batch
# 1's down-with-sum kernel with a 4-stage ring (3 of a warp's 6 chunks requested before its
# wait, not 2; 68 KB per block, still 3 blocks per SM; 72 registers).
# `ANVIL_CARRY_DIR=.gpu-pack7 ANVIL_CARRY_VARIANTS=none ANVIL_CARRY_TRACE=1 bash scripts/gpu_carry.sh build-h`
#   1. the GPU suite with 4 stages  2. memcheck of the sum test with 4 stages
#   3. A/B 3 vs 4 stages at batch 1, three rounds  4. per-kernel traces of 20b batch 1, 3 and 4 stages.
set -uo pipefail
source "$(dirname "$0")/../session25/unpack.sh" .gpu-pack7 /tmp/lease28c
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$OUT_ROOT/gpu.txt"

ANVIL_X_SUM_STAGES=4 ANVIL_FIXTURES_DIR=$PWD/$C/fixtures timeout 230 $C/anvil_gpu_tests > "$OUT_ROOT/gpu_tests.log" 2>&1
echo "gpu tests (4 stages) exit $?"
grep -E "^\[  (PASSED|FAILED) |^\[  FAILED|tests ran" "$OUT_ROOT/gpu_tests.log" | tail -n 8
grep -E "^\[ +(OK|FAILED) .*(SumInDown|OneTokenSteps)" "$OUT_ROOT/gpu_tests.log" | head -n 8

ANVIL_X_SUM_STAGES=4 ANVIL_FIXTURES_DIR=$PWD/$C/fixtures timeout 60 /usr/local/cuda/bin/compute-sanitizer --tool memcheck \
  --error-exitcode 9 $C/anvil_gpu_tests --gtest_filter='CudaMoe.SumInDown*' > "$OUT_ROOT/memcheck.log" 2>&1
echo "memcheck exit $?"
grep -E "ERROR SUMMARY|^\[  (PASSED|FAILED) " "$OUT_ROOT/memcheck.log" | tail -n 3

A=$C/anvil
OUT=$OUT_ROOT/ab ANVIL_AB_BATCHES=1 ANVIL_AB_ROUNDS=3 ANVIL_AB_PREFILL=128 timeout 260 \
  bash scripts/gpu_ab.sh s3=$A,ANVIL_X_SUM_STAGES=3 s4=$A,ANVIL_X_SUM_STAGES=4 > "$OUT_ROOT/ab.txt" 2>&1
tail -n 14 "$OUT_ROOT/ab.txt"
tar -czf "$OUT_ROOT/ab.tgz" -C "$OUT_ROOT" ab && rm -rf "$OUT_ROOT/ab"

for v in 3 4; do
  ANVIL_X_SUM_STAGES=$v CUDA_INJECTION64_PATH=$PWD/$C/libkernel_trace.so ANVIL_TRACE_OUT=$OUT_ROOT/trace-$v.csv timeout 40 \
    $C/anvil bench-gpu --model configs/gpt-oss-20b --load-format dummy --device cuda --batches 1 \
    --prefill-tokens 128 > /dev/null 2>&1
  python3 tools/cuda-harness/graph_timeline.py $OUT_ROOT/trace-$v.csv --top 20 --chain 20:40 > "$OUT_ROOT/timeline-$v.txt" 2>&1
  gzip -f $OUT_ROOT/trace-$v.csv
done
tar -czf "$OUT_ROOT/traces.tgz" -C "$OUT_ROOT" trace-3.csv.gz trace-4.csv.gz && rm -f $OUT_ROOT/trace-*.csv.gz
grep -E "moe_|graph 2" "$OUT_ROOT/timeline-3.txt" | head -n 4
grep -E "moe_|graph 2" "$OUT_ROOT/timeline-4.txt" | head -n 4
