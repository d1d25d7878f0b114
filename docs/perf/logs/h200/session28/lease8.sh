#!/usr/bin/env bash
# For the next session's first call (carry [".gpu-pack12"]): bash docs/perf/logs/h200/session28/lease8.sh
# The pack is git-ignored; if it is gone, apply moe-batch1-candidates-unmeasured.patch to 79c5bc8,
# build build-h for sm_90a, build 79c5bc8 itself as BASE, then
# `ANVIL_CARRY_DIR=.gpu-pack12 ANVIL_CARRY_VARIANTS=none ANVIL_CARRY_TRACE=1 bash scripts/gpu_carry.sh build-h BASE`.
# (Session 28's pack carries cfb3baa's anvil as the base: its kernels are 79c5bc8's, whose later
# commits changed a comment and factored a merge with a byte-identical cubin.)
# Two lease switches, both for batch 1's MXFP4 MoE (README.md, section 7):
#   ANVIL_X_GATE_STAGES=3|4|5: gate_up's ring depth. The patch keeps every block scale as its E8M0
#     word in shared memory (widened where used), so at 5 stages a gate_up block still takes 36 KB
#     and six still fit an SM (the stamps: a gate_up warp's 12 chunks take ~2.2 us per round trip
#     with 2 in flight, while DRAM has room).
#   ANVIL_X_DOWN_RELEASE=late: down releases the next qkv (whose blocks fill their rings with 15 MB
#     from DRAM at once) after staging its tokens, not right after its wait (the stamps: staging
#     the tokens from L2 takes 3.3 us at the median while that fill runs).
#   1. the whole GPU suite with both on  2. A/B, batches 1 and 8  3. a trace of the best guess.
set -uo pipefail
source "$(dirname "$0")/../session25/unpack.sh" .gpu-pack12 /tmp/lease28h
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$OUT_ROOT/gpu.txt"
ANVIL_X_GATE_STAGES=5 ANVIL_X_DOWN_RELEASE=late ANVIL_FIXTURES_DIR=$PWD/$C/fixtures timeout 230 $C/anvil_gpu_tests \
  > "$OUT_ROOT/gpu_tests.log" 2>&1
echo "gpu tests (5 stages, late release) exit $?"
grep -E "^\[  (PASSED|FAILED) |^\[  FAILED|tests ran" "$OUT_ROOT/gpu_tests.log" | tail -n 8
A=$C/anvil
OUT=$OUT_ROOT/ab ANVIL_AB_BATCHES=1,8 ANVIL_AB_ROUNDS=2 ANVIL_AB_PREFILL=128 timeout 330 \
  bash scripts/gpu_ab.sh base=$C/anvil-base raw3=$A,ANVIL_X_GATE_STAGES=3 raw4=$A,ANVIL_X_GATE_STAGES=4 \
  raw5=$A,ANVIL_X_GATE_STAGES=5 late=$A,ANVIL_X_DOWN_RELEASE=late \
  raw5late=$A,ANVIL_X_GATE_STAGES=5,ANVIL_X_DOWN_RELEASE=late > "$OUT_ROOT/ab.txt" 2>&1
tail -n 26 "$OUT_ROOT/ab.txt"
tar -czf "$OUT_ROOT/ab.tgz" -C "$OUT_ROOT" ab && rm -rf "$OUT_ROOT/ab"
ANVIL_X_GATE_STAGES=5 ANVIL_X_DOWN_RELEASE=late CUDA_INJECTION64_PATH=$PWD/$C/libkernel_trace.so \
  ANVIL_TRACE_OUT=$OUT_ROOT/trace-raw5late.csv timeout 40 \
  $A bench-gpu --model configs/gpt-oss-20b --load-format dummy --device cuda --batches 1 --prefill-tokens 128 > /dev/null 2>&1
python3 tools/cuda-harness/graph_timeline.py $OUT_ROOT/trace-raw5late.csv --top 20 --chain 20:40 > "$OUT_ROOT/timeline-raw5late.txt" 2>&1
gzip -f $OUT_ROOT/trace-raw5late.csv
grep -E "moe_|gemv|graph 2" "$OUT_ROOT/timeline-raw5late.txt" | head -n 6
