#!/usr/bin/env bash
# One device call (the `device` tool's `run`, carrying .whl/) over what several issues merged without
# a GPU, in priority order, each section skipped when the call's time would not hold it (BUDGET_S,
# default 540 s):
#   1. the lite daemon as served by default (batch invariant, device sampler): its start-up time to
#      /ready, then the reliability gate --url against it (--max-active 32; issue 26's output hash
#      stability on the GPU), tracebacks counted;
#   2. the GPU tests of the merged parts: batch invariance through the graphs, the device sampler in
#      the decode graph and its kernel, the prefill bank graphs and warm-up, the linear's tickets;
#   3. bench_direct at batch 1 with each sampling profile on one engine (issue 33's c=1 shape), the
#      sampler one program per row (--sample-chunks 0, the default) then split over 64 programs, their tokens compared (tools/dev/same_tokens.py);
#   3b. issue 30's bf16 agreement on the trained default model (tools/agreement.py, as h200_trained.sh);
#   4. bench_serving short profile at c=256, batch invariant against --no-batch-invariant (issue 26's cost).
# Everything it writes goes to $OUT.
set -uo pipefail
source tools/dev/h200_env.sh
export READY_TRIES=${READY_TRIES:-480}
t0=$(date +%s); budget=${BUDGET_S:-540}
left() { echo $(( budget - $(date +%s) + t0 )); }
# SECTIONS picks which run (default all): e.g. SECTIONS="2 3" when the gate already passed on this tree
SECTIONS=" ${SECTIONS:-1 2 3 3b 4} "; on() { [[ "$SECTIONS" == *" $1 "* ]]; }
if on 1; then
echo "== 1. serve (defaults, --max-active 32) and the reliability gate --url"
serve rel --trace-file /tmp/trace-rel.jsonl --max-active 32
echo "ready after $(( $(date +%s) - t0 )) s"; grep -E 'startup_time|warmup_done' "$OUT/serve-rel.log" | cut -c1-600
timeout $(( $(left) > 170 ? 170 : $(left) )) python3 tools/reliability.py --url http://127.0.0.1:8000 \
  --trace-file /tmp/trace-rel.jsonl --allow-skips --burst 256x2 --out "$OUT/reliability-url-lite-cuda.json" 2>&1 | tail -14
kill -TERM $pid; wait $pid
fi
if on 2; then
echo "== 2. GPU tests at $(( $(date +%s) - t0 )) s (the device sampler's first, alone, its whole output kept)"
timeout 100 python3 -m pytest -q -p no:cacheprovider -rfE -x --tb=short tests/engine/test_gpu_device_sampler.py \
  > "$OUT/gpu-tests-sampler.txt" 2>&1; tail -30 "$OUT/gpu-tests-sampler.txt"
# one pytest per file, each under its own limit, so that a cut keeps the files before it whole (one
# selection cut by the call's guard twice lost every failure's message)
for sel in "tests/engine/kernels/test_linear.py::test_gpu_tiny_shapes_keep_their_bits_across_the_wide_row_blocks" \
    tests/engine/test_gpu_prefill.py tests/engine/test_gpu_batch_invariance.py tests/engine/kernels/test_sample.py \
    "tests/engine/kernels/test_linear.py::test_gpu_tickets_give_the_second_launchs_bits_every_time"; do
  [ "$(left)" -gt 260 ] || { echo "skipped (time): $sel" | tee -a "$OUT/gpu-tests.txt"; continue; }
  echo "== $sel" >> "$OUT/gpu-tests.txt"
  timeout 120 python3 -m pytest -q -p no:cacheprovider -rfE --tb=short "$sel" >> "$OUT/gpu-tests.txt" 2>&1
  echo "$sel: $(tail -1 "$OUT/gpu-tests.txt")"
done
grep -E "^(FAILED|ERROR)|^E " "$OUT/gpu-tests.txt" | head -20
fi
if on 3; then
for chunks in 0 64; do
  [ "$(left)" -gt 130 ] || { echo "== 3. bench_direct --sample-chunks $chunks: skipped (time)"; continue; }
  echo "== 3. bench_direct batch 1, each sampling profile, --sample-chunks $chunks, at $(( $(date +%s) - t0 )) s"
  timeout 120 python3 tools/bench_direct.py --preset lite --batches 1 --prompt-len 86 --new-tokens 64 \
    --sampling greedy,top-p,penalties,logprobs --sample-chunks $chunks --out "$OUT/direct-sampling-b1-c$chunks.json" \
    2>&1 | grep -E "TPOT|rror" | tail -6
done
echo "== 3. the same tokens from both launch shapes:"
python3 tools/dev/same_tokens.py "$OUT/direct-sampling-b1-c0.json" "$OUT/direct-sampling-b1-c64.json"
fi
if on 3b && [ "$(left)" -gt 170 ]; then
  echo "== 3b. issue 30: tools/agreement.py on the trained default model (bf16 vs float32, 64 prompts x 64 tokens) at $(( $(date +%s) - t0 )) s"
  agreement_trained 150
fi
for mode in batch-invariant no-batch-invariant; do
  on 4 || continue
  [ "$(left)" -gt 90 ] || { echo "== 4. serving --$mode: skipped (time)"; continue; }
  echo "== 4. serving c=256 --$mode at $(( $(date +%s) - t0 )) s"
  serve "$mode" --$mode
  timeout 40 python3 tools/bench_serving.py --base-url http://127.0.0.1:8000 --profile short --prompt-words 90 \
    --max-tokens 200 --concurrency 256 --num-requests 256 --no-progress --out /tmp/warm.json >/dev/null 2>&1
  timeout 50 python3 tools/bench_serving.py --base-url http://127.0.0.1:8000 --profile short --prompt-words 90 \
    --max-tokens 200 --concurrency 256 --num-requests 768 --no-progress \
    --claim "one H200, random Lite weights (bf16), local backend, greedy; --$mode" --out "$OUT/serving-$mode.json" 2>&1 | tail -2
  kill -TERM $pid; wait $pid
done
echo "== tracebacks in daemon logs:"; grep -c Traceback "$OUT"/serve-*.log
