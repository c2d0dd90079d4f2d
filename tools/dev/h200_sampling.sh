#!/usr/bin/env bash
# Issue 33 on the H200, in one device call (the `device` tool's `run`, carrying .whl/; under 9 min):
#   1. GPU tests of the sampler: the kernels (tests/engine/kernels/test_sample.py and the split
#      launches' test_sample_split.py, lite's vocabulary,
#      up to 256 rows, a CUDA graph's replays), the sampler inside the captured decode graph against
#      engine.sampler on mixed batches (tests/engine/test_gpu_device_sampler.py), and bitwise batch
#      invariance through it (tests/engine/test_gpu_batch_invariance.py, crowds of 63 and 254);
#      then tools/dev/sample_bench.py: the kernel's device time per batch and mix;
#   2. bench_direct, random Lite weights: every sampling profile at batch 1, 64 and 256 on one engine;
#   3. bench_serving against `pegainfer serve --random-preset lite --device cuda`: each profile at
#      c=1 and c=64 (and greedy and mix at c=256), after one warm pass that captures the graphs;
#   4. tools/dev/sampling_targets.py: the tables and issue 33's targets (met / MISSED).
# Usage: bash tools/dev/h200_sampling.sh [all|tests|direct|serving]   (default all)
#        AB=1 bash tools/dev/h200_sampling.sh direct   adds bench_direct with --device-sampler off (the
#        path before issue 33) for an in-process A/B (not in the default call: it would pass 9 minutes)
# Everything it writes goes to $OUT; the section time limits are env knobs (TEST_S, DIRECT_S, ...).
set -uo pipefail
source tools/dev/h200_env.sh
what=${1:-all}
PROFILES=${PROFILES:-"greedy top-p penalties logprobs mix"}
if [ "$what" = all ] || [ "$what" = tests ]; then
  echo "== GPU tests (sampler kernel, sampler in the decode graph, batch invariance through it)"
  crowd=tests/engine/test_gpu_batch_invariance.py::test_a_request_is_the_same_alone_and_in_a_crowd_on_the_gpu
  timeout ${TEST_S:-300} python3 -m pytest -q -p no:cacheprovider tests/engine/kernels/test_sample.py \
    tests/engine/kernels/test_sample_split.py tests/engine/kernels/test_precompile.py \
    tests/engine/test_gpu_device_sampler.py "$crowd[63-True-8192]" "$crowd[254-True-8192]" -rf --tb=short 2>&1 \
    | grep -v "^  " | tail -40 | tee "$OUT/gpu-tests.txt"
  echo "== the sampler kernel's device time against engine.sampler (tools/dev/sample_bench.py)"
  timeout ${KERNEL_S:-45} python3 tools/dev/sample_bench.py --device cuda --logits peaked --out "$OUT/sample-bench.json" \
    2>&1 | tail -12
fi
if [ "$what" = all ] || [ "$what" = direct ]; then
  echo "== bench_direct, every profile at batch 1, 64, 256 (lite, overlapped as the daemon runs)"
  timeout ${DIRECT_S:-110} python3 tools/bench_direct.py --preset lite --batches 1,64,256 --prompt-len 86 \
    --new-tokens 32 --warmup 1 --iters 2 --sampling greedy,top-p,penalties,logprobs,mix \
    --out "$OUT/direct-sampling.json" 2>&1 | grep -E "TPOT|rror" | tail -16
  if [ "${AB:-0}" = 1 ]; then  # the path before issue 33 (logits out of the graph, engine.sampler), same workload
    echo "== bench_direct --device-sampler off (A/B)"
    timeout ${DIRECT_S:-110} python3 tools/bench_direct.py --preset lite --batches 1,64,256 --prompt-len 86 \
      --new-tokens 32 --warmup 1 --iters 2 --sampling top-p,penalties,logprobs,mix --device-sampler off \
      --out "$OUT/direct-sampling-off.json" 2>&1 | grep -E "TPOT|rror" | tail -12
  fi
fi
if [ "$what" = all ] || [ "$what" = serving ]; then
  echo "== serving, one lite daemon, each profile (200 output tokens, 90-word prompts)"
  # no prefix caching: every profile sends the same prompts, and a later one would find them cached
  # a 4,096-token context and 256 streams (what the profiles use): 60 decode graphs instead of 92; the
  # start still took 206 s on an H100 (2026-12-05e), 118 s of it compiling the sampler (perf-notes)
  serve sampling --trace-file /tmp/trace-sampling.jsonl --no-prefix-caching ${SERVE_ARGS:---max-model-len 4096 --max-active 256}
  echo "ready after $SECONDS s (curl /ready: $(curl -s -o /dev/null -w %{http_code} http://127.0.0.1:8000/ready))"
  grep -E 'sampler_precompiled|startup_time' "$OUT"/serve-sampling.log | cut -c1-500
  bench() {  # bench PROFILE CONCURRENCY NUM_REQUESTS OUT [args...]
    local prof=$1 conc=$2 num=$3 out=$4; shift 4
    timeout ${BENCH_S:-60} python3 tools/bench_serving.py --base-url http://127.0.0.1:8000 --profile short \
      --prompt-words 90 --max-tokens 200 --sampling "$prof" --concurrency "$conc" --num-requests "$num" --no-progress \
      --claim "one H200, random Lite weights (bf16), local backend, sampling $prof" --out "$out" "$@" 2>&1 \
      | grep -E "concurrency|rror" | sed "s/^/$prof /"
  }
  for prof in greedy penalties mix; do  # capture the batch and length buckets of tokens / sample / sample_lp graphs
    bench "$prof" 256 256 "/tmp/warm-$prof.json" --warmup 0 >/dev/null
  done
  for prof in $PROFILES; do
    bench "$prof" 1 ${NUM_C1:-8} "/tmp/c1-$prof.json" --warmup 2
    bench "$prof" 64 ${NUM_C64:-128} "/tmp/c64-$prof.json" --warmup 0
    parts="c1 c64"
    case $prof in greedy|mix)
      bench "$prof" 256 ${NUM_C256:-512} "/tmp/c256-$prof.json" --warmup 0; parts="c1 c64 c256";;
    esac
    python3 tools/dev/sampling_targets.py --merge "$OUT/serving-$prof.json" $(for k in $parts; do echo "/tmp/$k-$prof.json"; done)
  done
  kill -TERM $pid; wait $pid
  echo "== tracebacks in the daemon log:"; grep -c Traceback "$OUT"/serve-sampling.log || true
fi
echo "== issue 33 targets"
python3 tools/dev/sampling_targets.py --serving "$OUT" --direct "$OUT/direct-sampling.json" | tee "$OUT/sampling-targets.txt"
