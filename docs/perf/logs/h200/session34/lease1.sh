#!/usr/bin/env bash
# Session 34's first call (carry [".gpu-pack34"]): the resident GEMV (gemv_resident.cuh, o_proj's
# whole matrix in shared memory before its wait; ANVIL_RESIDENT_GEMV=1) and the attention
# releasing o_proj before its own wait (ANVIL_X_ATTENTION_RELEASE_FIRST=1), against main's bulk
# GEMV, all one binary. The new test against the bulk GEMV bit for bit (and under memcheck), the
# GEMV, fixture and graph tests with the switch on, then a batch-1 A/B of both models (two rounds),
# then traces of 20b's batch-1 graph with and without the resident GEMV.
set -uo pipefail
source "$(dirname "$0")/../session25/unpack.sh" .gpu-pack34 /tmp/lease34a
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$OUT_ROOT/gpu.txt"
export ANVIL_FIXTURES_DIR=$PWD/$C/fixtures
T=$C/anvil_gpu_tests
timeout 100 $T --gtest_filter='CudaLinearBf16.*:Fixtures/FixtureGpuTest.*:CudaGraph*' > "$OUT_ROOT/tests.log" 2>&1
tests=$?
ANVIL_RESIDENT_GEMV=1 ANVIL_X_ATTENTION_RELEASE_FIRST=1 timeout 100 $T \
  --gtest_filter='Fixtures/FixtureGpuTest.*:CudaGraph*' > "$OUT_ROOT/tests-on.log" 2>&1
tests_on=$?
echo "tests exit $tests, with the switches on $tests_on"
grep -hE "^\[  (PASSED|FAILED) |^\[  FAILED|Failure|Expected|Which is|differ|SKIPPED" "$OUT_ROOT/tests.log" "$OUT_ROOT/tests-on.log" | head -n 16
timeout 60 /usr/local/cuda/bin/compute-sanitizer --tool memcheck --error-exitcode 9 $T \
  --gtest_filter='CudaLinearBf16.ResidentGemv*' > "$OUT_ROOT/memcheck.log" 2>&1
echo "memcheck exit $?: $(grep -E 'ERROR SUMMARY' "$OUT_ROOT/memcheck.log" | tail -n 1)"
gzip -f "$OUT_ROOT/tests.log" "$OUT_ROOT/tests-on.log"
[ "$tests" = 0 ] || exit 1
A=$C/anvil
OUT=$OUT_ROOT/ab ANVIL_AB_MODELS="gpt-oss-20b gpt-oss-120b" ANVIL_AB_BATCHES=1 ANVIL_AB_ROUNDS=2 \
  ANVIL_AB_PREFILL=512 timeout 330 bash scripts/gpu_ab.sh base=$A resident=$A,ANVIL_RESIDENT_GEMV=1 \
  both=$A,ANVIL_RESIDENT_GEMV=1,ANVIL_X_ATTENTION_RELEASE_FIRST=1 > "$OUT_ROOT/ab.txt" 2>&1
tail -n 14 "$OUT_ROOT/ab.txt"
tar -czf "$OUT_ROOT/ab.tgz" -C "$OUT_ROOT" ab && rm -rf "$OUT_ROOT/ab"
R=$PWD
cd "$OUT_ROOT"
for v in base resident; do
  on=0; [ $v = resident ] && on=1
  ANVIL_RESIDENT_GEMV=$on CUDA_INJECTION64_PATH=$R/$C/libkernel_trace.so ANVIL_TRACE_OUT=trace-$v.csv timeout 50 \
    $R/$A bench-gpu --model $R/configs/gpt-oss-20b --load-format dummy --device cuda --batches 1 --prefill-tokens 128 \
    > bench-trace.log 2>&1
  python3 $R/tools/cuda-harness/graph_timeline.py trace-$v.csv --top 12 --chain 20:34 > timeline-$v.txt 2>&1
  echo "== $v"; sed -n '3,14p;17,31p' timeline-$v.txt
done
tar -czf traces.tgz trace-*.csv && rm -f trace-*.csv
