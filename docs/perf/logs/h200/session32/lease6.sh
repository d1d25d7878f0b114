#!/usr/bin/env bash
# Session 32's layout call (carry [".gpu-pack32w"]): MXFP4 experts stored in 16-row tiles (this
# build) against main at 13341cb (anvil-base, rows one after another). The whole GPU suite first
# (every MXFP4 kernel reads the new layout: batch 1, the batch decode, the prefill GEMM, the
# float32 path, the loader), then the A/B at batches 1, 8, 64 and the 2,048-token prefill.
set -uo pipefail
source "$(dirname "$0")/../session25/unpack.sh" .gpu-pack32w /tmp/lease32f
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$OUT_ROOT/gpu.txt"
export ANVIL_FIXTURES_DIR=$PWD/$C/fixtures
timeout "${ANVIL_SUITE_S:-220}" $C/anvil_gpu_tests > "$OUT_ROOT/gpu_tests.log" 2>&1
suite=$?
echo "gpu tests exit $suite"
grep -E "^\[  (PASSED|FAILED) |^\[  FAILED|tests ran" "$OUT_ROOT/gpu_tests.log" | tail -n 8
gzip -f "$OUT_ROOT/gpu_tests.log"
A=$C/anvil
OUT=$OUT_ROOT/ab ANVIL_AB_MODELS="${ANVIL_AB_MODELS:-gpt-oss-20b gpt-oss-120b}" ANVIL_AB_BATCHES="${ANVIL_AB_BATCHES:-1,8,64}" \
  ANVIL_AB_ROUNDS="${ANVIL_AB_ROUNDS:-1}" ANVIL_AB_PREFILL=2048 timeout "${ANVIL_AB_S:-240}" \
  bash scripts/gpu_ab.sh base=$C/anvil-base tiled=$A > "$OUT_ROOT/ab.txt" 2>&1
tail -n 8 "$OUT_ROOT/ab.txt"
tar -czf "$OUT_ROOT/ab.tgz" -C "$OUT_ROOT" ab && rm -rf "$OUT_ROOT/ab"
exit $suite
