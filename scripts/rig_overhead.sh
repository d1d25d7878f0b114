#!/usr/bin/env bash
# Proxy overhead of `anvil rig`: the same backend measured with `anvil bench` directly and through
# the rig, alternating (direct, rig, direct, rig, ...) so load from other work on the machine
# falls on both alike. Ends with a summary: per concurrency and path, the median over rounds of
# each figure, and the median and range of the per-round rig - direct differences.
# Usage: scripts/rig_overhead.sh [ANVIL_BINARY] [ROUNDS]
# Environment:
#   NUM_PROMPTS=40          requests per bench run
#   OUTPUT_LEN=128          tokens per request (64 in)
#   CONCURRENCIES="1 8"     --max-concurrency values
#   FAKE_BACKEND=PATH       back the rig with build/tests/anvil_fake_backend (no engine: what is
#                           measured is the gateway alone) instead of `anvil serve` on gpt-oss-tiny
#   FAKE_ARGS="..."         its pacing, default "--first-token-ms 0 --itl-ms 0" (answers at once)
set -euo pipefail
ANVIL=${1:-build/anvil}
ROUNDS=${2:-3}
NUM_PROMPTS=${NUM_PROMPTS:-40}
OUTPUT_LEN=${OUTPUT_LEN:-128}
CONCURRENCIES=${CONCURRENCIES:-1 8}
FAKE_ARGS=${FAKE_ARGS:---first-token-ms 0 --itl-ms 0}
FIXTURES=${ANVIL_FIXTURES_DIR:-$(cd "$(dirname "$0")/../.." && pwd)/shared/fixtures}
WORK=$(mktemp -d)
trap 'kill $RIG_PID 2>/dev/null || true; wait 2>/dev/null || true; rm -rf "$WORK"' EXIT

if [[ -n ${FAKE_BACKEND:-} ]]; then
  quoted=""
  for arg in $FAKE_ARGS; do quoted+=", \"$arg\""; done
  MODEL="    command: [\"$FAKE_BACKEND\", --port, \"\${PORT}\"$quoted]"
  echo "backend: $FAKE_BACKEND $FAKE_ARGS"
else
  MODEL="    model: $FIXTURES/gpt-oss-tiny
    args: [--kv-cache-memory, \"0.25\", --threads, \"1\"]"
  echo "backend: anvil serve $FIXTURES/gpt-oss-tiny --threads 1"
fi
cat >"$WORK/rig.yaml" <<YAML
listen: 127.0.0.1:0
state_dir: $WORK/state
models:
  tiny:
$MODEL
    preload: true
YAML
"$ANVIL" rig "$WORK/rig.yaml" --port 0 >"$WORK/rig.log" 2>&1 &
RIG_PID=$!
for _ in $(seq 200); do grep -q 'on http://' "$WORK/rig.log" && break; sleep 0.1; done
RIG_URL=$(grep -o 'http://127.0.0.1:[0-9]*' "$WORK/rig.log" | head -1)
for _ in $(seq 300); do
  curl -s "$RIG_URL/running" | grep -q '"state":"ready"' && break
  sleep 0.1
done
BACKEND_PORT=$(curl -s "$RIG_URL/running" | sed -n 's/.*"port":\([0-9]*\).*/\1/p')
DIRECT_URL=http://127.0.0.1:$BACKEND_PORT
echo "rig $RIG_URL -> backend $DIRECT_URL; $NUM_PROMPTS requests of $OUTPUT_LEN tokens per run, $ROUNDS rounds; load: $(cut -d' ' -f1-3 /proc/loadavg)"

bench() {
  "$ANVIL" bench --base-url "$1" --model tiny --endpoint /v1/completions --vocab-size 1024 --no-notebook \
    --num-prompts "$NUM_PROMPTS" --input-len 64 --output-len "$OUTPUT_LEN" --max-concurrency "$2" --num-warmups 2 --seed 1 --label "$3" \
    | tee "$WORK/last.txt"
  # One summary row: path concurrency round tok/s mean-TTFT median-TTFT p99-TTFT.
  awk -v path="$3" -v c="$2" -v r="$4" '
    /^Output token throughput/ {tps=$NF} /^Mean TTFT/ {mean=$NF} /^Median TTFT/ {med=$NF} /^P99 TTFT/ {p99=$NF}
    END {print path, c, r, tps, mean, med, p99}' "$WORK/last.txt" >>"$WORK/rows"
}
for round in $(seq "$ROUNDS"); do
  for concurrency in $CONCURRENCIES; do
    echo "=== round $round, concurrency $concurrency: direct"
    bench "$DIRECT_URL" "$concurrency" direct "$round"
    echo "=== round $round, concurrency $concurrency: rig"
    bench "$RIG_URL" "$concurrency" rig "$round"
  done
done

echo
echo "=== summary ($ROUNDS rounds; medians over rounds, then rig - direct per round: median [min, max])"
awk '
  function median(list,   n, a, i, j, t) {
    n = split(list, a, " ")
    for (i = 1; i <= n; i++) for (j = i + 1; j <= n; j++) if (a[j] + 0 < a[i] + 0) { t = a[i]; a[i] = a[j]; a[j] = t }
    return n % 2 ? a[(n + 1) / 2] : (a[n / 2] + a[n / 2 + 1]) / 2
  }
  function range(list,   n, a, i, lo, hi) {
    n = split(list, a, " "); lo = a[1]; hi = a[1]
    for (i = 2; i <= n; i++) { if (a[i] + 0 < lo + 0) lo = a[i]; if (a[i] + 0 > hi + 0) hi = a[i] }
    return sprintf("[%.3f, %.3f]", lo, hi)
  }
  { key = $1 " " $2; tps[key] = tps[key] " " $4; mean[key] = mean[key] " " $5; med[key] = med[key] " " $6; p99[key] = p99[key] " " $7
    v[$1, $2, $3, 4] = $4; v[$1, $2, $3, 5] = $5; v[$1, $2, $3, 6] = $6; cs[$2] = 1; if ($3 > rounds) rounds = $3 }
  END {
    printf "%-11s %-6s %12s %14s %16s %13s\n", "concurrency", "path", "tok/s", "mean TTFT ms", "median TTFT ms", "p99 TTFT ms"
    for (c in cs) for (p = 0; p < 2; p++) {
      path = p ? "rig" : "direct"; key = path " " c
      printf "%-11s %-6s %12.1f %14.3f %16.3f %13.3f\n", c, path, median(tps[key]), median(mean[key]), median(med[key]), median(p99[key])
    }
    for (c in cs) {
      dt = ""; dm = ""; dd = ""
      for (r = 1; r <= rounds; r++) {
        dt = dt " " 100 * (v["rig", c, r, 4] / v["direct", c, r, 4] - 1)
        dm = dm " " v["rig", c, r, 5] - v["direct", c, r, 5]
        dd = dd " " v["rig", c, r, 6] - v["direct", c, r, 6]
      }
      printf "concurrency %s: rig - direct: throughput %+.2f %% %s, mean TTFT %+.3f ms %s, median TTFT %+.3f ms %s\n", c,
             median(dt), range(dt), median(dm), range(dm), median(dd), range(dd)
    }
  }' "$WORK/rows"
