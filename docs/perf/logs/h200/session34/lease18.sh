#!/usr/bin/env bash
# Session 34, only on an H200 (carry [".gpu-pack34r"]; lease15.sh with a new pack): 6517ec1 (fp16 activations into down)
# against main before it (anvil-base, 701d58b) at the bars' settings (batches 1 and 64, 2,048-token
# prefill), two rounds. On any other card it stops at once (the bars are the H200's).
set -uo pipefail
source "$(dirname "$0")/../session25/unpack.sh" .gpu-pack34r /tmp/lease34r
name=$(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$OUT_ROOT/gpu.txt")
echo "$name"
case "$name" in *H200*) ;; *) echo "not an H200: nothing run"; exit 0 ;; esac
OUT=$OUT_ROOT/ab ANVIL_AB_BATCHES=1,64 ANVIL_AB_ROUNDS=2 ANVIL_AB_PREFILL=2048 timeout 280 \
  bash scripts/gpu_ab.sh main=$C/anvil-base f16act=$C/anvil > "$OUT_ROOT/ab.txt" 2>&1
tail -n 10 "$OUT_ROOT/ab.txt"
tar -czf "$OUT_ROOT/ab.tgz" -C "$OUT_ROOT" ab && rm -rf "$OUT_ROOT/ab"
