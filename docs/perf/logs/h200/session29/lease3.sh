#!/usr/bin/env bash
# Session 29's third call (carry [".gpu-pack13"]): down-with-sum keeping its scales as E8M0 words
# too. The pack's anvil has both kernels' raw scales (B); its anvil-base has gate_up's only (A,
# what lease1/lease2 measured as raw3). To rebuild: A is main at this folder's first commit with
# down_sum's raw-scale hunks reverted; B is that commit.
#   1. the whole GPU suite on B  2. memcheck over the MoE and graph tests  3. A/B, batches 1 and 8.
set -uo pipefail
source "$(dirname "$0")/../session25/unpack.sh" .gpu-pack13 /tmp/lease29c
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$OUT_ROOT/gpu.txt"
ANVIL_FIXTURES_DIR=$PWD/$C/fixtures timeout 230 $C/anvil_gpu_tests > "$OUT_ROOT/gpu_tests.log" 2>&1
echo "gpu tests exit $?"
grep -E "^\[  (PASSED|FAILED) |^\[  FAILED|tests ran" "$OUT_ROOT/gpu_tests.log" | tail -n 8
ANVIL_FIXTURES_DIR=$PWD/$C/fixtures timeout 120 /usr/local/cuda/bin/compute-sanitizer --tool memcheck --error-exitcode 9 \
  $C/anvil_gpu_tests --gtest_filter='CudaGraphTest.DecodeInto*:Fixtures/FixtureGpuTest.OneToken*:CudaMoe*' \
  > "$OUT_ROOT/memcheck.log" 2>&1
echo "memcheck exit $?"
grep -E "ERROR SUMMARY|^\[  (PASSED|FAILED) |^\[  FAILED" "$OUT_ROOT/memcheck.log" | tail -n 8
gzip -f "$OUT_ROOT/memcheck.log"
OUT=$OUT_ROOT/ab ANVIL_AB_BATCHES=1,8 ANVIL_AB_ROUNDS=3 ANVIL_AB_PREFILL=128 timeout 250 \
  bash scripts/gpu_ab.sh gateraw=$C/anvil-base bothraw=$C/anvil > "$OUT_ROOT/ab.txt" 2>&1
tail -n 14 "$OUT_ROOT/ab.txt"
tar -czf "$OUT_ROOT/ab.tgz" -C "$OUT_ROOT" ab && rm -rf "$OUT_ROOT/ab"
