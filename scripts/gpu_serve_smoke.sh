#!/usr/bin/env bash
# anvil serve on a GPU with the demo model (random gpt-oss, real tokenizer): health, greedy twice
# (same answer, prefix cache), streaming, sampling with n=2 and logprobs (logits come back to the
# host), 16 concurrent greedy requests against one alone, and the KV cache freed afterwards.
#   ANVIL_PREBUILT=dir (dir/anvil, dir/lib) or build/anvil; ANVIL_FIXTURES_DIR for the tokenizer.
set -u
cd "$(dirname "$0")/.."
B=${ANVIL_PREBUILT:-build}
OUT=${OUT:-/tmp/anvil-serve-smoke}
mkdir -p "$OUT"
FIXTURES=${ANVIL_FIXTURES_DIR:-$(cd .. && pwd)/shared/fixtures}
A() { env LD_LIBRARY_PATH=$B/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH} "$B/anvil" "$@"; }
D=/tmp/demo; mkdir -p $D
gzip -dc "$FIXTURES/o200k_harmony/tokenizer.json.gz" > $D/tokenizer.json
A init-demo --out $D --tokenizer $D/tokenizer.json || exit 1
A serve $D --served-model-name demo --port 8011 --device cuda > $OUT/serve.log 2>&1 &
PID=$!
for i in $(seq 90); do curl -sf localhost:8011/health >/dev/null && break; sleep 1; done
echo "health: $(curl -s -o /dev/null -w '%{http_code}' localhost:8011/health)"
Q='{"model":"demo","messages":[{"role":"user","content":"What does grep do?"}],"max_tokens":24,"temperature":0}'
curl -s localhost:8011/v1/chat/completions -H 'Content-Type: application/json' -d "$Q" > $OUT/greedy1.json
curl -s localhost:8011/v1/chat/completions -H 'Content-Type: application/json' -d "$Q" > $OUT/greedy2.json
curl -sN localhost:8011/v1/chat/completions -H 'Content-Type: application/json' -d "${Q%\}},\"stream\":true}" > $OUT/stream.txt
curl -s localhost:8011/v1/completions -H 'Content-Type: application/json' -d '{"model":"demo","prompt":"Hello","max_tokens":16,"temperature":0.8,"seed":3,"n":2,"logprobs":2}' > $OUT/sampled.json
PIDS=()
for i in $(seq 16); do curl -s localhost:8011/v1/completions -H 'Content-Type: application/json' -d '{"model":"demo","prompt":"The quick brown fox","max_tokens":32,"temperature":0}' > /tmp/par$i.json & PIDS+=($!); done
wait "${PIDS[@]}"
curl -s localhost:8011/v1/completions -H 'Content-Type: application/json' -d '{"model":"demo","prompt":"The quick brown fox","max_tokens":32,"temperature":0}' > $OUT/alone.json
curl -s localhost:8011/metrics | grep -E "^anvil:(kv_cache_usage|num_requests|generation_tokens)" > $OUT/metrics.txt
kill $PID
python3 - "$OUT" <<'PY'
import json, sys, pathlib
o = pathlib.Path(sys.argv[1])
g1 = json.loads((o/"greedy1.json").read_text()); g2 = json.loads((o/"greedy2.json").read_text())
print("greedy equal twice:", g1["choices"][0]["message"] == g2["choices"][0]["message"], "usage", g1.get("usage"))
s = (o/"stream.txt").read_text()
print("stream chunks:", s.count("data: "), "done:", "[DONE]" in s)
sm = json.loads((o/"sampled.json").read_text())
print("sampled n:", len(sm.get("choices", [])), "logprobs:", bool(sm["choices"][0].get("logprobs")) if sm.get("choices") else sm)
alone = json.loads((o/"alone.json").read_text())["choices"][0]["text"]
same = sum(json.loads(pathlib.Path(f"/tmp/par{i}.json").read_text())["choices"][0]["text"] == alone for i in range(1, 17))
print(f"16 concurrent greedy == alone: {same}/16")
print((o/"metrics.txt").read_text())
PY
sleep 2; tail -5 $OUT/serve.log
