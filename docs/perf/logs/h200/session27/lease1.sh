#!/usr/bin/env bash
# Session 27's first call (carry [".gpu-pack4"]): bash docs/perf/logs/h200/session27/lease1.sh
# The pack is `ANVIL_CARRY_DIR=.gpu-pack4 bash scripts/gpu_carry.sh build-h` of the decode-graph
# key fix (src/ and tests/ of this commit; -DANVIL_CUDA_TARGETS=sm_90a -DANVIL_BUILD_TESTS=ON).
#   1. The whole GPU suite (session 26: qwen3moe-tiny's bf16 one-token steps crashed it).
#   2. compute-sanitizer memcheck over the decode-graph tests and the fixture tests.
#   3. A batch-1/8/64 base for the session (two rounds, one binary).
set -uo pipefail
source "$(dirname "$0")/../session25/unpack.sh" .gpu-pack4 /tmp/lease27
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$OUT_ROOT/gpu.txt"

ANVIL_FIXTURES_DIR=$PWD/$C/fixtures timeout 240 $C/anvil_gpu_tests > "$OUT_ROOT/gpu_tests.log" 2>&1
echo "gpu tests exit $?"
grep -E "^\[  (PASSED|FAILED) |^\[  FAILED|tests ran" "$OUT_ROOT/gpu_tests.log" | tail -n 12

SAN=/usr/local/cuda/bin/compute-sanitizer
ANVIL_FIXTURES_DIR=$PWD/$C/fixtures timeout 200 $SAN --tool memcheck --error-exitcode 9 \
  $C/anvil_gpu_tests --gtest_filter='CudaGraphTest.*:Fixtures/FixtureGpuTest.*' > "$OUT_ROOT/memcheck.log" 2>&1
echo "memcheck exit $?"
grep -E "ERROR SUMMARY|^\[  (PASSED|FAILED) |^\[  FAILED" "$OUT_ROOT/memcheck.log" | tail -n 8
gzip -f "$OUT_ROOT/memcheck.log"

OUT=$OUT_ROOT/ab ANVIL_AB_BATCHES=1,8,64 ANVIL_AB_ROUNDS=2 ANVIL_AB_PREFILL=128 timeout 120 \
  bash scripts/gpu_ab.sh main=$C/anvil > "$OUT_ROOT/ab.txt" 2>&1
tail -n 8 "$OUT_ROOT/ab.txt"
tar -czf "$OUT_ROOT/ab.tgz" -C "$OUT_ROOT" ab && rm -rf "$OUT_ROOT/ab"
