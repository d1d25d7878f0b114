#!/usr/bin/env bash
# A/B timing on a GPU machine: variants of anvil (a binary, optionally with environment settings)
# take turns per model and round, so every variant is measured under the same clocks in the same
# lease (runs differ by a few percent from lease to lease). Prints a table last; the raw JSON of
# every run goes to $OUT (default /tmp/anvil-gpu-ab).
#
#   bash scripts/gpu_ab.sh NAME=BINARY[,VAR=VALUE...] ...
#   e.g. bash scripts/gpu_ab.sh base=.gpu-carry/anvil-base new=.gpu-carry/anvil \
#          new-cuda-cores=.gpu-carry/anvil,ANVIL_ATTENTION_MMA=0
#
# ANVIL_AB_MODELS (configs, default "gpt-oss-20b gpt-oss-120b"), ANVIL_AB_BATCHES (default 1,64),
# ANVIL_AB_ROUNDS (default 2), ANVIL_AB_PREFILL (prompt tokens of the prefill figure, default 2048),
# ANVIL_AB_EXTRA adds bench-gpu flags (e.g. "--decode-prompt 8192"),
# ANVIL_AB_TESTS=path runs that GPU test binary first (its log is $OUT/gpu_tests.log; its exit
# code is the script's). ANVIL_PREBUILT_LIB: the carried shared libraries (default .gpu-carry/lib).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/anvil-gpu-ab}
mkdir -p "$OUT"
LIB=${ANVIL_PREBUILT_LIB:-.gpu-carry/lib}
MODELS=${ANVIL_AB_MODELS:-gpt-oss-20b gpt-oss-120b}
BATCHES=${ANVIL_AB_BATCHES:-1,64}
ROUNDS=${ANVIL_AB_ROUNDS:-2}
PREFILL=${ANVIL_AB_PREFILL:-2048}
(($# > 0)) || { echo "usage: gpu_ab.sh NAME=BINARY[,VAR=VALUE...] ..." >&2; exit 2; }

status=0
if [ -n "${ANVIL_AB_TESTS:-}" ]; then
  timeout "${ANVIL_TEST_TIMEOUT:-300}" env "LD_LIBRARY_PATH=$LIB" "$ANVIL_AB_TESTS" >"$OUT/gpu_tests.log" 2>&1
  status=$?
  grep -E "^\[  (PASSED|FAILED) |^\[  FAILED" "$OUT/gpu_tests.log"
fi
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader | tee "$OUT/gpu.txt"

runs=()
for round in $(seq 1 "$ROUNDS"); do
  for model in $MODELS; do
    for variant in "$@"; do
      name=${variant%%=*}
      IFS=, read -r -a parts <<<"${variant#*=}"
      binary=${parts[0]}
      run="$model-$name-$round"
      timeout "${ANVIL_BENCH_TIMEOUT:-240}" env "LD_LIBRARY_PATH=$LIB" "${parts[@]:1}" "$binary" bench-gpu \
        --model "configs/$model" --load-format dummy --device cuda --batches "$BATCHES" \
        --prefill-tokens "$PREFILL" ${ANVIL_AB_EXTRA:-} >"$OUT/$run.json" 2>"$OUT/$run.err" ||
        { echo "$run failed:"; tail -3 "$OUT/$run.err"; }
      runs+=("$run")
    done
  done
done

python3 - "$OUT" "${runs[@]}" <<'EOF'
import json, pathlib, sys
out = pathlib.Path(sys.argv[1])
rows = []
for run in sys.argv[2:]:
    try:
        r = json.loads((out / f"{run}.json").read_text())
    except Exception:
        print(f"{run:36} (no result)")
        continue
    rows.append((run, r))
batches = sorted({d["batch"] for _, r in rows for d in r["decode"]})
print(f"\n{'run':36} {'prefill':>8} " + " ".join(f"{'b' + str(b):>7}" for b in batches) + f" {'b1 % ceil':>9}")
for run, r in rows:
    dec = {d["batch"]: d["tokens_per_s"] for d in r["decode"]}
    print(f"{run:36} {r['prefill_tokens_per_s']:8.0f} " + " ".join(f"{dec.get(b, 0):7.1f}" for b in batches)
          + f" {100 * r.get('decode_batch1_fraction_of_ceiling', 0):8.1f}%")
EOF
exit "$status"
