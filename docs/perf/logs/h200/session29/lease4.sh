#!/usr/bin/env bash
# Session 29's fourth call (carry [".gpu-pack14"]): RoPE releasing the attention before its wait
# (lease switch ANVIL_X_ROPE_RELEASE=early), so the attention's blocks launch while qkv still
# streams and their copies of older keys come off the chain. The pack's anvil has the switch; its
# anvil-base is 2afc355 (main without it).
#   1. the whole GPU suite with it on  2. A/B at batches 1, 8, 64 and at batch 1 with a 4096-token
#   prompt  3. a trace with it on.
set -uo pipefail
source "$(dirname "$0")/../session25/unpack.sh" .gpu-pack14 /tmp/lease29d
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$OUT_ROOT/gpu.txt"
ANVIL_X_ROPE_RELEASE=early ANVIL_FIXTURES_DIR=$PWD/$C/fixtures timeout 230 $C/anvil_gpu_tests > "$OUT_ROOT/gpu_tests.log" 2>&1
echo "gpu tests (early) exit $?"
grep -E "^\[  (PASSED|FAILED) |^\[  FAILED|tests ran" "$OUT_ROOT/gpu_tests.log" | tail -n 8
A=$C/anvil
OUT=$OUT_ROOT/ab ANVIL_AB_BATCHES=1,8,64 ANVIL_AB_ROUNDS=3 ANVIL_AB_PREFILL=128 timeout 200 \
  bash scripts/gpu_ab.sh head=$C/anvil-base early=$A,ANVIL_X_ROPE_RELEASE=early > "$OUT_ROOT/ab.txt" 2>&1
tail -n 14 "$OUT_ROOT/ab.txt"
OUT=$OUT_ROOT/ablong ANVIL_AB_BATCHES=1 ANVIL_AB_ROUNDS=2 ANVIL_AB_PREFILL=128 ANVIL_AB_EXTRA="--decode-prompt 4096" \
  timeout 150 bash scripts/gpu_ab.sh head=$C/anvil-base early=$A,ANVIL_X_ROPE_RELEASE=early > "$OUT_ROOT/ablong.txt" 2>&1
tail -n 10 "$OUT_ROOT/ablong.txt"
tar -czf "$OUT_ROOT/ab.tgz" -C "$OUT_ROOT" ab ablong && rm -rf "$OUT_ROOT/ab" "$OUT_ROOT/ablong"
ANVIL_X_ROPE_RELEASE=early CUDA_INJECTION64_PATH=$PWD/$C/libkernel_trace.so ANVIL_TRACE_OUT=$OUT_ROOT/trace-early.csv timeout 40 \
  $A bench-gpu --model configs/gpt-oss-20b --load-format dummy --device cuda --batches 1 --prefill-tokens 128 > /dev/null 2>&1
python3 tools/cuda-harness/graph_timeline.py $OUT_ROOT/trace-early.csv --top 20 --chain 20:40 > "$OUT_ROOT/timeline-early.txt" 2>&1
gzip -f $OUT_ROOT/trace-early.csv
sed -n 1,40p "$OUT_ROOT/timeline-early.txt"
