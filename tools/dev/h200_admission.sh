#!/usr/bin/env bash
# The A/B of --async-admission (perf-notes row 49) in one device call (the `device` tool's `run`,
# carrying .whl/): the short profile (90 words ≈ 205 prompt tokens, 200 output tokens) at c=64 and
# c=256 over HTTP against `pegainfer serve --random-preset lite --device cuda`, without and with the
# flag, each server warmed once at c=256 and traced, so that bench_serving's trace join reports the
# device-busy share of each (issue 29's measure). Everything goes to $OUT; the order of the two
# servers is a setting (ORDER="on off" puts the candidate first).
set -uo pipefail
source tools/dev/h200_env.sh
for side in ${ORDER:-off on}; do
  flag=""; [ "$side" = on ] && flag="--async-admission"
  echo "== async admission $side"
  serve "adm-$side" --trace-file "/tmp/trace-$side.jsonl" $flag
  timeout 100 python3 tools/bench_serving.py --base-url http://127.0.0.1:8000 --profile short --prompt-words 90 \
    --max-tokens 200 --concurrency 256 --num-requests 256 --no-progress --out /tmp/warm.json >/dev/null 2>&1
  timeout ${BENCH_S:-200} python3 tools/bench_serving.py --base-url http://127.0.0.1:8000 --profile short \
    --prompt-words 90 --max-tokens 200 --concurrency 64,256 --num-requests ${NUM:-1024} --no-progress \
    --trace-file "/tmp/trace-$side.jsonl" --trace-wait 20 \
    --claim "one H200, random Lite weights (bf16), greedy; --async-admission $side" --out "$OUT/admission-$side.json" \
    2>&1 | grep -E "concurrency|busy|rror" | tail -6
  kill -TERM $pid; wait $pid
done
echo "== tracebacks in daemon logs:"; grep -l Traceback "$OUT"/serve-adm-*.log 2>/dev/null || echo none
