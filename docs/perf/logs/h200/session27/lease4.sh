#!/usr/bin/env bash
# (The candidate is sum-in-down.patch here, applied to 3ab2cd3; see README.md.)
# Session 27's last call (carry [".gpu-pack5"]): lease3.sh's GPU suite alone (the session's device
# time was down to ~4 minutes, so no memcheck).
set -uo pipefail
source "$(dirname "$0")/../session25/unpack.sh" .gpu-pack5 /tmp/lease27d
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$OUT_ROOT/gpu.txt"
ANVIL_FIXTURES_DIR=$PWD/$C/fixtures timeout 120 $C/anvil_gpu_tests > "$OUT_ROOT/gpu_tests.log" 2>&1
echo "gpu tests exit $?"
grep -E "^\[  (PASSED|FAILED) |^\[  FAILED|tests ran" "$OUT_ROOT/gpu_tests.log" | tail -n 12
grep -E "^\[ +(OK|FAILED) .*(SumInDown|NormedToken|DecodeIntoCaches|OneTokenSteps|Chained)" "$OUT_ROOT/gpu_tests.log" | head -n 12
