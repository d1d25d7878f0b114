#!/usr/bin/env bash
# Session 31's first call (carry [".gpu-pack31"]): session 30's two launches fewer per layer, plus
# gate_up reading its one token right after its wait beside the routing (OneRowToken::kAfterWait)
# where the norm and routing are one launch, each against the same binary with it off, and the
# routing's cluster at 16 blocks (ANVIL_ROUTE_CLUSTER=16) against 8:
#   1. the new bit-for-bit tests (stop if they fail)  2. memcheck over them and the fixtures'
#   one-token tests  3. A/B at batches 1 and 8, both models  4. a trace.
# The pack was built from the working tree with both fusions on the SM90 row of the kernel table.
set -uo pipefail
source "$(dirname "$0")/../session25/unpack.sh" .gpu-pack31 /tmp/lease31a
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$OUT_ROOT/gpu.txt"
export ANVIL_FIXTURES_DIR=$PWD/$C/fixtures
timeout 60 $C/anvil_gpu_tests --gtest_filter='CudaMoe.OneLaunch*:CudaFusedOps.RopeInside*:Fixtures/FixtureGpuTest.*' \
  > "$OUT_ROOT/new_test.log" 2>&1
rc=$?
grep -E "^\[  (PASSED|FAILED) |^\[  FAILED|SKIPPED" "$OUT_ROOT/new_test.log" | tail -n 12
if [ $rc -ne 0 ]; then
  tail -n 40 "$OUT_ROOT/new_test.log"
  timeout 90 /usr/local/cuda/bin/compute-sanitizer --tool memcheck $C/anvil_gpu_tests \
    --gtest_filter='CudaMoe.OneLaunch*:CudaFusedOps.RopeInside*' > "$OUT_ROOT/memcheck.log" 2>&1
  grep -E "ERROR SUMMARY|Invalid|at 0x|^\[  (PASSED|FAILED) " "$OUT_ROOT/memcheck.log" | head -n 30
  exit 1
fi
timeout 90 /usr/local/cuda/bin/compute-sanitizer --tool memcheck --error-exitcode 9 $C/anvil_gpu_tests \
  --gtest_filter='CudaMoe.OneLaunch*:CudaFusedOps.RopeInside*:Fixtures/FixtureGpuTest.OneToken*' \
  > "$OUT_ROOT/memcheck.log" 2>&1
echo "memcheck exit $?"
ANVIL_ROUTE_CLUSTER=16 timeout 60 /usr/local/cuda/bin/compute-sanitizer --tool memcheck --error-exitcode 9 \
  $C/anvil_gpu_tests --gtest_filter='CudaMoe.OneLaunch*' > "$OUT_ROOT/memcheck16.log" 2>&1
echo "16-block cluster test + memcheck exit $?"
grep -E "ERROR SUMMARY|^\[  (PASSED|FAILED) |^\[  FAILED" "$OUT_ROOT/memcheck16.log" | tail -n 4
grep -E "ERROR SUMMARY|^\[  (PASSED|FAILED) |^\[  FAILED" "$OUT_ROOT/memcheck.log" | tail -n 6
gzip -f "$OUT_ROOT/memcheck.log"
A=$C/anvil
OUT=$OUT_ROOT/ab ANVIL_AB_BATCHES=1,8 ANVIL_AB_ROUNDS=2 ANVIL_AB_PREFILL=128 timeout 290 \
  bash scripts/gpu_ab.sh off=$A,ANVIL_FUSED_ROUTE=0,ANVIL_FUSED_ROPE=0 route=$A,ANVIL_FUSED_ROPE=0 \
  rope=$A,ANVIL_FUSED_ROUTE=0 both=$A both16=$A,ANVIL_ROUTE_CLUSTER=16 > "$OUT_ROOT/ab.txt" 2>&1
tail -n 24 "$OUT_ROOT/ab.txt"
tar -czf "$OUT_ROOT/ab.tgz" -C "$OUT_ROOT" ab && rm -rf "$OUT_ROOT/ab"
CUDA_INJECTION64_PATH=$PWD/$C/libkernel_trace.so ANVIL_TRACE_OUT=$OUT_ROOT/trace-new.csv timeout 40 \
  $A bench-gpu --model configs/gpt-oss-20b --load-format dummy --device cuda --batches 1 --prefill-tokens 128 > /dev/null 2>&1
python3 tools/cuda-harness/graph_timeline.py $OUT_ROOT/trace-new.csv --top 20 --chain 20:40 > "$OUT_ROOT/timeline-new.txt" 2>&1
gzip -f $OUT_ROOT/trace-new.csv
sed -n 1,34p "$OUT_ROOT/timeline-new.txt"
