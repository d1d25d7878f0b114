#!/usr/bin/env bash
# Session 32's probe of the expert layout (carry [".gpu-pack32v"]): batch 1's gate_up (ANVIL_PROBE_TILED=1)
# and also down (=2) reading their rows as if the codes were stored in 16-row tiles (each chunk's
# 16 rows x 64 bytes one contiguous 1 KB) instead of row after row: the same bytes, wrong values,
# timed only. A/B at batch 1, then a trace of each probe.
set -uo pipefail
source "$(dirname "$0")/../session25/unpack.sh" .gpu-pack32v /tmp/lease32e
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$OUT_ROOT/gpu.txt"
A=$C/anvil
OUT=$OUT_ROOT/ab ANVIL_AB_MODELS="${ANVIL_AB_MODELS:-gpt-oss-20b gpt-oss-120b}" ANVIL_AB_BATCHES=1 ANVIL_AB_ROUNDS=2 \
  ANVIL_AB_PREFILL=128 timeout "${ANVIL_AB_S:-300}" \
  bash scripts/gpu_ab.sh rows=$A tiled1=$A,ANVIL_PROBE_TILED=1 tiled2=$A,ANVIL_PROBE_TILED=2 > "$OUT_ROOT/ab.txt" 2>&1
tail -n 14 "$OUT_ROOT/ab.txt"
tar -czf "$OUT_ROOT/ab.tgz" -C "$OUT_ROOT" ab && rm -rf "$OUT_ROOT/ab"
R=$PWD
for probe in 0 2; do
  (cd "$OUT_ROOT" && ANVIL_PROBE_TILED=$probe CUDA_INJECTION64_PATH=$R/$C/libkernel_trace.so \
    ANVIL_TRACE_OUT=trace-t$probe.csv timeout 60 $R/$A bench-gpu --model $R/configs/gpt-oss-20b --load-format dummy \
    --device cuda --batches 1 --prefill-tokens 128 > /dev/null 2>&1
   python3 $R/tools/cuda-harness/graph_timeline.py trace-t$probe.csv --top 4 --chain 24:30 > timeline-t$probe.txt 2>&1
   echo "probe $probe"; sed -n '2,7p;/#    start/,$p' timeline-t$probe.txt | head -n 14; gzip -f trace-t$probe.csv)
done
