#!/usr/bin/env bash
# Session 29's sixth call (carry [".gpu-pack16"]): what lands, with no switches: RoPE releasing the
# attention at once, and the 20-warp decode attention block on the SM90 row of the kernel table.
# anvil-base is 2afc355 (main before both).
#   1. the whole GPU suite  2. memcheck over the attention and graph tests  3. A/B at batches 1, 8,
#   64 and at batch 1 with a 4096-token prompt  4. a trace.
set -uo pipefail
source "$(dirname "$0")/../session25/unpack.sh" .gpu-pack16 /tmp/lease29f
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$OUT_ROOT/gpu.txt"
ANVIL_FIXTURES_DIR=$PWD/$C/fixtures timeout 230 $C/anvil_gpu_tests > "$OUT_ROOT/gpu_tests.log" 2>&1
echo "gpu tests exit $?"
grep -E "^\[  (PASSED|FAILED) |^\[  FAILED|tests ran" "$OUT_ROOT/gpu_tests.log" | tail -n 8
ANVIL_FIXTURES_DIR=$PWD/$C/fixtures timeout 90 /usr/local/cuda/bin/compute-sanitizer --tool memcheck --error-exitcode 9 \
  $C/anvil_gpu_tests --gtest_filter='CudaAttention.Decode*:CudaGraphTest.DecodeInto*:Fixtures/FixtureGpuTest.OneToken*' \
  > "$OUT_ROOT/memcheck.log" 2>&1
echo "memcheck exit $?"
grep -E "ERROR SUMMARY|^\[  (PASSED|FAILED) |^\[  FAILED" "$OUT_ROOT/memcheck.log" | tail -n 8
gzip -f "$OUT_ROOT/memcheck.log"
A=$C/anvil
OUT=$OUT_ROOT/ab ANVIL_AB_BATCHES=1,8,64 ANVIL_AB_ROUNDS=3 ANVIL_AB_PREFILL=128 timeout 150 \
  bash scripts/gpu_ab.sh head=$C/anvil-base new=$A > "$OUT_ROOT/ab.txt" 2>&1
tail -n 14 "$OUT_ROOT/ab.txt"
OUT=$OUT_ROOT/ablong ANVIL_AB_BATCHES=1,8 ANVIL_AB_ROUNDS=2 ANVIL_AB_PREFILL=128 ANVIL_AB_EXTRA="--decode-prompt 4096" \
  timeout 120 bash scripts/gpu_ab.sh head=$C/anvil-base new=$A > "$OUT_ROOT/ablong.txt" 2>&1
tail -n 10 "$OUT_ROOT/ablong.txt"
tar -czf "$OUT_ROOT/ab.tgz" -C "$OUT_ROOT" ab ablong && rm -rf "$OUT_ROOT/ab" "$OUT_ROOT/ablong"
CUDA_INJECTION64_PATH=$PWD/$C/libkernel_trace.so ANVIL_TRACE_OUT=$OUT_ROOT/trace-new.csv timeout 40 \
  $A bench-gpu --model configs/gpt-oss-20b --load-format dummy --device cuda --batches 1 --prefill-tokens 128 > /dev/null 2>&1
python3 tools/cuda-harness/graph_timeline.py $OUT_ROOT/trace-new.csv --top 20 --chain 20:40 > "$OUT_ROOT/timeline-new.txt" 2>&1
gzip -f $OUT_ROOT/trace-new.csv
sed -n 1,16p "$OUT_ROOT/timeline-new.txt"
