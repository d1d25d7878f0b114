#!/usr/bin/env bash
# (The candidate is sum-in-down.patch here, applied to 3ab2cd3; see README.md.)
# Session 27 built this pack (lease3.sh): the candidate with the shuffle fix; its suite has not yet run to the end.
# Session 28's first call (carry [".gpu-pack5"]): bash docs/perf/logs/h200/session28/lease1.sh
# The pack: `ANVIL_CARRY_DIR=.gpu-pack5 bash scripts/gpu_carry.sh build-h BASE` where build-h holds
# the candidate (batch 1's MoE sum made inside down, the next qkv making its own norm) and BASE is
# the anvil of 3ab2cd3 (main with the decode-graph key fix), both -DANVIL_CUDA_TARGETS=sm_90a.
#   1. The candidate's whole GPU suite (the graph-key fix's tests included).
#   2. A/B base vs candidate, batches 1, 8, 64, two rounds.
#   3. compute-sanitizer memcheck over the graph, fixture and new tests.
set -uo pipefail
source "$(dirname "$0")/../session25/unpack.sh" .gpu-pack5 /tmp/lease28a
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$OUT_ROOT/gpu.txt"

ANVIL_FIXTURES_DIR=$PWD/$C/fixtures timeout 200 $C/anvil_gpu_tests > "$OUT_ROOT/gpu_tests.log" 2>&1
echo "gpu tests exit $?"
grep -E "^\[  (PASSED|FAILED) |^\[  FAILED|tests ran" "$OUT_ROOT/gpu_tests.log" | tail -n 12
grep -E "SumInDown|NormedToken|DecodeIntoCaches|OneTokenSteps" "$OUT_ROOT/gpu_tests.log" | grep -E "OK|FAILED" | head

OUT=$OUT_ROOT/ab ANVIL_AB_BATCHES=1,8,64 ANVIL_AB_ROUNDS=2 ANVIL_AB_PREFILL=128 timeout 220 \
  bash scripts/gpu_ab.sh base=$C/anvil-base sumdown=$C/anvil > "$OUT_ROOT/ab.txt" 2>&1
tail -n 8 "$OUT_ROOT/ab.txt"
tar -czf "$OUT_ROOT/ab.tgz" -C "$OUT_ROOT" ab && rm -rf "$OUT_ROOT/ab"

SAN=/usr/local/cuda/bin/compute-sanitizer
ANVIL_FIXTURES_DIR=$PWD/$C/fixtures timeout 120 $SAN --tool memcheck --error-exitcode 9 $C/anvil_gpu_tests \
  --gtest_filter='CudaGraphTest.DecodeInto*:Fixtures/FixtureGpuTest.OneToken*:CudaMoe.SumInDown*:CudaLinearBf16.Normed*' \
  > "$OUT_ROOT/memcheck.log" 2>&1
echo "memcheck exit $?"
grep -E "ERROR SUMMARY|^\[  (PASSED|FAILED) |^\[  FAILED" "$OUT_ROOT/memcheck.log" | tail -n 8
gzip -f "$OUT_ROOT/memcheck.log"
