#!/usr/bin/env bash
# Session 34's fifth call (carry [".gpu-pack34e"]): two reorderings the phase probe (lease 4)
# pointed at, as lease switches of one binary. gate_up asks for its scales before its first
# weight stages (ANVIL_X_SCALES_FIRST=1: its prologue held a median 4.3 us after its wait); down
# loads its tokens into registers (ANVIL_X_TOKENS_BY_LOAD=1: its token staging held ~3 us after
# its wait, a cp.async group behind its weight stages). The MoE, fixture and graph tests with
# both on, a batch-1 A/B (three rounds, both models), then the probe build (anvil-base) with both.
set -uo pipefail
source "$(dirname "$0")/../session25/unpack.sh" .gpu-pack34e /tmp/lease34e
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$OUT_ROOT/gpu.txt"
export ANVIL_FIXTURES_DIR=$PWD/$C/fixtures
T=$C/anvil_gpu_tests
ANVIL_X_SCALES_FIRST=1 ANVIL_X_TOKENS_BY_LOAD=1 timeout 150 $T \
  --gtest_filter='CudaMoe.*:Fixtures/FixtureGpuTest.*:CudaGraph*' > "$OUT_ROOT/tests-on.log" 2>&1
tests=$?
echo "tests exit $tests"
grep -hE "^\[  (PASSED|FAILED) |^\[  FAILED|Failure|Expected|Which is|differ" "$OUT_ROOT/tests-on.log" | head -n 12
ANVIL_X_SCALES_FIRST=1 ANVIL_X_TOKENS_BY_LOAD=1 timeout 90 /usr/local/cuda/bin/compute-sanitizer --tool memcheck \
  --error-exitcode 9 $T --gtest_filter='CudaMoe.SumInDown*:CudaMoe.OneLaunch*' > "$OUT_ROOT/memcheck.log" 2>&1
echo "memcheck exit $?: $(grep -E 'ERROR SUMMARY' "$OUT_ROOT/memcheck.log" | tail -n 1)"
gzip -f "$OUT_ROOT/tests-on.log"
[ "$tests" = 0 ] || exit 1
A=$C/anvil
OUT=$OUT_ROOT/ab ANVIL_AB_MODELS="gpt-oss-20b gpt-oss-120b" ANVIL_AB_BATCHES=1 ANVIL_AB_ROUNDS=3 \
  ANVIL_AB_PREFILL=512 timeout 300 bash scripts/gpu_ab.sh base=$A scales=$A,ANVIL_X_SCALES_FIRST=1 \
  tokens=$A,ANVIL_X_TOKENS_BY_LOAD=1 both=$A,ANVIL_X_SCALES_FIRST=1,ANVIL_X_TOKENS_BY_LOAD=1 > "$OUT_ROOT/ab.txt" 2>&1
tail -n 25 "$OUT_ROOT/ab.txt"
tar -czf "$OUT_ROOT/ab.tgz" -C "$OUT_ROOT" ab && rm -rf "$OUT_ROOT/ab"
for sw in 0 1; do
  ANVIL_X_SCALES_FIRST=$sw ANVIL_X_TOKENS_BY_LOAD=$sw timeout 60 $C/anvil-base bench-gpu --model configs/gpt-oss-20b \
    --load-format dummy --device cuda --batches 1 --prefill-tokens 128 > "$OUT_ROOT/bench-$sw.json" 2> "$OUT_ROOT/probe-$sw.txt"
  echo "== switches $sw: $(grep -o '"tokens_per_s": [0-9.]*' "$OUT_ROOT/bench-$sw.json" | tail -1)"
  grep PROBE "$OUT_ROOT/probe-$sw.txt"
done
cd "$OUT_ROOT" && tar -czf probe.tgz bench-*.json probe-*.txt && rm -f bench-*.json probe-*.txt
