#!/usr/bin/env bash
# Session 32's third call (carry [".gpu-pack32t"]): session 31's gate_up token patch (this build:
# gate_up stages the one-row token while its first scales come from DRAM) against main at 62e55e9
# (anvil-base), at batch 1 with the bars' 2,048-token prefill, both models, two rounds; the
# one-launch routing as a 16-block cluster (ANVIL_ROUTE_CLUSTER=16) on the H200 beside them. The
# MoE and fixture GPU tests first.
set -uo pipefail
source "$(dirname "$0")/../session25/unpack.sh" .gpu-pack32t /tmp/lease32c
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$OUT_ROOT/gpu.txt"
export ANVIL_FIXTURES_DIR=$PWD/$C/fixtures
timeout 90 $C/anvil_gpu_tests --gtest_filter='CudaMoe*:Fixtures/FixtureGpuTest.*:CudaGraphTest.*' > "$OUT_ROOT/tests.log" 2>&1
echo "tests exit $?"
grep -E "^\[  (PASSED|FAILED) |^\[  FAILED" "$OUT_ROOT/tests.log" | head -n 8
A=$C/anvil
OUT=$OUT_ROOT/ab ANVIL_AB_MODELS="${ANVIL_AB_MODELS:-gpt-oss-20b gpt-oss-120b}" ANVIL_AB_BATCHES=1 ANVIL_AB_ROUNDS=2 \
  ANVIL_AB_PREFILL=2048 timeout "${ANVIL_AB_S:-300}" \
  bash scripts/gpu_ab.sh base=$C/anvil-base token=$A route16=$A,ANVIL_ROUTE_CLUSTER=16 > "$OUT_ROOT/ab.txt" 2>&1
tail -n 14 "$OUT_ROOT/ab.txt"
tar -czf "$OUT_ROOT/ab.tgz" -C "$OUT_ROOT" ab && rm -rf "$OUT_ROOT/ab"
