#!/usr/bin/env bash
# Issue 26 on the H200, in two device calls (the `device` tool's `run`, carrying .whl/):
#   bash tools/dev/h200_invariance.sh tests    GPU tests (kernels, engine, batch invariance up to 256
#                                              rows) and bench_direct batch 1 and 256, batch-invariant
#                                              against --no-batch-invariant in the same call;
#   bash tools/dev/h200_invariance.sh serving  bench_serving short profile at c=256 against
#                                              `pegainfer serve --random-preset lite --device cuda`
#                                              with and without --no-batch-invariant (alternating,
#                                              the first server runs colder), then the reliability gate:
#                                              --url against the GPU daemon (lite, --max-active 32), and
#                                              --spawn on the GPU with host-staged ep 2 (tiny model);
#   bash tools/dev/h200_invariance.sh timeline the decode graph's kernel timeline (gpu_probe --timeline)
#                                              at batch 1 and 256, invariant and not: where the cost is.
# Everything it writes goes to $OUT.
set -uo pipefail
source tools/dev/h200_env.sh
what=${1:-tests}
if [ "$what" = timeline ]; then
  for bi in 1 0; do
    echo "== gpu_probe --timeline --batch-invariant $bi"
    timeout ${TIMELINE_S:-120} python3 tools/dev/gpu_probe.py --batches 1,256 --variants triton --timeline \
      --batch-invariant $bi --out "$OUT/timeline-bi$bi.json" > "$OUT/timeline-bi$bi.txt" 2>&1
    grep -E '"tpot_p50_ms"|timeline_batch' "$OUT/timeline-bi$bi.txt" | cut -c1-400
  done
  exit 0
fi
if [ "$what" = tests ]; then
  echo "== GPU tests"
  timeout ${TEST_S:-260} python3 -m pytest -q -p no:cacheprovider tests/engine/kernels tests/engine/test_gpu_*.py tests/engine/test_sampler.py \
    tests/ep/test_gpu.py -rf 2>&1 | tail -40 | tee "$OUT/gpu-tests.txt"
  echo "== linear: row blocks' bits and time (tools/dev/linear_blockm.py), vs cuBLAS (linear_bench.py)"
  timeout 100 python3 tools/dev/linear_blockm.py --out "$OUT/linear-blockm.json" 2>&1 | tail -10
  timeout 100 python3 tools/dev/linear_bench.py --out "$OUT/linear-bench.json" 2>&1 | tail -45
  echo "== sampler kernel (issue 33): engine/kernels/sample.py against engine.sampler (tools/dev/sample_bench.py)"
  timeout 100 python3 tools/dev/sample_bench.py --device cuda --out "$OUT/sample-bench.json" 2>&1 | tail -20
  for mode in batch-invariant no-batch-invariant; do
    echo "== bench_direct --$mode"
    timeout 150 python3 tools/bench_direct.py --preset lite --batches 1,256 --prompt-len 86 --new-tokens 64 --$mode \
      --out "$OUT/direct-$mode.json" 2>&1 | grep -E "TPOT|rror" | tail -4
  done
  exit 0
fi
i=0
for mode in ${SERVING_ORDER-batch-invariant no-batch-invariant batch-invariant no-batch-invariant}; do
  i=$((i + 1)); echo "== serving $i --$mode"
  # shellcheck disable=SC2086
  serve "$i-$mode" --trace-file "/tmp/trace-$i-$mode.jsonl" --$mode ${SERVE_FLAGS:-}
  timeout 100 python3 tools/bench_serving.py --base-url http://127.0.0.1:8000 --profile short --prompt-words 90 \
    --max-tokens 200 --concurrency 256 --num-requests 256 --out "/tmp/warm-$i.json" >/dev/null 2>&1
  timeout 120 python3 tools/bench_serving.py --base-url http://127.0.0.1:8000 --trace-file "/tmp/trace-$i-$mode.jsonl" \
    --trace-wait 20 --profile short --prompt-words 90 --max-tokens 200 --concurrency 256 --num-requests 1024 \
    --claim "one H200, random Lite weights (bf16), local backend, greedy; --$mode" \
    --out "$OUT/serving-$i-$mode.json" >/dev/null 2>&1; echo "bench exit $?"
  kill -TERM $pid; wait $pid
done
[ "${SKIP_GATE:-0}" = 1 ] && exit 0  # the serving A/B only
echo "== reliability --url, GPU daemon (lite, --max-active 32)"
serve rel --trace-file /tmp/trace-rel.jsonl --max-active 32
# --allow-skips: --url skips the scenarios that end the server; the --spawn call below runs them
timeout ${REL_URL_S:-200} python3 tools/reliability.py --url http://127.0.0.1:8000 --trace-file /tmp/trace-rel.jsonl \
  --allow-skips --burst 1024x10 --out "$OUT/reliability-url-lite-cuda.json" 2>&1 | tail -20
kill -TERM $pid; wait $pid
echo "== reliability --spawn, host-staged ep 2, cuda (tiny)"
timeout ${REL_SPAWN_S:-200} python3 tools/reliability.py --spawn --device cuda --backend host-staged --ep-size 2 \
  --work-dir /tmp/rh --out "$OUT/reliability-hs2-cuda.json" 2>&1 | tail -20
echo "== tracebacks in daemon logs:"; grep -l Traceback "$OUT"/serve-*.log /tmp/rh/*.log 2>/dev/null || echo none
