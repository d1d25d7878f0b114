#!/usr/bin/env bash
# Session 32's last calls (carry [".gpu-pack32u"]): main plus gate_up's token staged under its
# first scales and the 16-block routing cluster for large routers (this build) against main at
# 62e55e9 (anvil-base), and against this build with 8-block clusters (ANVIL_ROUTE_CLUSTER=8: the
# token change alone), at batch 1 with the bars' 2,048-token prefill, two rounds. The MoE, fixture
# and graph GPU tests first. ANVIL_SUITE=1 runs the whole GPU suite instead (a second call).
set -uo pipefail
source "$(dirname "$0")/../session25/unpack.sh" .gpu-pack32u /tmp/lease32d
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$OUT_ROOT/gpu.txt"
export ANVIL_FIXTURES_DIR=$PWD/$C/fixtures
if [ -n "${ANVIL_SUITE:-}" ]; then
  timeout "${ANVIL_SUITE_S:-280}" $C/anvil_gpu_tests > "$OUT_ROOT/gpu_tests.log" 2>&1
  echo "gpu tests exit $?"
  grep -E "^\[  (PASSED|FAILED) |^\[  FAILED|tests ran" "$OUT_ROOT/gpu_tests.log" | tail -n 8
  gzip -f "$OUT_ROOT/gpu_tests.log"
  exit 0
fi
timeout 90 $C/anvil_gpu_tests --gtest_filter='CudaMoe*:Fixtures/FixtureGpuTest.*:CudaGraphTest.*' > "$OUT_ROOT/tests.log" 2>&1
echo "tests exit $?"
grep -E "^\[  (PASSED|FAILED) |^\[  FAILED" "$OUT_ROOT/tests.log" | head -n 8
A=$C/anvil
OUT=$OUT_ROOT/ab ANVIL_AB_MODELS="${ANVIL_AB_MODELS:-gpt-oss-20b gpt-oss-120b}" ANVIL_AB_BATCHES=1 ANVIL_AB_ROUNDS=2 \
  ANVIL_AB_PREFILL=2048 timeout "${ANVIL_AB_S:-300}" \
  bash scripts/gpu_ab.sh base=$C/anvil-base new=$A route8=$A,ANVIL_ROUTE_CLUSTER=8 > "$OUT_ROOT/ab.txt" 2>&1
tail -n 14 "$OUT_ROOT/ab.txt"
tar -czf "$OUT_ROOT/ab.tgz" -C "$OUT_ROOT" ab && rm -rf "$OUT_ROOT/ab"
