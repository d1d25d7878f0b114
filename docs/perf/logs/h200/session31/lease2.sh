#!/usr/bin/env bash
# Session 31's second call (carry [".gpu-pack31"], the same pack as lease1.sh): the one-launch
# routing alone (ANVIL_FUSED_ROPE=0: lease 1 found the RoPE inside the attention level at batch 1)
# against neither, with 8- and 16-block clusters, at batches 1 and 64 with the 2,048-token prefill
# (the bars' rows); then the whole GPU suite (both fusions on, the pack's row) in what time is left.
set -uo pipefail
source "$(dirname "$0")/../session25/unpack.sh" .gpu-pack31 /tmp/lease31b
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$OUT_ROOT/gpu.txt"
export ANVIL_FIXTURES_DIR=$PWD/$C/fixtures
A=$C/anvil
# ANVIL_NO_ROUTE16=1 leaves the 16-block runs out (a short call).
route16=route16=$A,ANVIL_FUSED_ROPE=0,ANVIL_ROUTE_CLUSTER=16
[ -n "${ANVIL_NO_ROUTE16:-}" ] && route16=
OUT=$OUT_ROOT/ab ANVIL_AB_BATCHES=1,64 ANVIL_AB_ROUNDS=2 ANVIL_AB_PREFILL=2048 timeout "${ANVIL_AB_S:-280}" \
  bash scripts/gpu_ab.sh off=$A,ANVIL_FUSED_ROUTE=0,ANVIL_FUSED_ROPE=0 route=$A,ANVIL_FUSED_ROPE=0 \
  $route16 > "$OUT_ROOT/ab.txt" 2>&1
tail -n 14 "$OUT_ROOT/ab.txt"
tar -czf "$OUT_ROOT/ab.tgz" -C "$OUT_ROOT" ab && rm -rf "$OUT_ROOT/ab"
[ "${ANVIL_SUITE_S:-200}" = 0 ] && exit 0
timeout "${ANVIL_SUITE_S:-200}" $C/anvil_gpu_tests > "$OUT_ROOT/gpu_tests.log" 2>&1
echo "gpu tests exit $?"
grep -E "^\[  (PASSED|FAILED) |^\[  FAILED|tests ran" "$OUT_ROOT/gpu_tests.log" | tail -n 8
grep -c "^\[       OK" "$OUT_ROOT/gpu_tests.log"
