#!/usr/bin/env bash
# Session 33's first call (carry [".gpu-pack33"]): batch 1's router in the output projection
# (router_sums.h; this build's default on the SM90 row) against the one-launch routing it replaces
# (the same binary with ANVIL_ROUTER_SUMS=0). The new test, the MoE, fixture and graph GPU tests,
# memcheck of the new test, then the A/B at batches 1 and 8 with the bars' 2,048-token prefill,
# both models, two rounds; then a trace of 20b's batch-1 graph with the router sums.
set -uo pipefail
source "$(dirname "$0")/../session25/unpack.sh" .gpu-pack33 /tmp/lease33a
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$OUT_ROOT/gpu.txt"
export ANVIL_FIXTURES_DIR=$PWD/$C/fixtures
T=$C/anvil_gpu_tests
timeout 120 $T --gtest_filter='CudaMoe*:Fixtures/FixtureGpuTest.*:CudaGraph*:*Fused*:*Linear*' > "$OUT_ROOT/tests.log" 2>&1
tests=$?
echo "tests exit $tests"
grep -E "^\[  (PASSED|FAILED) |^\[  FAILED|Failure|Expected|Which is|differ" "$OUT_ROOT/tests.log" | head -n 16
if [ "$tests" = 0 ]; then
  timeout 90 /usr/local/cuda/bin/compute-sanitizer --tool memcheck --error-exitcode 9 $T \
    --gtest_filter='CudaMoe.RouterSums*' > "$OUT_ROOT/memcheck.log" 2>&1
  echo "memcheck exit $?: $(grep -E 'ERROR SUMMARY' "$OUT_ROOT/memcheck.log" | tail -n 1)"
fi
gzip -f "$OUT_ROOT/tests.log"
[ "$tests" = 0 ] || exit 1
A=$C/anvil
OUT=$OUT_ROOT/ab ANVIL_AB_MODELS="${ANVIL_AB_MODELS:-gpt-oss-20b gpt-oss-120b}" ANVIL_AB_BATCHES=1,8 ANVIL_AB_ROUNDS=2 \
  ANVIL_AB_PREFILL=2048 timeout "${ANVIL_AB_S:-330}" \
  bash scripts/gpu_ab.sh launch=$A,ANVIL_ROUTER_SUMS=0 sums=$A > "$OUT_ROOT/ab.txt" 2>&1
tail -n 14 "$OUT_ROOT/ab.txt"
tar -czf "$OUT_ROOT/ab.tgz" -C "$OUT_ROOT" ab && rm -rf "$OUT_ROOT/ab"
cd "$OUT_ROOT" && CUDA_INJECTION64_PATH=$OLDPWD/$C/libkernel_trace.so ANVIL_TRACE_OUT=trace-sums.csv \
  timeout 60 $OLDPWD/$A bench-gpu --model $OLDPWD/configs/gpt-oss-20b --load-format dummy --device cuda --batches 1 \
  --prefill-tokens 128 > bench-trace.log 2>&1
python3 $OLDPWD/tools/cuda-harness/graph_timeline.py trace-sums.csv --top 14 --chain 20:34 > timeline-sums.txt 2>&1
head -n 36 timeline-sums.txt
gzip -f trace-sums.csv
