#!/usr/bin/env bash
# Session 25's second call (carry [".gpu-pack2"]), right after lease.sh on the same machine:
#   bash docs/perf/logs/h200/session25/lease2.sh
# Timings only (no GPU tests, no fixtures in this pack): session 23's FP16 ring depths for the
# batch-1 MoE (variants s2, s4, s5: main at 22c0eed plus each patch) against main; the decode-
# attention ring at a 4,096-token context (16 splits of 3-chunk rings instead of 16 splits of one
# chunk per warp); what a grid barrier in a persistent kernel costs against a kernel boundary
# (tools/cuda-harness/grid_barrier.cu, chain_latency.cu); and the batch-1 MoE product fed by the
# bulk copy engine (tools/cuda-harness/moe_probe.cu `both bulk`). Probes built here for sm_90a.
set -uo pipefail
source "$(dirname "$0")/unpack.sh" .gpu-pack2 /tmp/lease25b

OUT=$OUT_ROOT/ab ANVIL_AB_BATCHES=1,8,64 ANVIL_AB_ROUNDS=2 ANVIL_AB_PREFILL=128 timeout 220 \
  bash scripts/gpu_ab.sh base=$C/anvil-base s2=$C/variants/s2/anvil s4=$C/variants/s4/anvil \
  s5=$C/variants/s5/anvil > "$OUT_ROOT/ab.txt" 2>&1
tail -n 30 "$OUT_ROOT/ab.txt"

OUT=$OUT_ROOT/long ANVIL_AB_MODELS=gpt-oss-20b ANVIL_AB_BATCHES=1,8 ANVIL_AB_ROUNDS=2 ANVIL_AB_PREFILL=128 \
  ANVIL_AB_EXTRA="--decode-prompt 4096" timeout 150 \
  bash scripts/gpu_ab.sh base=$C/anvil-base new=$C/anvil noring=$C/anvil,ANVIL_X_RING=0 > "$OUT_ROOT/long.txt" 2>&1
tail -n 12 "$OUT_ROOT/long.txt"

for probe in grid_barrier chain_latency; do
  [ -x $C/extra/$probe ] && timeout 40 $C/extra/$probe > "$OUT_ROOT/$probe.txt" 2>&1
  cat "$OUT_ROOT/$probe.txt"
done
# The batch-1 MoE products alone: f16_m1 (the model's FP16 form) against the same arithmetic fed
# by the bulk copy engine (f16_bulk, session 25), each also as its arithmetic alone and copies alone.
[ -x $C/extra/moe_probe ] && timeout 100 $C/extra/moe_probe both bulk > "$OUT_ROOT/moe_probe.txt" 2>&1
grep -E "CHECK|PERF.*(f16|bulk)" "$OUT_ROOT/moe_probe.txt"
