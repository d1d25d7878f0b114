#!/usr/bin/env bash
# Session 32's first call (carry [".gpu-pack32"]): batch 1's experts in one cluster launch
# (moe_experts_one_launch.cuh, ANVIL_MOE_ONE_LAUNCH=1) and session 31's gate_up token patch (in
# this build, ANVIL_MOE_ONE_LAUNCH=0), against main at 62e55e9 (anvil-base). The new tests and the
# fixture tests with the one launch forced on first, memcheck of the new test, then the A/B at
# batch 1 (128-token prefill figure), then a trace of the one launch.
set -uo pipefail
source "$(dirname "$0")/../session25/unpack.sh" .gpu-pack32 /tmp/lease32a
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$OUT_ROOT/gpu.txt"
export ANVIL_FIXTURES_DIR=$PWD/$C/fixtures
T=$C/anvil_gpu_tests
ANVIL_MOE_ONE_LAUNCH=1 timeout 90 $T --gtest_filter='CudaMoe.ExpertsInOneLaunch*:CudaMoe.SumInDown*:CudaMoe.OneLaunch*:Fixtures/FixtureGpuTest.*' \
  > "$OUT_ROOT/new_test.log" 2>&1
tests=$?
echo "tests exit $tests"
grep -E "^\[  (PASSED|FAILED) |^\[  FAILED|Failure|first values" "$OUT_ROOT/new_test.log" | head -n 12
if [ -n "${ANVIL_MEMCHECK:-1}" ] && [ "$tests" = 0 ]; then
  timeout 90 compute-sanitizer --tool memcheck $T --gtest_filter='CudaMoe.ExpertsInOneLaunch*' > "$OUT_ROOT/memcheck.log" 2>&1
  echo "memcheck exit $?: $(grep -E 'ERROR SUMMARY' "$OUT_ROOT/memcheck.log" | tail -n 1)"
fi
A=$C/anvil
one=
[ "$tests" = 0 ] && one=one=$A,ANVIL_MOE_ONE_LAUNCH=1
OUT=$OUT_ROOT/ab ANVIL_AB_MODELS="${ANVIL_AB_MODELS:-gpt-oss-20b gpt-oss-120b}" ANVIL_AB_BATCHES=1 ANVIL_AB_ROUNDS=2 \
  ANVIL_AB_PREFILL=128 timeout "${ANVIL_AB_S:-280}" \
  bash scripts/gpu_ab.sh base=$C/anvil-base two=$A,ANVIL_MOE_ONE_LAUNCH=0 $one > "$OUT_ROOT/ab.txt" 2>&1
tail -n 14 "$OUT_ROOT/ab.txt"
tar -czf "$OUT_ROOT/ab.tgz" -C "$OUT_ROOT" ab && rm -rf "$OUT_ROOT/ab"
[ "$tests" = 0 ] || exit 1
cd "$OUT_ROOT" && ANVIL_MOE_ONE_LAUNCH=1 CUDA_INJECTION64_PATH=$OLDPWD/$C/libkernel_trace.so ANVIL_TRACE_OUT=trace-one.csv \
  timeout 60 $OLDPWD/$A bench-gpu --model $OLDPWD/configs/gpt-oss-20b --load-format dummy --device cuda --batches 1 \
  --prefill-tokens 128 > bench-trace.log 2>&1
python3 $OLDPWD/tools/cuda-harness/graph_timeline.py trace-one.csv --top 14 --chain 20:34 > timeline-one.txt 2>&1
head -n 36 timeline-one.txt
gzip -f trace-one.csv
