#!/usr/bin/env bash
# lease1.sh cut to what little device time was left: the new bit-for-bit tests, then both fusions
# against neither at batch 1 only (same pack).
set -uo pipefail
source "$(dirname "$0")/../session25/unpack.sh" .gpu-pack30 /tmp/lease30m
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$OUT_ROOT/gpu.txt"
export ANVIL_FIXTURES_DIR=$PWD/$C/fixtures
timeout 60 $C/anvil_gpu_tests --gtest_filter='CudaMoe.OneLaunch*:CudaFusedOps.RopeInside*' > "$OUT_ROOT/new_test.log" 2>&1
rc=$?
tail -n 12 "$OUT_ROOT/new_test.log"
[ $rc -eq 0 ] || exit 1
A=$C/anvil
OUT=$OUT_ROOT/ab ANVIL_AB_MODELS="${ANVIL_AB_MODELS:-gpt-oss-20b gpt-oss-120b}" ANVIL_AB_BATCHES=1 ANVIL_AB_ROUNDS=2 \
  ANVIL_AB_PREFILL=128 timeout 150 \
  bash scripts/gpu_ab.sh off=$A,ANVIL_FUSED_ROUTE=0,ANVIL_FUSED_ROPE=0 both=$A > "$OUT_ROOT/ab.txt" 2>&1
tail -n 14 "$OUT_ROOT/ab.txt"
tar -czf "$OUT_ROOT/ab.tgz" -C "$OUT_ROOT" ab && rm -rf "$OUT_ROOT/ab"
