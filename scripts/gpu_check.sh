#!/usr/bin/env bash
# The whole GPU check in one command, for a machine with an NVIDIA GPU (the lent H200):
# build (or take prebuilt binaries), run every GPU test, benchmark the gpt-oss shapes with dummy
# weights, and print a short table last. Full logs go to $OUT (default /tmp/anvil-gpu-check).
#
#   bash scripts/gpu_check.sh                    build here with CUDA for ANVIL_CUDA_TARGETS
#   ANVIL_PREBUILT=dir bash scripts/gpu_check.sh  use dir/anvil and dir/anvil_gpu_tests (built
#                                                 elsewhere; dir/lib holds their shared libraries)
# ANVIL_FIXTURES_DIR points at a copy of shared/fixtures (../shared/fixtures by default).
# ANVIL_BENCH_MODELS lists the configs to benchmark (default: gpt-oss-20b gpt-oss-120b).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/anvil-gpu-check}
mkdir -p "$OUT"
export ANVIL_FIXTURES_DIR=${ANVIL_FIXTURES_DIR:-$(cd .. && pwd)/shared/fixtures}
MODELS=${ANVIL_BENCH_MODELS:-gpt-oss-20b gpt-oss-120b}

if [ -n "${ANVIL_PREBUILT:-}" ]; then
  BIN=$ANVIL_PREBUILT
  TESTS=$ANVIL_PREBUILT/anvil_gpu_tests
  # Only anvil's own binaries see the carried libraries (python3 below must not).
  RUN=(env "LD_LIBRARY_PATH=$ANVIL_PREBUILT/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}")
else
  cmake -S . -B build-gpu -DCMAKE_BUILD_TYPE=Release -DANVIL_BUILD_BENCH=OFF -DANVIL_CUDA=ON \
    -DANVIL_CUDA_TARGETS="${ANVIL_CUDA_TARGETS:-sm_90a}" >"$OUT/configure.log" 2>&1 || { cat "$OUT/configure.log"; exit 1; }
  cmake --build build-gpu -j "$(nproc)" --target anvil anvil_gpu_tests >"$OUT/build.log" 2>&1 ||
    { tail -50 "$OUT/build.log"; exit 1; }
  BIN=build-gpu
  TESTS=build-gpu/tests/anvil_gpu_tests
  RUN=(env)
fi

nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv | tee "$OUT/gpu.txt"
"${RUN[@]}" "$BIN/anvil" doctor | tee "$OUT/doctor.txt"

timeout "${ANVIL_TEST_TIMEOUT:-300}" "${RUN[@]}" "$TESTS" 2>&1 | tee "$OUT/gpu_tests.log"
tests_status=${PIPESTATUS[0]}

for model in $MODELS; do
  timeout "${ANVIL_BENCH_TIMEOUT:-240}" "${RUN[@]}" "$BIN/anvil" bench-gpu --model "configs/$model" --load-format dummy --device cuda >"$OUT/bench-$model.json" \
    2>"$OUT/bench-$model.err" || { echo "bench-gpu $model failed:"; tail -5 "$OUT/bench-$model.err"; }
done

python3 - "$OUT" $MODELS <<'EOF'
import json, re, sys, pathlib
out = pathlib.Path(sys.argv[1])
log = (out / "gpu_tests.log").read_text(errors="replace")
print("\n== GPU tests ==")
for line in log.splitlines():
    if re.match(r"\[  (PASSED|FAILED|SKIPPED) ", line) or "[ gpu fixture ]" in line or line.startswith("[  FAILED"):
        print(line)
print("\n== benchmarks (dummy weights, bf16 attention and KV) ==")
print(f"{'model':14} {'copy GB/s':>9} {'prefill tok/s':>13} {'b1':>7} {'b8':>7} {'b32':>7} {'b64':>7} {'b1 % ceil':>9} {'mem GiB':>8}")
for model in sys.argv[2:]:
    path = out / f"bench-{model}.json"
    try:
        r = json.loads(path.read_text())
    except Exception:
        print(f"{model:14} (no result)")
        continue
    dec = {d["batch"]: d["tokens_per_s"] for d in r["decode"]}
    print(f"{model:14} {r['copy_bandwidth_gbps']:9.0f} {r['prefill_tokens_per_s']:13.0f} "
          + " ".join(f"{dec.get(b, 0):7.0f}" for b in (1, 8, 32, 64))
          + f" {100 * r.get('decode_batch1_fraction_of_ceiling', 0):8.1f}% {r['memory_used_gib']:8.1f}")
EOF
exit "$tests_status"
