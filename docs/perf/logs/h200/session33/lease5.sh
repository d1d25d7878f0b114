#!/usr/bin/env bash
# Session 33's fifth call (carry [".gpu-pack33p"]): where the routing in o_proj's tail goes.
# Same binary, batch 1 (128-token prefill figure), both models, two rounds: the routing launch
# (ANVIL_ROUTE_IN_PROJECTION=0), the routing in o_proj (fence + ticket), and three switches of
# ANVIL_ROUTE_PROBE: 1 the ticket as one acq_rel atomic (no separate fences), 2 no ticket (the
# grid's last block reduces at once; timing only, its sums are wrong), 3 the ticket without the
# reduction or the picks (timing only: the tables stay stale).
set -uo pipefail
source "$(dirname "$0")/../session25/unpack.sh" .gpu-pack33p /tmp/lease33e
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$OUT_ROOT/gpu.txt"
A=$C/anvil
OUT=$OUT_ROOT/ab ANVIL_AB_MODELS="${ANVIL_AB_MODELS:-gpt-oss-20b gpt-oss-120b}" ANVIL_AB_BATCHES=1 ANVIL_AB_ROUNDS=2 \
  ANVIL_AB_PREFILL=128 timeout "${ANVIL_AB_S:-400}" \
  bash scripts/gpu_ab.sh launch=$A,ANVIL_ROUTE_IN_PROJECTION=0 routed=$A acqrel=$A,ANVIL_ROUTE_PROBE=1 \
  noticket=$A,ANVIL_ROUTE_PROBE=2 noreduce=$A,ANVIL_ROUTE_PROBE=3 > "$OUT_ROOT/ab.txt" 2>&1
tail -n 24 "$OUT_ROOT/ab.txt"
tar -czf "$OUT_ROOT/ab.tgz" -C "$OUT_ROOT" ab && rm -rf "$OUT_ROOT/ab"
