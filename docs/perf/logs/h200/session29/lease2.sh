#!/usr/bin/env bash
# Session 29's second call (carry [".gpu-pack12"], warm after session 28's lease8.sh): the same pack,
# three rounds, adding gate_up's raw scales with down's late release (raw3late, raw4late).
source "$(dirname "$0")/../session25/unpack.sh" .gpu-pack12 /tmp/lease29b > /dev/null 2>&1
A=$C/anvil
OUT=$OUT_ROOT/ab ANVIL_AB_BATCHES=1,8 ANVIL_AB_ROUNDS=3 ANVIL_AB_PREFILL=128 timeout 400 \
  bash scripts/gpu_ab.sh base=$C/anvil-base raw3=$A,ANVIL_X_GATE_STAGES=3 late=$A,ANVIL_X_DOWN_RELEASE=late \
  raw3late=$A,ANVIL_X_GATE_STAGES=3,ANVIL_X_DOWN_RELEASE=late raw4late=$A,ANVIL_X_GATE_STAGES=4,ANVIL_X_DOWN_RELEASE=late \
  > $OUT_ROOT/ab.txt 2>&1
tail -n 32 $OUT_ROOT/ab.txt
tar -czf $OUT_ROOT/ab.tgz -C $OUT_ROOT ab && rm -rf $OUT_ROOT/ab
