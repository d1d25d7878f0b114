#!/usr/bin/env bash
# Session 29's fifth call (carry [".gpu-pack15"]): session 28's wide attention block (lease switch
# ANVIL_X_WIDE=20, session28/wide-attention-reverted.patch applied on top of lease4's build) tried
# again now that RoPE can release the attention early (ANVIL_X_ROPE_RELEASE=early): the 20-warp
# block's 18 chunks were slower to stream from one SM, but its copies now start while qkv runs.
# anvil-base is 2afc355.
#   1. the attention tests with both on  2. A/B, batches 1 and 8  3. a trace with both on.
set -uo pipefail
source "$(dirname "$0")/../session25/unpack.sh" .gpu-pack15 /tmp/lease29e
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$OUT_ROOT/gpu.txt"
ANVIL_X_WIDE=20 ANVIL_X_ROPE_RELEASE=early ANVIL_FIXTURES_DIR=$PWD/$C/fixtures timeout 100 $C/anvil_gpu_tests \
  --gtest_filter='CudaAttention*:CudaGraph*:Fixtures/*' > "$OUT_ROOT/gpu_tests.log" 2>&1
echo "gpu tests (wide 20, early) exit $?"
grep -E "^\[  (PASSED|FAILED) |^\[  FAILED|tests ran" "$OUT_ROOT/gpu_tests.log" | tail -n 8
A=$C/anvil
OUT=$OUT_ROOT/ab ANVIL_AB_BATCHES=1,8 ANVIL_AB_ROUNDS=3 ANVIL_AB_PREFILL=128 timeout 250 \
  bash scripts/gpu_ab.sh head=$C/anvil-base early=$A,ANVIL_X_ROPE_RELEASE=early \
  wide=$A,ANVIL_X_ROPE_RELEASE=early,ANVIL_X_WIDE=20 > "$OUT_ROOT/ab.txt" 2>&1
tail -n 20 "$OUT_ROOT/ab.txt"
tar -czf "$OUT_ROOT/ab.tgz" -C "$OUT_ROOT" ab && rm -rf "$OUT_ROOT/ab"
ANVIL_X_WIDE=20 ANVIL_X_ROPE_RELEASE=early CUDA_INJECTION64_PATH=$PWD/$C/libkernel_trace.so \
  ANVIL_TRACE_OUT=$OUT_ROOT/trace-wide.csv timeout 40 \
  $A bench-gpu --model configs/gpt-oss-20b --load-format dummy --device cuda --batches 1 --prefill-tokens 128 > /dev/null 2>&1
python3 tools/cuda-harness/graph_timeline.py $OUT_ROOT/trace-wide.csv --top 20 --chain 20:40 > "$OUT_ROOT/timeline-wide.txt" 2>&1
gzip -f $OUT_ROOT/trace-wide.csv
sed -n 1,40p "$OUT_ROOT/timeline-wide.txt"
