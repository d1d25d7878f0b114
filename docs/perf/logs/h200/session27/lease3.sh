#!/usr/bin/env bash
# (The candidate is sum-in-down.patch here, applied to 3ab2cd3; see README.md.)
# Session 27's third call (carry [".gpu-pack5"]): bash docs/perf/logs/h200/session27/lease3.sh
# lease2.sh's pack rebuilt after its call hung the GPU suite: the candidate's down kernel shuffled
# inside a loop that lanes leave early where a warp's k part has under 32 scale words (the fixtures'
# tiny shapes; gpt-oss-20b's parts have 96). Same base.
#   1. The candidate's whole GPU suite.  2. memcheck over the graph, fixture and new tests.
#   (No A/B: the session's device time was nearly spent; lease2-h100's A/B ran the same kernels on
#   gpt-oss-20b and -120b, whose k parts never took the hung path.)
set -uo pipefail
source "$(dirname "$0")/../session25/unpack.sh" .gpu-pack5 /tmp/lease27c
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$OUT_ROOT/gpu.txt"

ANVIL_FIXTURES_DIR=$PWD/$C/fixtures timeout 140 $C/anvil_gpu_tests > "$OUT_ROOT/gpu_tests.log" 2>&1
echo "gpu tests exit $?"
grep -E "^\[  (PASSED|FAILED) |^\[  FAILED|tests ran" "$OUT_ROOT/gpu_tests.log" | tail -n 12
grep -E "^\[ +(OK|FAILED) .*(SumInDown|NormedToken|DecodeIntoCaches|OneTokenSteps|Chained)" "$OUT_ROOT/gpu_tests.log" | head -n 12

SAN=/usr/local/cuda/bin/compute-sanitizer
ANVIL_FIXTURES_DIR=$PWD/$C/fixtures timeout 90 $SAN --tool memcheck --error-exitcode 9 $C/anvil_gpu_tests \
  --gtest_filter='CudaGraphTest.DecodeInto*:Fixtures/FixtureGpuTest.OneToken*:CudaMoe.SumInDown*:CudaLinearBf16.Normed*' \
  > "$OUT_ROOT/memcheck.log" 2>&1
echo "memcheck exit $?"
grep -E "ERROR SUMMARY|^\[  (PASSED|FAILED) |^\[  FAILED" "$OUT_ROOT/memcheck.log" | tail -n 8
gzip -f "$OUT_ROOT/memcheck.log"

