#!/usr/bin/env bash
# Issue 27 (paged latent cache, preemption, >256-row decode, prefix caching) on the H200, in ONE device
# call (the `device` tool's `run`, carrying .whl/), under 9 minutes:
#   1. GPU tests of the paged kernels (the split decode kernel and mla_prep through a scrambled page
#      table, the output kernel, the GPU engine tests);
#   2. bench_direct, lite, batch 1 / 256 / 512 / 1024 (batch-1 TPOT must stay <= 2.0 ms);
#   3. `pegainfer serve --max-model-len 32768 --no-prefix-caching`: bench_serving short profile (90
#      words in, 200 tokens out) at c=512 and c=1024 while /ready is polled (engine.running and
#      decode_batch_max: >= 512 sequences decoding at once), then the 4,000-token shared-prefix
#      requests without the cache (the reference output and TTFT);
#   4. `pegainfer serve --max-model-len 131072` (prefix caching on, the default): c=512 the same way,
#      then the shared-prefix TTFT (the second request's TTFT should be <= 15 ms) and its output
#      compared with the cache-off server's, token for token.
# Usage: bash tools/dev/h200_paged.sh      (everything goes to $OUT; a summary at the end)
#   SECTIONS="4" runs only what is named (default "1 2 3 4"); section 4 alone compares the prefix
#   output with PREFIX_OFF (default: the cache-off reference recorded on 2026-12-05,
#   docs/benchmarks/2026-12-05b-h100/call5/prefix-off.json).
set -uo pipefail
source tools/dev/h200_env.sh
T0=$(date +%s)
SECTIONS=" ${SECTIONS:-1 2 3 4} "; on() { [[ "$SECTIONS" == *" $1 "* ]]; }
PREFIX_OFF=${PREFIX_OFF:-docs/benchmarks/2026-12-05b-h100/call5/prefix-off.json}
left() { echo "[$(( $(date +%s) - T0 )) s]"; }
late() { [ $(( $(date +%s) - T0 )) -gt "${1:-470}" ] && echo "skipped: past ${1:-470} s of the call"; }

if on 1; then
echo "== 1. GPU tests (paged kernels, engine) $(left)"
timeout ${TEST_S:-120} python3 -m pytest -q -p no:cacheprovider tests/engine/kernels/test_mla_decode.py \
  tests/engine/kernels/test_mla_prep.py tests/engine/kernels/test_mla_output.py tests/engine/test_gpu_*.py -rfE --tb=short \
  > "$OUT/gpu-tests.txt" 2>&1; tail -15 "$OUT/gpu-tests.txt"

fi
if on 2; then
echo "== 2. bench_direct lite, batch 1/256/512/1024 $(left)"
timeout ${DIRECT_S:-150} python3 tools/bench_direct.py --preset lite --batches 1,256,512,1024 --prompt-len 86 \
  --new-tokens 48 --out "$OUT/direct-paged.json" 2>&1 | grep -E "TPOT|rror" | tail -6
fi

watch_ready() {  # poll /ready until the file $1 is removed; the largest engine.running seen etc. go to $2
  local flag=$1 out=$2
  ( while [ -e "$flag" ]; do curl -s --max-time 1 http://127.0.0.1:8000/ready; echo; sleep 0.2; done ) \
    | python3 -c '
import json, sys
m = {"running_max": 0, "waiting_max": 0, "decode_batch_max": 0, "kv_pages_in_use_max": 0, "samples": 0}
for line in sys.stdin:
    try: b = json.loads(line)
    except ValueError: continue
    e, p = b.get("engine") or {}, b.get("kv_pages") or {}
    m["samples"] += 1
    m["running_max"] = max(m["running_max"], e.get("running", 0)); m["waiting_max"] = max(m["waiting_max"], e.get("waiting", 0))
    m["decode_batch_max"] = max(m["decode_batch_max"], e.get("decode_batch_max", 0))
    m["kv_pages_in_use_max"] = max(m["kv_pages_in_use_max"], p.get("in_use", 0)); m["kv_pages_total"] = p.get("total")
    m["preemptions"] = p.get("preemptions")
print(json.dumps(m))' > "$out" &
  watcher=$!
}

bench() {  # bench NAME CONCURRENCY REQUESTS: bench_serving short profile with /ready watched
  local name=$1 c=$2 n=$3
  late 440 && return
  touch /tmp/watching; watch_ready /tmp/watching "$OUT/ready-$name.json"
  timeout ${BENCH_S:-75} python3 tools/bench_serving.py --base-url http://127.0.0.1:8000 --profile short \
    --prompt-words 90 --max-tokens 200 --concurrency "$c" --num-requests "$n" --no-progress \
    --claim "one H200, random Lite weights (bf16), local backend, greedy; $name" --out "$OUT/serving-$name.json" \
    2>&1 | tail -3
  rm -f /tmp/watching; wait $watcher
  echo "$name ready: $(cat "$OUT/ready-$name.json")"
  python3 -c "
import json
lv = json.load(open('$OUT/serving-$name.json'))['levels'][0]
m = lv['runs'][0]['metrics']
print('$name: c', lv['concurrency'], 'requests', lv['requests'], 'failed', m.get('failed'), 'output tok/s',
      round(m.get('output_throughput') or 0), 'TTFT p50 ms', m.get('median_ttft_ms'), 'TPOT p50 ms', m.get('median_tpot_ms'))
" 2>&1 | tail -2
}

warm() {  # capture the decode graphs of the large buckets before measuring
  timeout 60 python3 tools/bench_serving.py --base-url http://127.0.0.1:8000 --profile short --prompt-words 90 \
    --max-tokens 24 --concurrency 1024 --num-requests 1024 --no-progress --out /tmp/warm.json >/dev/null 2>&1
}

if on 3; then
echo "== 3. serve --max-model-len 32768 --no-prefix-caching $(left)"
serve ctx32k --max-model-len 32768 --no-prefix-caching
curl -s http://127.0.0.1:8000/ready | head -c 600; echo
warm
bench c512-32k 512 1024
bench c1024-32k 1024 2048
timeout 60 python3 tools/dev/prefix_ttft.py --base-url http://127.0.0.1:8000 --out "$OUT/prefix-off.json"
kill -TERM $pid; wait $pid
PREFIX_OFF="$OUT/prefix-off.json"
fi

if on 4; then
echo "== 4. serve --max-model-len 131072 (prefix caching on) $(left)"
serve ctx128k --max-model-len 131072
curl -s http://127.0.0.1:8000/ready | head -c 600; echo
warm
bench c512-128k 512 1024
timeout 60 python3 tools/dev/prefix_ttft.py --base-url http://127.0.0.1:8000 --out "$OUT/prefix-on.json" \
  --compare "$PREFIX_OFF"; echo "prefix compare exit $?"
curl -s http://127.0.0.1:8000/metrics | grep -E "^pegainfer:(prefix_cache|num_preemptions|kv_cache_usage)" | cut -c1-160
kill -TERM $pid; wait $pid
fi

echo "== summary $(left)"
grep -E "passed|failed" "$OUT/gpu-tests.txt" | tail -1
python3 - "$OUT" <<'EOF'
import glob, json, os, sys
out = sys.argv[1]
d = json.load(open(f"{out}/direct-paged.json")) if os.path.exists(f"{out}/direct-paged.json") else {}
for row in d.get("batches", []):
    print(f"direct batch {row.get('batch')}: TPOT p50 {row.get('tpot_ms_p50')} ms, {row.get('decode_tok_s', row.get('tok_s'))} tok/s")
for f in sorted(glob.glob(f"{out}/ready-*.json")):
    print(os.path.basename(f), open(f).read().strip())
for f in ("prefix-off.json", "prefix-on.json"):
    if os.path.exists(f"{out}/{f}"):
        r = json.load(open(f"{out}/{f}"))
        print(f, "TTFT min/median ms", r["ttft_ms_min"], r["ttft_ms_median"], "cached", r["cached_tokens"],
              "same text:", (r.get("same_text_as") or {}).get("all"))
EOF
echo "== tracebacks in daemon logs:"; grep -l Traceback "$OUT"/serve-*.log 2>/dev/null || echo none
