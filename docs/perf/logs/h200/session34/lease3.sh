#!/usr/bin/env bash
# Session 34's third call (carry [".gpu-pack34c"]): the resident o_proj asking for only its first
# ANVIL_RESIDENT_EARLY_KB KB of each 8 KB row before its wait and the rest right after it (lease 1:
# all 8 before the wait cost the attention what o_proj saved, on an H100). The bit-for-bit test at
# 8, 5 and 0 early pieces, the graph and fixture tests with 6, a batch-1 A/B of 5, 6, 7 and 8
# against main's bulk GEMV (three rounds), then a 20b trace at 6.
set -uo pipefail
source "$(dirname "$0")/../session25/unpack.sh" .gpu-pack34c /tmp/lease34c
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$OUT_ROOT/gpu.txt"
export ANVIL_FIXTURES_DIR=$PWD/$C/fixtures
T=$C/anvil_gpu_tests
tests=0
for early in 8 5 0; do
  ANVIL_RESIDENT_EARLY_KB=$early timeout 60 $T --gtest_filter='CudaLinearBf16.Resident*' > "$OUT_ROOT/tests-$early.log" 2>&1 || tests=1
done
ANVIL_RESIDENT_GEMV=1 ANVIL_RESIDENT_EARLY_KB=6 timeout 100 $T --gtest_filter='Fixtures/FixtureGpuTest.*:CudaGraph*' \
  > "$OUT_ROOT/tests-on.log" 2>&1 || tests=1
echo "tests exit $tests"
grep -hE "^\[  (PASSED|FAILED) |^\[  FAILED|Failure|Expected|Which is|differ|SKIPPED" "$OUT_ROOT"/tests-*.log | head -n 16
ANVIL_RESIDENT_EARLY_KB=5 timeout 60 /usr/local/cuda/bin/compute-sanitizer --tool memcheck --error-exitcode 9 $T \
  --gtest_filter='CudaLinearBf16.Resident*' > "$OUT_ROOT/memcheck.log" 2>&1
echo "memcheck exit $?: $(grep -E 'ERROR SUMMARY' "$OUT_ROOT/memcheck.log" | tail -n 1)"
tar -czf "$OUT_ROOT/tests.tgz" -C "$OUT_ROOT" $(cd "$OUT_ROOT" && ls tests-*.log) && rm -f "$OUT_ROOT"/tests-*.log
[ "$tests" = 0 ] || exit 1
A=$C/anvil
R=ANVIL_RESIDENT_GEMV=1
OUT=$OUT_ROOT/ab ANVIL_AB_MODELS="gpt-oss-20b gpt-oss-120b" ANVIL_AB_BATCHES=1 ANVIL_AB_ROUNDS=3 \
  ANVIL_AB_PREFILL=512 timeout 300 bash scripts/gpu_ab.sh base=$A e5=$A,$R,ANVIL_RESIDENT_EARLY_KB=5 \
  e6=$A,$R,ANVIL_RESIDENT_EARLY_KB=6 e7=$A,$R,ANVIL_RESIDENT_EARLY_KB=7 e8=$A,$R > "$OUT_ROOT/ab.txt" 2>&1
tail -n 31 "$OUT_ROOT/ab.txt"
tar -czf "$OUT_ROOT/ab.tgz" -C "$OUT_ROOT" ab && rm -rf "$OUT_ROOT/ab"
RD=$PWD
cd "$OUT_ROOT"
ANVIL_RESIDENT_GEMV=1 ANVIL_RESIDENT_EARLY_KB=6 CUDA_INJECTION64_PATH=$RD/$C/libkernel_trace.so ANVIL_TRACE_OUT=trace-e6.csv \
  timeout 50 $RD/$A bench-gpu --model $RD/configs/gpt-oss-20b --load-format dummy --device cuda --batches 1 \
  --prefill-tokens 128 > bench-trace.log 2>&1
python3 $RD/tools/cuda-harness/graph_timeline.py trace-e6.csv --top 12 --chain 20:34 > timeline-e6.txt 2>&1
sed -n '17,31p' timeline-e6.txt
rm -f trace-*.csv
