#!/usr/bin/env bash
# Session 33's second call (carry [".gpu-pack33t"], the same build as lease1 with the kernel
# tracer): where the router sums' batch 1 lost time. Per-kernel traces of 20b and 120b batch 1
# with the router sums (the default) and with the one-launch routing (ANVIL_ROUTER_SUMS=0).
set -uo pipefail
source "$(dirname "$0")/../session25/unpack.sh" .gpu-pack33t /tmp/lease33b
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$OUT_ROOT/gpu.txt"
R=$PWD
cd "$OUT_ROOT"
for model in gpt-oss-20b gpt-oss-120b; do
  for sums in 0 1; do
    name=$model-sums$sums
    ANVIL_ROUTER_SUMS=$sums CUDA_INJECTION64_PATH=$R/$C/libkernel_trace.so ANVIL_TRACE_OUT=$name.csv \
      timeout 90 $R/$C/anvil bench-gpu --model $R/configs/$model --load-format dummy --device cuda --batches 1 \
      --prefill-tokens 128 > $name.log 2>&1
    python3 $R/tools/cuda-harness/graph_timeline.py $name.csv --top 12 --chain 20:34 > timeline-$name.txt 2>&1
    echo "== $name"; head -n 16 timeline-$name.txt | tail -n 14
  done
done
tar -czf traces.tgz *.csv && rm -f *.csv
