#!/usr/bin/env bash
# Issue 33's kernel speed on the H200 (the `device` tool's `run`, carrying .whl/): the device
# sampler with each row split over a fixed number of programs (KernelConfig.sample.chunks 64:
# engine/kernels/sample_split.py) against one program per row (chunks 0, the default and the
# kernel measured on 2026-12-05), docs/perf-notes.md row 47.
#   1. GPU tests: the split against the one-program kernel bit for bit (tokens, log-probs, top-N) at
#      lite's vocabulary, 1-256 rows, crowds, chi-square, a CUDA graph's replays
#      (tests/engine/kernels/test_sample_split.py), and the one-program kernel's own tests
#      (tests/engine/kernels/test_sample.py);
#   2. tools/dev/sample_bench.py --chunks 0,64: both launch shapes per mix, batch and logits kind, with
#      bits_equal_c64 (the split's bits against the one program's) and argmax_us for the greedy mix;
#   3. bench_direct on random Lite weights, greedy / top-p / penalties / logprobs at batch 1 and 64,
#      --sample-chunks 0 then 64: the sampled TPOT against greedy's, both launch shapes, and their tokens compared (tools/dev/same_tokens.py).
# Usage: bash tools/dev/h200_sample_split.sh [all|tests|kernel|direct]   (default all)
# A fresh machine compiles every kernel variant first (the split's round launch ~30-70 s a variant on
# a CPU core; Triton caches them on the machine): run the three sections as three calls on one warm
# machine if all does not fit in one call's 10 minutes.
# Everything it writes goes to $OUT; the section time limits are env knobs (TEST_S, KERNEL_S, DIRECT_S).
set -uo pipefail
source tools/dev/h200_env.sh
what=${1:-all}
if [ "$what" = all ] || [ "$what" = tests ]; then
  echo "== GPU tests (the split sampler against the one-program kernel; the one-program kernel)"
  timeout ${TEST_S:-300} python3 -m pytest -q -p no:cacheprovider tests/engine/kernels/test_sample_split.py \
    tests/engine/kernels/test_sample.py -k gpu -rf 2>&1 | tail -20 | tee "$OUT/gpu-tests.txt"
fi
if [ "$what" = all ] || [ "$what" = kernel ]; then
  echo "== the sampler's device time, one program per row (c0) and split (c64) (tools/dev/sample_bench.py)"
  timeout ${KERNEL_S:-240} python3 tools/dev/sample_bench.py --device cuda --chunks 0,64 --rows 1,64,256 \
    --mixes greedy,temperature,top_p,top_k_penalties,mix --logits peaked,flat \
    --out "$OUT/sample-bench.json" 2>&1 | tail -32 | tee "$OUT/sample-bench.txt"
fi
if [ "$what" = all ] || [ "$what" = direct ]; then
  for chunks in 0 64; do
    echo "== bench_direct --sample-chunks $chunks (lite, batch 1 and 64)"
    timeout ${DIRECT_S:-200} python3 tools/bench_direct.py --preset lite --batches 1,64 --prompt-len 86 \
      --new-tokens 32 --warmup 1 --iters 3 --sampling greedy,top-p,penalties,logprobs --sample-chunks $chunks \
      --out "$OUT/direct-chunks$chunks.json" 2>&1 | grep -E "TPOT|rror" | tail -10
  done
  echo "== the same tokens from both launch shapes (bench_direct's token_hash per profile and batch)"
  python3 tools/dev/same_tokens.py "$OUT/direct-chunks0.json" "$OUT/direct-chunks64.json"
fi
