#!/usr/bin/env bash
# Session 34's twelfth call (carry [".gpu-pack34l"]): gate_up writing batch 1's activations as
# fp16 already scaled by the power of two their bound gives (ANVIL_X_ACT_F16=1), so that down
# stages them with no largest magnitude to find and no conversion (lease 11: ~2 us of down's
# chain after its tokens land). The MoE, fixture and graph tests with it on (SumInDown compares
# it with the combine path's bf16 activations bit for bit), memcheck, a batch-1 A/B (three
# rounds, both models), the probe build with it on.
set -uo pipefail
source "$(dirname "$0")/../session25/unpack.sh" .gpu-pack34l /tmp/lease34l
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$OUT_ROOT/gpu.txt"
export ANVIL_FIXTURES_DIR=$PWD/$C/fixtures
T=$C/anvil_gpu_tests
ANVIL_X_ACT_F16=1 timeout 150 $T --gtest_filter='CudaMoe.*:Fixtures/FixtureGpuTest.*:CudaGraph*' > "$OUT_ROOT/tests-on.log" 2>&1
tests=$?
echo "tests exit $tests"
grep -hE "^\[  (PASSED|FAILED) |^\[  FAILED|Failure|Expected|Which is|differ" "$OUT_ROOT/tests-on.log" | head -n 16
ANVIL_X_ACT_F16=1 timeout 90 /usr/local/cuda/bin/compute-sanitizer --tool memcheck --error-exitcode 9 $T \
  --gtest_filter='CudaMoe.SumInDown*' > "$OUT_ROOT/memcheck.log" 2>&1
echo "memcheck exit $?: $(grep -E 'ERROR SUMMARY' "$OUT_ROOT/memcheck.log" | tail -n 1)"
gzip -f "$OUT_ROOT/tests-on.log"
A=$C/anvil
OUT=$OUT_ROOT/ab ANVIL_AB_MODELS="gpt-oss-20b gpt-oss-120b" ANVIL_AB_BATCHES=1 ANVIL_AB_ROUNDS=3 \
  ANVIL_AB_PREFILL=512 timeout 300 bash scripts/gpu_ab.sh base=$A f16=$A,ANVIL_X_ACT_F16=1 > "$OUT_ROOT/ab.txt" 2>&1
tail -n 13 "$OUT_ROOT/ab.txt"
tar -czf "$OUT_ROOT/ab.tgz" -C "$OUT_ROOT" ab && rm -rf "$OUT_ROOT/ab"
ANVIL_X_ACT_F16=1 timeout 60 $C/anvil-base bench-gpu --model configs/gpt-oss-20b --load-format dummy --device cuda \
  --batches 1 --prefill-tokens 128 > "$OUT_ROOT/bench-f16.json" 2> "$OUT_ROOT/probe-f16.txt"
echo "== probe, f16 activations: $(grep -o '"tokens_per_s": [0-9.]*' "$OUT_ROOT/bench-f16.json" | tail -1)"
grep -E "PROBE (down|  (waited|landed|tokens|loop|end) )" "$OUT_ROOT/probe-f16.txt" | tail -n 6
cd "$OUT_ROOT" && tar -czf probe.tgz bench-*.json probe-*.txt && rm -f bench-*.json probe-*.txt
