#!/usr/bin/env bash
# Session 28's fourth call (carry [".gpu-pack8"]): bash docs/perf/logs/h200/session28/lease4.sh
# Why: lease3's traces hold batch 1's down (with the sum) 12 us past gate_up's end on an H100,
# for 17.6 MB (5.3 us of bytes); 4 ring stages did not move it, so its blocks' cold start after
# gate_up's blocks leave the SMs is suspected. The pack: main at 4ed1fad plus the lease switch
# ANVIL_X_DOWNPF (moe_quantized.cu): bit 1, each batch-1 gate_up block asks L2 (bulk prefetch)
# for its share of down's rows and scales of its expert as soon as it knows the expert; bit 2,
# gate_up's own weights read with L2's evict-first policy (so those prefetched lines stay).
# `ANVIL_CARRY_DIR=.gpu-pack8 ANVIL_CARRY_VARIANTS=none ANVIL_CARRY_TRACE=1 bash scripts/gpu_carry.sh build-h`
#   1. the MoE, graph and fixture GPU tests with bits 3  2. A/B 0..3 at batch 1, two rounds
#   3. per-kernel traces of 20b batch 1 with 0 and 3.
set -uo pipefail
source "$(dirname "$0")/../session25/unpack.sh" .gpu-pack8 /tmp/lease28d
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$OUT_ROOT/gpu.txt"

ANVIL_X_DOWNPF=3 ANVIL_FIXTURES_DIR=$PWD/$C/fixtures timeout 100 $C/anvil_gpu_tests \
  --gtest_filter='CudaMoe*:Fixtures*:CudaGraph*' > "$OUT_ROOT/gpu_tests.log" 2>&1
echo "gpu tests (bits 3) exit $?"
grep -E "^\[  (PASSED|FAILED) |^\[  FAILED|tests ran" "$OUT_ROOT/gpu_tests.log" | tail -n 8

A=$C/anvil
OUT=$OUT_ROOT/ab ANVIL_AB_BATCHES=1 ANVIL_AB_ROUNDS=2 ANVIL_AB_PREFILL=128 timeout 260 \
  bash scripts/gpu_ab.sh off=$A,ANVIL_X_DOWNPF=0 pf=$A,ANVIL_X_DOWNPF=1 ef=$A,ANVIL_X_DOWNPF=2 \
  pfef=$A,ANVIL_X_DOWNPF=3 > "$OUT_ROOT/ab.txt" 2>&1
tail -n 18 "$OUT_ROOT/ab.txt"
tar -czf "$OUT_ROOT/ab.tgz" -C "$OUT_ROOT" ab && rm -rf "$OUT_ROOT/ab"

for v in 0 3; do
  ANVIL_X_DOWNPF=$v CUDA_INJECTION64_PATH=$PWD/$C/libkernel_trace.so ANVIL_TRACE_OUT=$OUT_ROOT/trace-$v.csv timeout 40 \
    $C/anvil bench-gpu --model configs/gpt-oss-20b --load-format dummy --device cuda --batches 1 \
    --prefill-tokens 128 > /dev/null 2>&1
  python3 tools/cuda-harness/graph_timeline.py $OUT_ROOT/trace-$v.csv --top 20 --chain 20:40 > "$OUT_ROOT/timeline-$v.txt" 2>&1
  gzip -f $OUT_ROOT/trace-$v.csv
done
tar -czf "$OUT_ROOT/traces.tgz" -C "$OUT_ROOT" trace-0.csv.gz trace-3.csv.gz && rm -f $OUT_ROOT/trace-*.csv.gz
grep -E "moe_|graph 2" "$OUT_ROOT/timeline-0.txt" | head -n 4
grep -E "moe_|graph 2" "$OUT_ROOT/timeline-3.txt" | head -n 4
