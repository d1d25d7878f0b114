#!/usr/bin/env bash
# Session 26's third call (carry [".gpu-pack3"]): bash docs/perf/logs/h200/session26/lease3.sh
# The pack is session 25's first one (.gpu-carry/anvil-base = main, whose src/ and tests/ are
# those of 22c0eed; .gpu-carry/anvil = the three candidates with their lease switches;
# .gpu-carry/anvil_gpu_tests = the candidates' suite) with s4 and the trace library taken out,
# and main's own suite (anvil_gpu_tests-main) and the repaired moe_probe put in.
#   1. Each candidate alone (calls 1-2 only had all three, and all three less one).
#   2. Which candidate crashes qwen3moe-tiny's bf16 one-token steps (call 1's suite).
#   3. The batch-1 MoE probe with the bulk-fed form (call 2's crashed in the present kernel).
#   4. main's whole GPU suite.
set -uo pipefail
source "$(dirname "$0")/../session25/unpack.sh" .gpu-pack3 /tmp/lease26

OUT=$OUT_ROOT/ab ANVIL_AB_BATCHES=1,8,64 ANVIL_AB_ROUNDS=2 ANVIL_AB_PREFILL=128 timeout 150 \
  bash scripts/gpu_ab.sh base=$C/anvil-base \
  ring=$C/anvil,ANVIL_X_PENDING=0,ANVIL_X_L2TAIL=0 \
  pending=$C/anvil,ANVIL_X_RING=0,ANVIL_X_L2TAIL=0 \
  l2=$C/anvil,ANVIL_X_RING=0,ANVIL_X_PENDING=0 > "$OUT_ROOT/ab.txt" 2>&1
tail -n 20 "$OUT_ROOT/ab.txt"
tar -czf "$OUT_ROOT/ab.tgz" -C "$OUT_ROOT" ab && rm -rf "$OUT_ROOT/ab"

for off in "ANVIL_X_L2TAIL=0" "ANVIL_X_RING=0" "ANVIL_X_PENDING=0" "ANVIL_X_NONE=1"; do
  env $off ANVIL_FIXTURES_DIR=$PWD/$C/fixtures timeout 30 $C/anvil_gpu_tests \
    --gtest_filter='Fixtures/FixtureGpuTest.OneTokenSteps*' > "$OUT_ROOT/bisect-$off.log" 2>&1
  echo "candidates' one-token steps with $off: exit $?"
done

[ -x $C/extra/moe_probe ] && timeout 100 $C/extra/moe_probe both bulk > "$OUT_ROOT/moe_probe.txt" 2>&1
echo "moe_probe exit $?"
grep -E "CHECK|PERF" "$OUT_ROOT/moe_probe.txt"

ANVIL_FIXTURES_DIR=$PWD/$C/fixtures timeout 200 $C/anvil_gpu_tests-main > "$OUT_ROOT/tests-main.log" 2>&1
echo "main's gpu tests exit $?"
grep -E "^\[  (PASSED|FAILED) |^\[  FAILED|tests ran" "$OUT_ROOT/tests-main.log" | tail -n 8
