#!/usr/bin/env bash
# Session 32's last call (carry [".gpu-pack32x"]): main at f3fcf41's code (16-row tiles, the
# token staging, 16-block routing for 120b) against 62e55e9 (anvil-base) at batch 1, one round,
# then a trace of main's batch-1 step (20b): where gate_up's time goes with the tiles.
set -uo pipefail
source "$(dirname "$0")/../session25/unpack.sh" .gpu-pack32x /tmp/lease32h
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$OUT_ROOT/gpu.txt"
A=$C/anvil
OUT=$OUT_ROOT/ab ANVIL_AB_BATCHES=1 ANVIL_AB_ROUNDS=1 ANVIL_AB_PREFILL=2048 timeout 150 \
  bash scripts/gpu_ab.sh base=$C/anvil-base main=$A > "$OUT_ROOT/ab.txt" 2>&1
tail -n 6 "$OUT_ROOT/ab.txt"
tar -czf "$OUT_ROOT/ab.tgz" -C "$OUT_ROOT" ab && rm -rf "$OUT_ROOT/ab"
R=$PWD
cd "$OUT_ROOT" && CUDA_INJECTION64_PATH=$R/$C/libkernel_trace.so ANVIL_TRACE_OUT=trace-main.csv timeout 60 $R/$A bench-gpu \
  --model $R/configs/gpt-oss-20b --load-format dummy --device cuda --batches 1 --prefill-tokens 128 > /dev/null 2>&1
python3 $R/tools/cuda-harness/graph_timeline.py trace-main.csv --top 12 --chain 20:34 > timeline-main.txt 2>&1
head -n 34 timeline-main.txt
gzip -f trace-main.csv
