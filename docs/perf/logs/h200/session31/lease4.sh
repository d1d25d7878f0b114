#!/usr/bin/env bash
# Session 31's last call (carry [".gpu-pack31b"]): gate_up staging its one-row token while its
# first scales come from DRAM (this build) against staging it before asking for the weights
# (anvil-base: the .gpu-pack31 build, run with ANVIL_FUSED_ROPE=0 as its row had the RoPE fusion
# on), and against no fused routing; the routing and fixture tests first.
set -uo pipefail
source "$(dirname "$0")/../session25/unpack.sh" .gpu-pack31b /tmp/lease31d
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$OUT_ROOT/gpu.txt"
export ANVIL_FIXTURES_DIR=$PWD/$C/fixtures
timeout 60 $C/anvil_gpu_tests --gtest_filter='CudaMoe.OneLaunch*:Fixtures/FixtureGpuTest.*' > "$OUT_ROOT/new_test.log" 2>&1
rc=$?
grep -E "^\[  (PASSED|FAILED) |^\[  FAILED" "$OUT_ROOT/new_test.log" | tail -n 6
[ $rc -eq 0 ] || exit 1
A=$C/anvil
OUT=$OUT_ROOT/ab ANVIL_AB_BATCHES=1 ANVIL_AB_ROUNDS=2 ANVIL_AB_PREFILL=128 timeout "${ANVIL_AB_S:-150}" \
  bash scripts/gpu_ab.sh off=$A,ANVIL_FUSED_ROUTE=0 tokenfirst=$C/anvil-base,ANVIL_FUSED_ROPE=0 route=$A \
  > "$OUT_ROOT/ab.txt" 2>&1
tail -n 14 "$OUT_ROOT/ab.txt"
tar -czf "$OUT_ROOT/ab.tgz" -C "$OUT_ROOT" ab && rm -rf "$OUT_ROOT/ab"
