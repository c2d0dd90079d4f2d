#!/usr/bin/env bash
# Same-call A/B on the H200 (the `device` tool's `run`, carrying .whl/ and the BEFORE tree): the tree
# in BEFORE (e.g. `git archive SHA | tar -x -C .ab/before`) against this checkout, on
#   bench_direct --preset lite --batches 1,64, and
#   bench_serving --profile short --prompt-words 90 --max-tokens 200 at concurrency 256 (one warm pass
#   of 256 requests first, then 1,024 measured), each server `--random-preset lite --device cuda`.
# BEFORE (the old layout, top-level packages) runs from its own folder; this checkout runs as the
# `pegainfer` package through tools/dev/devpath.sh. Reports go to $OUT as {direct,serving}-{before,after}.json.
# Usage: [DIRECT_ORDER="before after"] [SERVING_ORDER="before after"] bash tools/dev/h200_ab.sh .ab/before [extra bench_direct args]
set -uo pipefail
BEFORE=$(cd "$1" && pwd); shift
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
HERE=$PWD
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONUNBUFFERED=1
DEV=$(bash tools/dev/devpath.sh /tmp/pegainfer-dev)
pypath() { [ "$1" = before ] && echo "$BEFORE:/tmp/site" || echo "$DEV:/tmp/site"; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
for name in ${DIRECT_ORDER-before after}; do
  tree=$([ $name = before ] && echo "$BEFORE" || echo "$HERE")
  echo "== bench_direct $name"
  (cd "$tree" && PYTHONPATH=$(pypath $name) timeout 200 python3 tools/bench_direct.py --preset lite \
     --batches 1,64 --prompt-len 86 --new-tokens 64 "$@" --out "$OUT/direct-$name.json" 2>&1 | grep -E "TPOT|batch|error|Error" | tail -8)
done
i=0
for name in ${SERVING_ORDER-before after}; do  # e.g. SERVING_ORDER="after before after": the first server runs colder
  i=$((i + 1))
  tree=$([ $name = before ] && echo "$BEFORE" || echo "$HERE")
  echo "== serving $name ($i)"
  cd "$tree"
  mod=$([ $name = before ] && echo daemon.cli || echo pegainfer.daemon.cli)
  PYTHONPATH=$(pypath $name) python3 -m $mod serve --random-preset lite --device cuda --port 8000 \
     --trace-file /tmp/trace-$name.jsonl > "$OUT/serve-$i-$name.log" 2>&1 &
  pid=$!
  for _ in $(seq 240); do curl -sf http://127.0.0.1:8000/ready >/dev/null && break; sleep 0.5; done
  PYTHONPATH=$(pypath $name) timeout 120 python3 tools/bench_serving.py --base-url http://127.0.0.1:8000 \
     --profile short --prompt-words 90 --max-tokens 200 --concurrency 256 --num-requests 256 --out /tmp/warm-$name.json >/dev/null 2>&1
  PYTHONPATH=$(pypath $name) timeout 150 python3 tools/bench_serving.py --base-url http://127.0.0.1:8000 \
     --trace-file /tmp/trace-$name.jsonl --trace-wait 30 --profile short --prompt-words 90 --max-tokens 200 \
     --concurrency 256 --num-requests 1024 --claim "one H200, random Lite weights (bf16), local backend, greedy; A/B $name" \
     --out "$OUT/serving-$i-$name.json" 2>&1 | grep -E "256 \||error" | tail -3
  kill -TERM $pid; wait $pid; echo "server exit $?"
  cd "$HERE"
done
echo "== tracebacks in server logs:"; grep -l Traceback "$OUT"/serve-*.log 2>/dev/null || echo none
