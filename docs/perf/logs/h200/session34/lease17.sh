#!/usr/bin/env bash
# Session 34's seventeenth call (carry [".gpu-pack34q"]): the one-launch routing stages gate_up's
# token itself (NormRoute::h16: h as fp16, per k part times its power of two), so gate_up copies its
# part instead of finding its largest magnitude and converting it (lease 16: the token was staged
# ~2.3 us after gate_up's routing read, ~0.5 us before its scales). One binary; ANVIL_X_TOKEN16=0
# turns it off (lease-only switch). The MoE, fixture and graph tests (OneLaunchRouting compares the
# one-launch path's residual with the two-kernel path's bit for bit), memcheck, a batch-1 A/B.
set -uo pipefail
source "$(dirname "$0")/../session25/unpack.sh" .gpu-pack34q /tmp/lease34q
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$OUT_ROOT/gpu.txt"
export ANVIL_FIXTURES_DIR=$PWD/$C/fixtures
T=$C/anvil_gpu_tests
timeout 150 $T --gtest_filter='CudaMoe.*:Fixtures/FixtureGpuTest.*:CudaGraph*' > "$OUT_ROOT/tests.log" 2>&1
tests=$?
echo "tests exit $tests"
grep -hE "^\[  (PASSED|FAILED) |^\[  FAILED|Failure|Expected|Which is|differ" "$OUT_ROOT/tests.log" | head -n 12
timeout 90 /usr/local/cuda/bin/compute-sanitizer --tool memcheck --error-exitcode 9 $T \
  --gtest_filter='CudaMoe.OneLaunch*' > "$OUT_ROOT/memcheck.log" 2>&1
echo "memcheck exit $?: $(grep -E 'ERROR SUMMARY' "$OUT_ROOT/memcheck.log" | tail -n 1)"
gzip -f "$OUT_ROOT/tests.log"
[ "$tests" = 0 ] || exit 1
A=$C/anvil
OUT=$OUT_ROOT/ab ANVIL_AB_MODELS="gpt-oss-20b gpt-oss-120b" ANVIL_AB_BATCHES=1 ANVIL_AB_ROUNDS=3 \
  ANVIL_AB_PREFILL=512 timeout 240 bash scripts/gpu_ab.sh off=$A,ANVIL_X_TOKEN16=0 token16=$A > "$OUT_ROOT/ab.txt" 2>&1
tail -n 13 "$OUT_ROOT/ab.txt"
tar -czf "$OUT_ROOT/ab.tgz" -C "$OUT_ROOT" ab && rm -rf "$OUT_ROOT/ab"
