#!/usr/bin/env bash
# Session 34's eighth call (carry [".gpu-pack34h"]): down asking for fewer of its ring stages
# before its wait (ANVIL_X_DOWN_EARLY_STAGES=0 / 1; main: 2), in case its weights in flight are
# what hold its tokens' L2 round trip after the wait (lease 5: ~3 us). The MoE tests with 0 and 1,
# a batch-1 A/B (three rounds, both models), then the probe build (anvil-base, now with each
# block's SM: the last end per SM, grouped by the SM's block count) at 2 and 0.
set -uo pipefail
source "$(dirname "$0")/../session25/unpack.sh" .gpu-pack34h /tmp/lease34h
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$OUT_ROOT/gpu.txt"
export ANVIL_FIXTURES_DIR=$PWD/$C/fixtures
T=$C/anvil_gpu_tests
tests=0
for e in 0 1; do
  ANVIL_X_DOWN_EARLY_STAGES=$e timeout 100 $T --gtest_filter='CudaMoe.*:CudaGraph*' > "$OUT_ROOT/tests-$e.log" 2>&1 || tests=1
done
echo "tests exit $tests"
grep -hE "^\[  (PASSED|FAILED) |^\[  FAILED|Failure|Expected|Which is|differ" "$OUT_ROOT"/tests-*.log | head -n 12
tar -czf "$OUT_ROOT/tests.tgz" -C "$OUT_ROOT" tests-0.log tests-1.log && rm -f "$OUT_ROOT"/tests-*.log
[ "$tests" = 0 ] || exit 1
A=$C/anvil
OUT=$OUT_ROOT/ab ANVIL_AB_MODELS="gpt-oss-20b gpt-oss-120b" ANVIL_AB_BATCHES=1 ANVIL_AB_ROUNDS=3 \
  ANVIL_AB_PREFILL=512 timeout 300 bash scripts/gpu_ab.sh base=$A e1=$A,ANVIL_X_DOWN_EARLY_STAGES=1 \
  e0=$A,ANVIL_X_DOWN_EARLY_STAGES=0 > "$OUT_ROOT/ab.txt" 2>&1
tail -n 19 "$OUT_ROOT/ab.txt"
tar -czf "$OUT_ROOT/ab.tgz" -C "$OUT_ROOT" ab && rm -rf "$OUT_ROOT/ab"
for e in 2 0; do
  ANVIL_X_DOWN_EARLY_STAGES=$e timeout 60 $C/anvil-base bench-gpu --model configs/gpt-oss-20b \
    --load-format dummy --device cuda --batches 1 --prefill-tokens 128 > "$OUT_ROOT/bench-$e.json" 2> "$OUT_ROOT/probe-$e.txt"
  echo "== down early stages $e: $(grep -o '"tokens_per_s": [0-9.]*' "$OUT_ROOT/bench-$e.json" | tail -1)"
  grep PROBE "$OUT_ROOT/probe-$e.txt"
done
cd "$OUT_ROOT" && tar -czf probe.tgz bench-*.json probe-*.txt && rm -f bench-*.json probe-*.txt
