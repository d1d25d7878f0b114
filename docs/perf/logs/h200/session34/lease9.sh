#!/usr/bin/env bash
# Session 34's ninth call (carry [".gpu-pack34i"]): down releasing the next grid (qkv) later:
# once its tokens are staged (ANVIL_X_DOWN_RELEASE_AT=1) or after its chunk loop (2), instead of
# right after its wait (main), in case qkv's ring fills are what hold down's token round trip
# (lease 8: ~3 us even with no weights of its own in flight). Graph tests with 1 and 2, a batch-1
# A/B (three rounds, both models), then the probe build at 0, 1 and 2.
set -uo pipefail
source "$(dirname "$0")/../session25/unpack.sh" .gpu-pack34i /tmp/lease34i
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$OUT_ROOT/gpu.txt"
export ANVIL_FIXTURES_DIR=$PWD/$C/fixtures
T=$C/anvil_gpu_tests
tests=0
for e in 1 2; do
  ANVIL_X_DOWN_RELEASE_AT=$e timeout 100 $T --gtest_filter='CudaMoe.SumInDown*:CudaGraph*:Fixtures/FixtureGpuTest.*' \
    > "$OUT_ROOT/tests-$e.log" 2>&1 || tests=1
done
echo "tests exit $tests"
grep -hE "^\[  (PASSED|FAILED) |^\[  FAILED|Failure|Expected|Which is|differ" "$OUT_ROOT"/tests-*.log | head -n 12
tar -czf "$OUT_ROOT/tests.tgz" -C "$OUT_ROOT" tests-1.log tests-2.log && rm -f "$OUT_ROOT"/tests-*.log
[ "$tests" = 0 ] || exit 1
A=$C/anvil
OUT=$OUT_ROOT/ab ANVIL_AB_MODELS="gpt-oss-20b gpt-oss-120b" ANVIL_AB_BATCHES=1 ANVIL_AB_ROUNDS=3 \
  ANVIL_AB_PREFILL=512 timeout 300 bash scripts/gpu_ab.sh base=$A r1=$A,ANVIL_X_DOWN_RELEASE_AT=1 \
  r2=$A,ANVIL_X_DOWN_RELEASE_AT=2 > "$OUT_ROOT/ab.txt" 2>&1
tail -n 19 "$OUT_ROOT/ab.txt"
tar -czf "$OUT_ROOT/ab.tgz" -C "$OUT_ROOT" ab && rm -rf "$OUT_ROOT/ab"
for e in 0 1 2; do
  ANVIL_X_DOWN_RELEASE_AT=$e timeout 60 $C/anvil-base bench-gpu --model configs/gpt-oss-20b \
    --load-format dummy --device cuda --batches 1 --prefill-tokens 128 > "$OUT_ROOT/bench-$e.json" 2> "$OUT_ROOT/probe-$e.txt"
  echo "== down release at $e: $(grep -o '"tokens_per_s": [0-9.]*' "$OUT_ROOT/bench-$e.json" | tail -1)"
  grep -E "PROBE (down|  (waited|tokens|loop|end) )" "$OUT_ROOT/probe-$e.txt" | tail -n 5
done
cd "$OUT_ROOT" && tar -czf probe.tgz bench-*.json probe-*.txt && rm -f bench-*.json probe-*.txt
