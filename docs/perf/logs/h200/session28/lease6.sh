#!/usr/bin/env bash
# Session 28's sixth call (carry [".gpu-pack10"]): bash docs/perf/logs/h200/session28/lease6.sh
# The pack: main at 8742228 plus two lease-only changes (`wide-attention.patch`, which also holds
# the new GPU test, and `moe-stamps-probe.patch`):
#   ANVIL_X_WIDE=20: head_dim-64 decode attention in one 20-warp block (160 KB of rows) wherever
#     the launch's keys fit it but not 8 warps (257-640 keys: gpt-oss's full layers at the
#     bench's 548), merged in shared memory instead of 3 splits and a ticket;
#   ANVIL_X_STAMPS=file: per-block %globaltimer stamps of batch 1's gate_up and down (last layer).
# `ANVIL_CARRY_DIR=.gpu-pack10 ANVIL_CARRY_VARIANTS=none ANVIL_CARRY_TRACE=1 bash scripts/gpu_carry.sh build-h`
set -uo pipefail
source "$(dirname "$0")/../session25/unpack.sh" .gpu-pack10 /tmp/lease28f
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$OUT_ROOT/gpu.txt"

ANVIL_X_WIDE=20 ANVIL_FIXTURES_DIR=$PWD/$C/fixtures timeout 120 $C/anvil_gpu_tests \
  --gtest_filter='CudaAttention*:CudaGraph*:Fixtures*' > "$OUT_ROOT/gpu_tests.log" 2>&1
echo "attention, graph, fixture tests (wide 20) exit $?"
grep -E "^\[  (PASSED|FAILED) |^\[  FAILED|tests ran" "$OUT_ROOT/gpu_tests.log" | tail -n 6

A=$C/anvil
OUT=$OUT_ROOT/ab ANVIL_AB_BATCHES=1,8 ANVIL_AB_ROUNDS=2 ANVIL_AB_PREFILL=128 timeout 200 \
  bash scripts/gpu_ab.sh off=$A,ANVIL_X_WIDE=0 wide20=$A,ANVIL_X_WIDE=20 > "$OUT_ROOT/ab.txt" 2>&1
tail -n 10 "$OUT_ROOT/ab.txt"
tar -czf "$OUT_ROOT/ab.tgz" -C "$OUT_ROOT" ab && rm -rf "$OUT_ROOT/ab"

for m in gpt-oss-20b gpt-oss-120b; do
  ANVIL_X_STAMPS=$OUT_ROOT/stamps-$m.csv timeout 60 $C/anvil bench-gpu --model configs/$m --load-format dummy \
    --device cuda --batches 1 --prefill-tokens 128 > "$OUT_ROOT/bench-$m.json" 2> "$OUT_ROOT/bench-$m.err"
  echo "== $m"
  python3 docs/perf/logs/h200/session28/stamps_summary.py "$OUT_ROOT/stamps-$m.csv"
done

ANVIL_X_WIDE=20 CUDA_INJECTION64_PATH=$PWD/$C/libkernel_trace.so ANVIL_TRACE_OUT=$OUT_ROOT/trace-wide.csv timeout 40 \
  $A bench-gpu --model configs/gpt-oss-20b --load-format dummy --device cuda --batches 1 --prefill-tokens 128 > /dev/null 2>&1
python3 tools/cuda-harness/graph_timeline.py $OUT_ROOT/trace-wide.csv --top 20 --chain 20:40 > "$OUT_ROOT/timeline-wide.txt" 2>&1
gzip -f $OUT_ROOT/trace-wide.csv
grep -E "attention|graph 2" "$OUT_ROOT/timeline-wide.txt" | head -n 4
