#!/usr/bin/env bash
# Session 33's fourth call (carry [".gpu-pack33s"]): batch 1's routing in the output projection
# with the last block's column sums over 8 warps (lease3's: one chain of adds per column) against
# the one-launch routing it replaces
# (the same binary with ANVIL_ROUTE_IN_PROJECTION=0). The new test, the MoE, fixture and graph GPU
# tests, memcheck of the new test, then the A/B at batches 1 and 8 with the bars' 2,048-token
# prefill, both models, two rounds; then traces of both models' batch-1 graphs with the routing in
# o_proj.
set -uo pipefail
source "$(dirname "$0")/../session25/unpack.sh" .gpu-pack33s /tmp/lease33d
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$OUT_ROOT/gpu.txt"
export ANVIL_FIXTURES_DIR=$PWD/$C/fixtures
T=$C/anvil_gpu_tests
timeout 120 $T --gtest_filter='CudaMoe.RoutingInTheProjection*:CudaMoe.OneLaunch*:CudaMoe.SumInDown*:Fixtures/FixtureGpuTest.*:CudaGraph*' > "$OUT_ROOT/tests.log" 2>&1
tests=$?
echo "tests exit $tests"
grep -E "^\[  (PASSED|FAILED) |^\[  FAILED|Failure|Expected|Which is|differ" "$OUT_ROOT/tests.log" | head -n 16
if [ "$tests" = 0 ]; then
  timeout 90 /usr/local/cuda/bin/compute-sanitizer --tool memcheck --error-exitcode 9 $T \
    --gtest_filter='CudaMoe.RoutingInTheProjection*' > "$OUT_ROOT/memcheck.log" 2>&1
  echo "memcheck exit $?: $(grep -E 'ERROR SUMMARY' "$OUT_ROOT/memcheck.log" | tail -n 1)"
fi
gzip -f "$OUT_ROOT/tests.log"
[ "$tests" = 0 ] || exit 1
A=$C/anvil
OUT=$OUT_ROOT/ab ANVIL_AB_MODELS="${ANVIL_AB_MODELS:-gpt-oss-20b gpt-oss-120b}" ANVIL_AB_BATCHES=1,8 ANVIL_AB_ROUNDS=2 \
  ANVIL_AB_PREFILL=2048 timeout "${ANVIL_AB_S:-330}" \
  bash scripts/gpu_ab.sh launch=$A,ANVIL_ROUTE_IN_PROJECTION=0 routed=$A > "$OUT_ROOT/ab.txt" 2>&1
tail -n 14 "$OUT_ROOT/ab.txt"
tar -czf "$OUT_ROOT/ab.tgz" -C "$OUT_ROOT" ab && rm -rf "$OUT_ROOT/ab"
R=$PWD
cd "$OUT_ROOT"
for model in gpt-oss-20b gpt-oss-120b; do
  CUDA_INJECTION64_PATH=$R/$C/libkernel_trace.so ANVIL_TRACE_OUT=trace-$model.csv timeout 60 $R/$A bench-gpu \
    --model $R/configs/$model --load-format dummy --device cuda --batches 1 --prefill-tokens 128 > bench-trace.log 2>&1
  python3 $R/tools/cuda-harness/graph_timeline.py trace-$model.csv --top 12 --chain 20:34 > timeline-$model.txt 2>&1
  echo "== $model"; head -n 15 timeline-$model.txt | tail -n 13
done
tar -czf traces.tgz trace-*.csv && rm -f trace-*.csv
