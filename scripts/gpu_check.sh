#!/usr/bin/env bash
# The whole GPU check in one command, for a machine with an NVIDIA GPU (the lent H200):
# build (or take prebuilt binaries), run every GPU test, benchmark the gpt-oss shapes with dummy
# weights, and print a short table last. Full logs go to $OUT (default /tmp/anvil-gpu-check).
#
#   bash scripts/gpu_check.sh                    build here with CUDA for ANVIL_CUDA_TARGETS
#   ANVIL_PREBUILT=dir bash scripts/gpu_check.sh  use dir/anvil and dir/anvil_gpu_tests (built
#                                                 elsewhere; dir/lib holds their shared libraries)
# ANVIL_FIXTURES_DIR points at a copy of shared/fixtures (../shared/fixtures by default).
# ANVIL_BENCH_MODELS lists the configs to benchmark (default: gpt-oss-20b gpt-oss-120b);
# ANVIL_SKIP_QWEN=1 leaves out the Qwen3-30B-A3B runs (bf16 experts as shipped, and quantized).
# ANVIL_BASE=path/to/an/earlier/anvil adds an A/B: per model, that binary and this one alternate
# twice at batches 1 and 64, so a change is judged against its base under the same clocks and
# in the same lease (runs differ by a few percent from lease to lease). scripts/gpu_carry.sh
# packs binaries built elsewhere (and a base) for the lent machine.
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

RESULTS=()
bench() {  # bench NAME MODEL [extra bench-gpu flags...]; BENCH_BINARY overrides $BIN/anvil
  local name=$1 model=$2
  shift 2
  timeout "${ANVIL_BENCH_TIMEOUT:-240}" "${RUN[@]}" "${BENCH_BINARY:-$BIN/anvil}" bench-gpu --model "configs/$model" \
    --load-format dummy --device cuda "$@" >"$OUT/bench-$name.json" 2>"$OUT/bench-$name.err" ||
    { echo "bench-gpu $name failed:"; tail -5 "$OUT/bench-$name.err"; }
  RESULTS+=("$name")
}
for model in $MODELS; do bench "$model" "$model" --profile; done
# The attention projections quantized to FP8 at load (--quantize-dense fp8): half their bytes.
for model in $MODELS; do bench "$model-fp8" "$model" --quantize-dense fp8 --batches 1,64; done
# The experts re-quantized at load (--quantize-experts; runs named -xnvfp4, -xfp8): NVFP4 (a
# scale per 16 codes), FP8 (a byte per weight and a scale per row).
for model in $MODELS; do
  for format in nvfp4 fp8; do bench "$model-x$format" "$model" --quantize-experts $format --batches 1,64; done
done
# Qwen3-30B-A3B with its bf16 experts as shipped and quantized at load: all on the same MoE
# kernels as gpt-oss's (bf16, MXFP4, NVFP4 and FP8 kinds).
if [ -z "${ANVIL_SKIP_QWEN:-}" ]; then
  bench "qwen3-30b-a3b-bf16" Qwen3-30B-A3B --batches 1,8,64
  for format in mxfp4 nvfp4 fp8; do
    bench "qwen3-30b-a3b-x$format" Qwen3-30B-A3B --quantize-experts $format --batches 1,64
  done
fi
if [ -n "${ANVIL_BASE:-}" ]; then
  for model in $MODELS; do
    for round in 1 2; do
      BENCH_BINARY=$ANVIL_BASE bench "$model-base-$round" "$model" --batches 1,64
      bench "$model-new-$round" "$model" --batches 1,64
    done
  done
fi
# The first model again kernel by kernel: what the decode graphs are worth.
if [ -z "${ANVIL_SKIP_EAGER:-}" ]; then
  first=${MODELS%% *}
  bench "$first-eager" "$first" --enforce-eager --batches 1,64
fi

python3 - "$OUT" "${RESULTS[@]}" <<'EOF'
import json, re, sys, pathlib
out = pathlib.Path(sys.argv[1])
log = (out / "gpu_tests.log").read_text(errors="replace")
print("\n== GPU tests ==")
for line in log.splitlines():
    if re.match(r"\[  (PASSED|FAILED|SKIPPED) ", line) or "[ gpu fixture ]" in line or line.startswith("[  FAILED"):
        print(line)
print("\n== benchmarks (dummy weights, bf16 attention and KV) ==")
print(f"{'run':20} {'copy GB/s':>9} {'prefill tok/s':>13} {'b1':>7} {'b8':>7} {'b32':>7} {'b64':>7} {'b1 % ceil':>9} {'mem GiB':>8}")
for model in sys.argv[2:]:
    path = out / f"bench-{model}.json"
    try:
        r = json.loads(path.read_text())
    except Exception:
        print(f"{model:20} (no result)")
        continue
    dec = {d["batch"]: d["tokens_per_s"] for d in r["decode"]}
    print(f"{model:20} {r['copy_bandwidth_gbps']:9.0f} {r['prefill_tokens_per_s']:13.0f} "
          + " ".join(f"{dec.get(b, 0):7.0f}" for b in (1, 8, 32, 64))
          + f" {100 * r.get('decode_batch1_fraction_of_ceiling', 0):8.1f}% {r['memory_used_gib']:8.1f}")
for model in sys.argv[2:]:
    try:
        r = json.loads((out / f"bench-{model}.json").read_text())
    except Exception:
        continue
    for d in r["decode"]:
        p = d.get("profile_us_per_step")
        if p and d["batch"] == 1:
            print(f"\n== {model}: one batch-1 decode step, kernel by kernel (us) ==")
            for name, us in sorted(p.items(), key=lambda kv: -kv[1]):
                print(f"  {name:24} {us:9.1f}")
EOF
exit "$tests_status"
