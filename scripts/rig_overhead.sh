#!/usr/bin/env bash
# Proxy overhead of `anvil rig`: the same `anvil serve` backend measured with `anvil bench`
# directly and through the rig, alternating (direct, rig, direct, rig, ...) so load from other
# work on the machine falls on both alike.
# Usage: scripts/rig_overhead.sh [ANVIL_BINARY] [ROUNDS]
set -euo pipefail
ANVIL=${1:-build/anvil}
ROUNDS=${2:-3}
FIXTURES=${ANVIL_FIXTURES_DIR:-$(cd "$(dirname "$0")/../.." && pwd)/shared/fixtures}
WORK=$(mktemp -d)
trap 'kill $RIG_PID 2>/dev/null || true; wait 2>/dev/null || true; rm -rf "$WORK"' EXIT

cat >"$WORK/rig.yaml" <<YAML
listen: 127.0.0.1:0
state_dir: $WORK/state
models:
  tiny:
    model: $FIXTURES/gpt-oss-tiny
    args: [--kv-cache-memory, "0.25", --threads, "1"]
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
echo "rig $RIG_URL -> backend $DIRECT_URL"

bench() {
  "$ANVIL" bench --base-url "$1" --model tiny --endpoint /v1/completions --vocab-size 1024 \
    --num-prompts "$2" --input-len 64 --output-len 128 --max-concurrency "$3" --num-warmups 2 --seed 1 --label "$4"
}
for round in $(seq "$ROUNDS"); do
  for concurrency in 1 8; do
    echo "=== round $round, concurrency $concurrency: direct"
    bench "$DIRECT_URL" 40 "$concurrency" direct
    echo "=== round $round, concurrency $concurrency: rig"
    bench "$RIG_URL" 40 "$concurrency" rig
  done
done
