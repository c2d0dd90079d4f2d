#!/usr/bin/env bash
# Issue 29 on the H200, one device call (the `device` tool's `run`, carrying .whl/): the serving tax.
# The short profile (90 words ≈ 205 prompt tokens, 200 output tokens) at c=64 and c=256, over HTTP
# (bench_serving against `pegainfer serve --random-preset lite --device cuda`, with the server's trace
# for the device-busy share) and in process (tools/bench_replay.py: the same workload, the same
# runtime, no HTTP), then the HTTP tax as bench_serving over replay (--compare), and each server's
# slowest steps with prompt rows (tools/benchkit/steps.py --slowest). Then 10 bursts of
# 1024 new streaming connections (reliability scenario connection_burst) against a fresh server.
# Usage: [LEVELS=64,256] [NUM=1024] [EXTRA="daemon flags"] [TAG=name] [SKIP_DETOK=1] [SKIP_BURST=1] [SLOWEST=12] [FIRST=0] [RAW=1] \
#        bash tools/dev/h200_tax.sh
#   e.g. the --max-step-prompts A/B in one call: bash tools/dev/h200_tax.sh; \
#        EXTRA="--max-step-prompts 0" TAG=nocap bash tools/dev/h200_tax.sh
#   RAW=1 also runs the HTTP workload with bench_serving's lean client (--client raw) on the same server.
# Everything it writes goes to $OUT.
set -uo pipefail
source tools/dev/h200_env.sh
LEVELS=${LEVELS:-64,256}
WORKLOAD=(--profile short --prompt-words 90 --max-tokens 200 --concurrency "$LEVELS" --num-requests ${NUM:-1024})
# EXTRA: more daemon flags for both sides, e.g. EXTRA="--max-step-prompts 0" (word-split)
read -ra extra <<< "${EXTRA:-}"
TAG=${TAG:-base}  # names this side's files in $OUT (run the A/B's sides with different tags)
rm -f /tmp/trace-http.jsonl /tmp/trace-replay.jsonl /tmp/trace-burst.jsonl  # the exporter appends
# bench_replay's daemon flags; serve() (h200_env.sh) adds the first two itself
SERVE=(--random-preset lite --device cuda ${extra[@]+"${extra[@]}"})
window_gaps() {  # REPORT TRACE: each run's idle lead, tail and widest gaps inside its own window (steps --gaps)
  python3 -c 'import json,sys
for lv in json.load(open(sys.argv[1]))["levels"]:
    for r in lv["runs"]: print(lv["concurrency"], *r["window_ns"])' "$1" | while read -r c since until; do
    echo "-- c=$c: the device's idle time inside the run's window"
    python3 -m tools.benchkit.steps "$2" --since-ns "$since" --until-ns "$until" --gaps 8 --first ${FIRST:-0} | sed -n '2,$p'
  done
  python3 -c 'import json,sys
for lv in json.load(open(sys.argv[1]))["levels"]:
    for r in lv["runs"]:
        a = r.get("arrival_lag")
        if a: print("-- c=%d: client send -> server receipt ms: median %.1f, p99 %.1f, max %.1f" % (
            lv["concurrency"], a["median_ms"], a["p99_ms"], a["max_ms"]))' "$1"
}
echo "== HTTP (bench_serving)"
serve "http-$TAG" --trace-file /tmp/trace-http.jsonl ${extra[@]+"${extra[@]}"}
timeout 100 python3 tools/bench_serving.py --base-url http://127.0.0.1:8000 --profile short --prompt-words 90 \
  --max-tokens 200 --concurrency 256 --num-requests 256 --no-progress --out /tmp/warm.json >/dev/null 2>&1
timeout 200 python3 tools/bench_serving.py --base-url http://127.0.0.1:8000 "${WORKLOAD[@]}" --no-progress \
  --trace-file /tmp/trace-http.jsonl --trace-wait 20 --claim "one H200, random Lite weights (bf16), greedy; HTTP" \
  --out "$OUT/tax-http-$TAG.json" 2>&1 | tail -4
if [ -n "${RAW:-}" ]; then  # the same workload again with bench_serving's lean client (--client raw)
  timeout 200 python3 tools/bench_serving.py --base-url http://127.0.0.1:8000 "${WORKLOAD[@]}" --no-progress \
    --client raw --trace-file /tmp/trace-http.jsonl --trace-wait 20 \
    --claim "one H200, random Lite weights (bf16), greedy; HTTP, raw client" --out "$OUT/tax-http-raw-$TAG.json" 2>&1 | tail -3
fi
kill -TERM $pid; wait $pid
echo "-- the HTTP server's slowest steps with prompt rows (warm-up included)"
python3 -m tools.benchkit.steps /tmp/trace-http.jsonl --slowest ${SLOWEST:-12} 2>&1 | tee "$OUT/steps-http-$TAG.txt" | tail -${SLOWEST:-12}
window_gaps "$OUT/tax-http-$TAG.json" /tmp/trace-http.jsonl
[ -n "${RAW:-}" ] && { echo "-- with the raw client:"; window_gaps "$OUT/tax-http-raw-$TAG.json" /tmp/trace-http.jsonl; }
echo "== in process (bench_replay), same workload"
timeout 200 python3 tools/bench_replay.py "${WORKLOAD[@]}" --warmup 256 --warmup-concurrency 256 \
  --compare "$OUT/tax-http-$TAG.json" --out "$OUT/tax-replay-$TAG.json" \
  -- "${SERVE[@]}" --trace-file /tmp/trace-replay.jsonl 2>&1 | tail -6
python3 -m tools.benchkit.steps /tmp/trace-replay.jsonl --slowest ${SLOWEST:-12} 2>&1 | tee "$OUT/steps-replay-$TAG.txt" | tail -${SLOWEST:-12}
window_gaps "$OUT/tax-replay-$TAG.json" /tmp/trace-replay.jsonl
if [ -n "${RAW:-}" ]; then  # the raw client's HTTP / replay, per level
  python3 -c 'import json,sys
rep = {lv["concurrency"]: lv["summary"]["output_throughput"]["median"] for lv in json.load(open(sys.argv[2]))["levels"]}
for lv in json.load(open(sys.argv[1]))["levels"]:
    c, h = lv["concurrency"], lv["summary"]["output_throughput"]["median"]
    if rep.get(c): print("concurrency %4d: raw client HTTP / replay output tok/s = %.3f" % (c, h / rep[c]))' \
    "$OUT/tax-http-raw-$TAG.json" "$OUT/tax-replay-$TAG.json"
fi
if [ "${SKIP_DETOK:-0}" != 1 ]; then
  timeout 200 python3 tools/bench_replay.py "${WORKLOAD[@]}" --warmup 256 --warmup-concurrency 256 --detokenize \
    --compare "$OUT/tax-http-$TAG.json" --out "$OUT/tax-replay-detok-$TAG.json" -- "${SERVE[@]}" 2>&1 | tail -3
fi
if [ "${SKIP_BURST:-0}" != 1 ]; then
  echo "== 10 bursts of 1024 new streaming connections"
  serve "burst-$TAG" --trace-file /tmp/trace-burst.jsonl
  timeout 200 python3 tools/reliability.py --url http://127.0.0.1:8000 --trace-file /tmp/trace-burst.jsonl \
    --scenarios connection_burst --burst 1024x10 --out "$OUT/reliability-burst-$TAG.json" 2>&1 | tail -8
  kill -TERM $pid; wait $pid
fi
echo "== tracebacks in daemon logs:"; grep -l Traceback "$OUT"/serve-*.log 2>/dev/null || echo none
