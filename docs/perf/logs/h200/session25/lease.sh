#!/usr/bin/env bash
# Session 25's lease, one device call (carry [".gpu-pack"]):
#   bash docs/perf/logs/h200/session25/lease.sh
# The pack (README.md here says how it is built): .gpu-carry/anvil-base = main at 22c0eed;
# .gpu-carry/anvil = the three candidates with their lease switches (ANVIL_X_RING, ANVIL_X_PENDING,
# ANVIL_X_L2TAIL; each on unless "0"); .gpu-carry/anvil_gpu_tests = the candidates' GPU suite;
# .gpu-carry/variants/s4/anvil = main with session 23's 4-stage FP16 ring for the batch-1 MoE.
# A/B first (the figures matter most if the lease is cut short), then the suite, then a trace.
set -uo pipefail
source "$(dirname "$0")/unpack.sh" .gpu-pack /tmp/lease25

OUT=$OUT_ROOT/ab ANVIL_AB_BATCHES=1,8,64 ANVIL_AB_ROUNDS=2 ANVIL_AB_PREFILL=128 timeout 300 \
  bash scripts/gpu_ab.sh base=$C/anvil-base new=$C/anvil \
  noring=$C/anvil,ANVIL_X_RING=0 nopending=$C/anvil,ANVIL_X_PENDING=0 nol2=$C/anvil,ANVIL_X_L2TAIL=0 \
  s4=$C/variants/s4/anvil > "$OUT_ROOT/ab.txt" 2>&1
tail -n 40 "$OUT_ROOT/ab.txt"

ANVIL_FIXTURES_DIR=$PWD/$C/fixtures timeout 240 $C/anvil_gpu_tests > "$OUT_ROOT/tests.log" 2>&1
echo "gpu tests exit $?"
grep -E "^\[  (PASSED|FAILED) |^\[  FAILED|tests ran" "$OUT_ROOT/tests.log" | tail -n 15

if [ -f $C/libkernel_trace.so ]; then
  for v in new; do
    bin=$C/anvil
    CUDA_INJECTION64_PATH=$PWD/$C/libkernel_trace.so ANVIL_TRACE_OUT=$OUT_ROOT/trace-$v.csv timeout 40 \
      $bin bench-gpu --model configs/gpt-oss-20b --load-format dummy --device cuda --batches 1 \
      --prefill-tokens 128 > /dev/null 2>&1
    python3 tools/cuda-harness/graph_timeline.py $OUT_ROOT/trace-$v.csv --top 20 --chain 20:40 > "$OUT_ROOT/timeline-$v.txt" 2>&1
    gzip -f $OUT_ROOT/trace-$v.csv
  done
  cat "$OUT_ROOT/timeline-new.txt"
fi
