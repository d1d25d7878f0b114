#!/usr/bin/env bash
# Session 32's second call (carry [".gpu-pack32p", ".gpu-pack32q"]): where the one-launch experts
# lose their time. anvil-probe (this build: the pack's code plus ANVIL_MOE_ONE_LAUNCH_PROBE) with
# probe 1 (plain stores instead of the atomic adds), 2 (no down), 3 (no cluster exchange); each
# wrong in its results, timed only. A/B at 20b batch 1 and a trace of each.
set -uo pipefail
source "$(dirname "$0")/../session25/unpack.sh" .gpu-pack32p /tmp/lease32b
P=$C/anvil
F=$P
# .gpu-pack32q/anvil.gz, where carried: the same with the route weight read without a dependent load.
[ -f .gpu-pack32q/anvil.gz ] && { gunzip -c .gpu-pack32q/anvil.gz > /tmp/anvil-fix && chmod +x /tmp/anvil-fix && F=/tmp/anvil-fix; }
OUT=$OUT_ROOT/ab ANVIL_AB_MODELS=gpt-oss-20b ANVIL_AB_BATCHES=1 ANVIL_AB_ROUNDS=1 ANVIL_AB_PREFILL=128 timeout 200 \
  bash scripts/gpu_ab.sh two=$P,ANVIL_MOE_ONE_LAUNCH=0 one=$P,ANVIL_MOE_ONE_LAUNCH=1 \
  st=$P,ANVIL_MOE_ONE_LAUNCH=1,ANVIL_MOE_ONE_LAUNCH_PROBE=1 nodown=$P,ANVIL_MOE_ONE_LAUNCH=1,ANVIL_MOE_ONE_LAUNCH_PROBE=2 \
  nox=$P,ANVIL_MOE_ONE_LAUNCH=1,ANVIL_MOE_ONE_LAUNCH_PROBE=3 fix=$F,ANVIL_MOE_ONE_LAUNCH=1 > "$OUT_ROOT/ab.txt" 2>&1
tail -n 9 "$OUT_ROOT/ab.txt"
tar -czf "$OUT_ROOT/ab.tgz" -C "$OUT_ROOT" ab && rm -rf "$OUT_ROOT/ab"
R=$PWD
for probe in 1 2 3; do
  (cd "$OUT_ROOT" && ANVIL_MOE_ONE_LAUNCH=1 ANVIL_MOE_ONE_LAUNCH_PROBE=$probe CUDA_INJECTION64_PATH=$R/$C/libkernel_trace.so \
    ANVIL_TRACE_OUT=trace-p$probe.csv timeout 60 $R/$P bench-gpu --model $R/configs/gpt-oss-20b --load-format dummy \
    --device cuda --batches 1 --prefill-tokens 128 > /dev/null 2>&1
   python3 $R/tools/cuda-harness/graph_timeline.py trace-p$probe.csv --top 3 --chain 24:27 > timeline-p$probe.txt 2>&1
   echo "probe $probe"; sed -n '2,5p;/#    start/,$p' timeline-p$probe.txt | head -n 9; gzip -f trace-p$probe.csv)
done
