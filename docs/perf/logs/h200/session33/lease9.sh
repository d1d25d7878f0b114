#!/usr/bin/env bash
# Session 33's ninth call (carry [".gpu-pack33m"]): main with the float32 path's tile word offset
# (mxfp4_f16_layout.h's f16_tile_word_offset): every GPU test, the float32 fixture and MoE tests
# under memcheck.
set -uo pipefail
source "$(dirname "$0")/../session25/unpack.sh" .gpu-pack33m /tmp/lease33i
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$OUT_ROOT/gpu.txt"
export ANVIL_FIXTURES_DIR=$PWD/$C/fixtures
T=$C/anvil_gpu_tests
timeout 240 $T > "$OUT_ROOT/tests.log" 2>&1
echo "tests exit $?"
grep -E "^\[  (PASSED|FAILED) |^\[  FAILED|Failure|tests ran" "$OUT_ROOT/tests.log" | head -n 12
timeout 150 /usr/local/cuda/bin/compute-sanitizer --tool memcheck --error-exitcode 9 $T \
  --gtest_filter='CudaMoe.Float32*:Fixtures/FixtureGpuTest.*' > "$OUT_ROOT/memcheck.log" 2>&1
echo "memcheck exit $?: $(grep -E 'ERROR SUMMARY' "$OUT_ROOT/memcheck.log" | tail -n 1)"
grep -E "tests ran|PASSED" "$OUT_ROOT/memcheck.log" | tail -n 2
gzip -f "$OUT_ROOT/tests.log"
