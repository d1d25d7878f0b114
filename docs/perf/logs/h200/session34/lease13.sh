#!/usr/bin/env bash
# Session 34's thirteenth call (carry [".gpu-pack34m"]): the landing candidate. Batch 1's gate_up
# hands down fp16 activations scaled by their bound (act_f16_shift, gpt-oss's clamped SwiGLU), as
# lease 12 measured behind a switch, now the default; anvil-base is main before it (701d58b).
# Every GPU test, memcheck of the sum in down, then the A/B at the bars' settings (batches 1 and
# 64, 2,048-token prefill) and batch 8, two rounds.
set -uo pipefail
source "$(dirname "$0")/../session25/unpack.sh" .gpu-pack34m /tmp/lease34m
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$OUT_ROOT/gpu.txt"
export ANVIL_FIXTURES_DIR=$PWD/$C/fixtures
T=$C/anvil_gpu_tests
timeout 300 $T > "$OUT_ROOT/tests.log" 2>&1
tests=$?
echo "tests exit $tests"
grep -hE "^\[  (PASSED|FAILED) |^\[  FAILED|Failure|Expected|Which is|differ|tests ran" "$OUT_ROOT/tests.log" | head -n 16
timeout 90 /usr/local/cuda/bin/compute-sanitizer --tool memcheck --error-exitcode 9 $T \
  --gtest_filter='CudaMoe.SumInDown*:CudaMoe.OneLaunch*' > "$OUT_ROOT/memcheck.log" 2>&1
echo "memcheck exit $?: $(grep -E 'ERROR SUMMARY' "$OUT_ROOT/memcheck.log" | tail -n 1)"
gzip -f "$OUT_ROOT/tests.log"
[ "$tests" = 0 ] || exit 1
OUT=$OUT_ROOT/ab ANVIL_AB_BATCHES=1,8,64 ANVIL_AB_ROUNDS=2 ANVIL_AB_PREFILL=2048 timeout 240 \
  bash scripts/gpu_ab.sh main=$C/anvil-base f16act=$C/anvil > "$OUT_ROOT/ab.txt" 2>&1
tail -n 10 "$OUT_ROOT/ab.txt"
tar -czf "$OUT_ROOT/ab.tgz" -C "$OUT_ROOT" ab && rm -rf "$OUT_ROOT/ab"
