#!/usr/bin/env bash
# Session 35's second call (carry [".gpu-pack35b"]): anvil and anvil_gpu_tests at main (the
# graph-replay timer and its test, the probe marks, empty in this build, and the streaming copies
# behind ANVIL_L2_STREAM_FIRST=0); extra/anvil-l2first, the same with every weight stream (qkv,
# o_proj, gate_up, down, lm_head) marked evict-first in L2, so that what each layer re-reads every
# step (its kernels' code, norms, biases, router rows, scales) may stay in L2.
# Lease 1's probe: the routing's picks took ~1.8 us in block 0 alone, as if fetching cold code.
# Every GPU test, then the A/B at batch 1 (512-token decode context), three rounds; on an H200 also
# batch 64 and the 2,048-token prefill, one round.
set -uo pipefail
source "$(dirname "$0")/../session25/unpack.sh" .gpu-pack35b /tmp/lease35b
name=$(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$OUT_ROOT/gpu.txt")
echo "$name"
export ANVIL_FIXTURES_DIR=$PWD/$C/fixtures
timeout 240 $C/anvil_gpu_tests > "$OUT_ROOT/tests.log" 2>&1
tests=$?
echo "tests exit $tests"
grep -hE "^\[  (PASSED|FAILED) |^\[  FAILED|Failure|Expected|Which is|differ|tests ran" "$OUT_ROOT/tests.log" | head -n 16
gzip -f "$OUT_ROOT/tests.log"
OUT=$OUT_ROOT/ab ANVIL_AB_BATCHES=1 ANVIL_AB_ROUNDS=3 ANVIL_AB_PREFILL=512 timeout 150 \
  bash scripts/gpu_ab.sh main=$C/anvil l2first=$C/extra/anvil-l2first > "$OUT_ROOT/ab.txt" 2>&1
tail -n 8 "$OUT_ROOT/ab.txt"
case "$name" in *H200*) ;; *) tar -czf "$OUT_ROOT/ab.tgz" -C "$OUT_ROOT" ab && rm -rf "$OUT_ROOT/ab"; exit 0 ;; esac
OUT=$OUT_ROOT/ab64 ANVIL_AB_BATCHES=64 ANVIL_AB_ROUNDS=1 ANVIL_AB_PREFILL=2048 timeout 120 \
  bash scripts/gpu_ab.sh main=$C/anvil l2first=$C/extra/anvil-l2first > "$OUT_ROOT/ab64.txt" 2>&1
tail -n 6 "$OUT_ROOT/ab64.txt"
tar -czf "$OUT_ROOT/ab.tgz" -C "$OUT_ROOT" ab ab64 && rm -rf "$OUT_ROOT/ab" "$OUT_ROOT/ab64"
