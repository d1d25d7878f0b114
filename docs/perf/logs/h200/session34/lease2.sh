#!/usr/bin/env bash
# Session 34's second call (carry [".gpu-pack34b"]): batch 1's down + sum with each warp's whole
# share of k in shared memory before its wait (moe_down_sum_resident.cuh, ANVIL_RESIDENT_DOWN=1),
# alone and with the resident o_proj (ANVIL_RESIDENT_GEMV=1), against main's kernels, one binary.
# The new tests bit for bit (and under memcheck), the MoE, fixture and graph tests with both
# switches on, a batch-1 A/B of both models (three rounds), then 20b traces.
set -uo pipefail
source "$(dirname "$0")/../session25/unpack.sh" .gpu-pack34b /tmp/lease34b
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$OUT_ROOT/gpu.txt"
export ANVIL_FIXTURES_DIR=$PWD/$C/fixtures
T=$C/anvil_gpu_tests
timeout 120 $T --gtest_filter='CudaMoe.*:CudaLinearBf16.Resident*:Fixtures/FixtureGpuTest.*:CudaGraph*' > "$OUT_ROOT/tests.log" 2>&1
tests=$?
ANVIL_RESIDENT_GEMV=1 ANVIL_RESIDENT_DOWN=1 timeout 100 $T \
  --gtest_filter='Fixtures/FixtureGpuTest.*:CudaGraph*:CudaMoe.SumInDown*' > "$OUT_ROOT/tests-on.log" 2>&1
tests_on=$?
echo "tests exit $tests, with the switches on $tests_on"
grep -hE "^\[  (PASSED|FAILED) |^\[  FAILED|Failure|Expected|Which is|differ|SKIPPED" "$OUT_ROOT/tests.log" "$OUT_ROOT/tests-on.log" | head -n 16
timeout 90 /usr/local/cuda/bin/compute-sanitizer --tool memcheck --error-exitcode 9 $T \
  --gtest_filter='CudaMoe.ResidentSumInDown*' > "$OUT_ROOT/memcheck.log" 2>&1
echo "memcheck exit $?: $(grep -E 'ERROR SUMMARY' "$OUT_ROOT/memcheck.log" | tail -n 1)"
gzip -f "$OUT_ROOT/tests.log" "$OUT_ROOT/tests-on.log"
[ "$tests" = 0 ] || exit 1
A=$C/anvil
OUT=$OUT_ROOT/ab ANVIL_AB_MODELS="gpt-oss-20b gpt-oss-120b" ANVIL_AB_BATCHES=1 ANVIL_AB_ROUNDS=3 \
  ANVIL_AB_PREFILL=512 timeout 300 bash scripts/gpu_ab.sh base=$A down=$A,ANVIL_RESIDENT_DOWN=1 \
  both=$A,ANVIL_RESIDENT_DOWN=1,ANVIL_RESIDENT_GEMV=1 > "$OUT_ROOT/ab.txt" 2>&1
tail -n 20 "$OUT_ROOT/ab.txt"
tar -czf "$OUT_ROOT/ab.tgz" -C "$OUT_ROOT" ab && rm -rf "$OUT_ROOT/ab"
R=$PWD
cd "$OUT_ROOT"
for v in down both; do
  g=0; [ $v = both ] && g=1
  ANVIL_RESIDENT_DOWN=1 ANVIL_RESIDENT_GEMV=$g CUDA_INJECTION64_PATH=$R/$C/libkernel_trace.so ANVIL_TRACE_OUT=trace-$v.csv \
    timeout 50 $R/$A bench-gpu --model $R/configs/gpt-oss-20b --load-format dummy --device cuda --batches 1 \
    --prefill-tokens 128 > bench-trace.log 2>&1
  python3 $R/tools/cuda-harness/graph_timeline.py trace-$v.csv --top 12 --chain 20:34 > timeline-$v.txt 2>&1
  echo "== $v"; sed -n '3,14p;17,31p' timeline-$v.txt
done
tar -czf traces.tgz trace-*.csv timeline-*.txt && rm -f trace-*.csv
