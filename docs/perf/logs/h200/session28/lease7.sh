#!/usr/bin/env bash
# Session 28's seventh call (carry [".gpu-pack11"]): bash docs/perf/logs/h200/session28/lease7.sh
# lease6.sh's pack with the wide block's split count fixed: lease6 took the wide kernel only
# where the launch's key bound fit one 20-warp block, and a CUDA graph's bound is far, so the
# bench never ran it. Now the wide kernel takes any launch whose bound needs more than one 8-warp
# split, with splits for that bound; a 548-key sequence then runs one active split.
# Also returns lease6's per-block MoE stamps as files (lease6's $OUT held too many to return).
set -uo pipefail
source "$(dirname "$0")/../session25/unpack.sh" .gpu-pack11 /tmp/lease28g
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$OUT_ROOT/gpu.txt"
ANVIL_X_WIDE=20 ANVIL_FIXTURES_DIR=$PWD/$C/fixtures timeout 120 $C/anvil_gpu_tests \
  --gtest_filter='CudaAttention*:CudaGraph*:Fixtures*' > "$OUT_ROOT/gpu_tests.log" 2>&1
echo "attention, graph, fixture tests (wide 20) exit $?"
grep -E "^\[  (PASSED|FAILED) |^\[  FAILED|tests ran" "$OUT_ROOT/gpu_tests.log" | tail -n 6
A=$C/anvil
OUT=$OUT_ROOT/ab ANVIL_AB_BATCHES=1,8 ANVIL_AB_ROUNDS=2 ANVIL_AB_PREFILL=128 timeout 200 \
  bash scripts/gpu_ab.sh off=$A,ANVIL_X_WIDE=0 wide20=$A,ANVIL_X_WIDE=20 > "$OUT_ROOT/ab.txt" 2>&1
tail -n 10 "$OUT_ROOT/ab.txt"
mkdir -p $OUT_ROOT/more
mv $OUT_ROOT/ab $OUT_ROOT/more/
for m in gpt-oss-20b gpt-oss-120b; do
  ANVIL_X_STAMPS=$OUT_ROOT/more/stamps-$m.csv timeout 60 $A bench-gpu --model configs/$m --load-format dummy \
    --device cuda --batches 1 --prefill-tokens 128 > /dev/null 2>&1
done
ANVIL_X_WIDE=20 CUDA_INJECTION64_PATH=$PWD/$C/libkernel_trace.so ANVIL_TRACE_OUT=$OUT_ROOT/more/trace-wide.csv timeout 40 \
  $A bench-gpu --model configs/gpt-oss-20b --load-format dummy --device cuda --batches 1 --prefill-tokens 128 > /dev/null 2>&1
python3 tools/cuda-harness/graph_timeline.py $OUT_ROOT/more/trace-wide.csv --top 20 --chain 20:40 > "$OUT_ROOT/timeline-wide.txt" 2>&1
grep -E "attention|graph 2" "$OUT_ROOT/timeline-wide.txt" | head -n 4
tar -czf "$OUT_ROOT/more.tgz" -C "$OUT_ROOT" more && rm -rf "$OUT_ROOT/more"
