#!/usr/bin/env bash
# For the next session's first call (carry [".gpu-pack12"]; the pack is git-ignored, so rebuild it
# if it is gone: apply gate-up-raw-scales-unmeasured.patch to 5bf7a13, build build-h for sm_90a,
# keep 5bf7a13's anvil as BASE, then
# `ANVIL_CARRY_DIR=.gpu-pack12 ANVIL_CARRY_VARIANTS=none ANVIL_CARRY_TRACE=1 bash scripts/gpu_carry.sh build-h BASE`):
#   bash docs/perf/logs/h200/session28/lease8.sh
# The candidate: batch-1 MXFP4 decode (moe_decode_f16_kernel) keeps its block scales as E8M0 words
# in shared memory, widened where used (5 KB of a gate_up warp's 9 KB were scales as floats and
# token), and gate_up's ring depth is a lease switch, ANVIL_X_GATE_STAGES=3|4|5: at 5 stages a
# gate_up block still takes 36 KB, so six still fit an SM (session 28's stamps: a gate_up warp's
# 12 chunks take ~2.2 us per round trip with 2 in flight, while DRAM has room).
#   1. the whole GPU suite at 5 stages  2. A/B base vs 3, 4, 5 stages, batches 1 and 8
#   3. a trace of 20b batch 1 at 5 stages.
set -uo pipefail
source "$(dirname "$0")/../session25/unpack.sh" .gpu-pack12 /tmp/lease28h
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$OUT_ROOT/gpu.txt"
ANVIL_X_GATE_STAGES=5 ANVIL_FIXTURES_DIR=$PWD/$C/fixtures timeout 230 $C/anvil_gpu_tests > "$OUT_ROOT/gpu_tests.log" 2>&1
echo "gpu tests (5 stages) exit $?"
grep -E "^\[  (PASSED|FAILED) |^\[  FAILED|tests ran" "$OUT_ROOT/gpu_tests.log" | tail -n 8
A=$C/anvil
OUT=$OUT_ROOT/ab ANVIL_AB_BATCHES=1,8 ANVIL_AB_ROUNDS=2 ANVIL_AB_PREFILL=128 timeout 300 \
  bash scripts/gpu_ab.sh base=$C/anvil-base raw3=$A,ANVIL_X_GATE_STAGES=3 raw4=$A,ANVIL_X_GATE_STAGES=4 \
  raw5=$A,ANVIL_X_GATE_STAGES=5 > "$OUT_ROOT/ab.txt" 2>&1
tail -n 18 "$OUT_ROOT/ab.txt"
tar -czf "$OUT_ROOT/ab.tgz" -C "$OUT_ROOT" ab && rm -rf "$OUT_ROOT/ab"
ANVIL_X_GATE_STAGES=5 CUDA_INJECTION64_PATH=$PWD/$C/libkernel_trace.so ANVIL_TRACE_OUT=$OUT_ROOT/trace-raw5.csv timeout 40 \
  $A bench-gpu --model configs/gpt-oss-20b --load-format dummy --device cuda --batches 1 --prefill-tokens 128 > /dev/null 2>&1
python3 tools/cuda-harness/graph_timeline.py $OUT_ROOT/trace-raw5.csv --top 20 --chain 20:40 > "$OUT_ROOT/timeline-raw5.txt" 2>&1
gzip -f $OUT_ROOT/trace-raw5.csv
grep -E "moe_|graph 2" "$OUT_ROOT/timeline-raw5.txt" | head -n 4
