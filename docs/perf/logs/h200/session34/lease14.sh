#!/usr/bin/env bash
# Session 34's fourteenth call (carry [".gpu-pack34n"]): with down's token staging short now
# (0319c9a), a fourth ring stage for down again (ANVIL_X_DOWN_STAGES=4; session 33 measured it
# -1.1 to -1.5 % while the staging hid the ring's round trips). SumInDown with it, then a batch-1
# A/B, three rounds, both models.
set -uo pipefail
source "$(dirname "$0")/../session25/unpack.sh" .gpu-pack34n /tmp/lease34n
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$OUT_ROOT/gpu.txt"
export ANVIL_FIXTURES_DIR=$PWD/$C/fixtures
ANVIL_X_DOWN_STAGES=4 timeout 100 $C/anvil_gpu_tests --gtest_filter='CudaMoe.SumInDown*:CudaGraph*' > "$OUT_ROOT/tests.log" 2>&1
echo "tests exit $?"
grep -hE "^\[  (PASSED|FAILED) |^\[  FAILED|Failure" "$OUT_ROOT/tests.log" | head -n 6
gzip -f "$OUT_ROOT/tests.log"
A=$C/anvil
OUT=$OUT_ROOT/ab ANVIL_AB_MODELS="gpt-oss-20b gpt-oss-120b" ANVIL_AB_BATCHES=1 ANVIL_AB_ROUNDS=3 \
  ANVIL_AB_PREFILL=512 timeout 240 bash scripts/gpu_ab.sh s3=$A s4=$A,ANVIL_X_DOWN_STAGES=4 > "$OUT_ROOT/ab.txt" 2>&1
tail -n 13 "$OUT_ROOT/ab.txt"
tar -czf "$OUT_ROOT/ab.tgz" -C "$OUT_ROOT" ab && rm -rf "$OUT_ROOT/ab"
