#!/usr/bin/env bash
# The next GPU calls (after 2026-12-06c's H100 calls: docs/benchmarks/2026-12-06c-device.md), each
# about 9 minutes, carrying .whl/:
#   bash tools/dev/h200_next.sh tax        issue 29 at c=256, one call, two sides (h200_tax.sh, no
#                                          detokenising replay, no burst; --max-active 256): the plain
#                                          daemon, then --max-step-prompts 64 --async-admission (both off
#                                          by default until this A/B)
#   bash tools/dev/h200_next.sh tax2       issue 29 at c=64 and c=256 in one call: the defaults against
#                                          --async-admission, each run's idle gaps; results in one archive
#   bash tools/dev/h200_next.sh start      issue 29: the c=256 HTTP level's first steps and first wave;
#                                          issue 26's cost at 256 rows; the merge's launch-shape GPU test
#   bash tools/dev/h200_next.sh tax3       issue 29's two levels at the defaults, one side (windows: first send
#                                          to last completion)
#   bash tools/dev/h200_next.sh invariance issue 26's cost with the experts' wide tiling: bench_direct
#                                          batch 1 and 256 and the c=256 short profile, invariant
#                                          against --no-batch-invariant (h200_invariance.sh's parts)
#   bash tools/dev/h200_next.sh norm-linear-tests  the GPU tests of issue 26's one-row invariant
#                                          launches (opt-in, KernelConfig.norm_linear_rows) and of the
#                                          split attention (the merge's launch shapes)
#   bash tools/dev/h200_next.sh norm-linear decode TPOT at batch 1 and 64 with and without them, the
#                                          merge's 16-column blocks and 4 warps, and without invariance,
#                                          one process each (gpu_probe --timeline)
#   bash tools/dev/h200_long.sh            issue 28's TTFT / TPOT / cold-start / mixed-load targets
set -uo pipefail
what=${1:-tax}
pack() {  # the device tool brings back 8 files at most: everything in $OUT as one archive
  (cd "$OUT" && tar czf "results-$1.tgz" --exclude='*.tgz' . && find . -type f ! -name '*.tgz' -delete)
}
if [ "$what" = tax ]; then
  common="--max-active 256 --max-model-len 4096"
  LEVELS=256 NUM=512 SKIP_DETOK=1 SKIP_BURST=1 EXTRA="$common" TAG=base bash tools/dev/h200_tax.sh
  LEVELS=256 NUM=512 SKIP_DETOK=1 SKIP_BURST=1 EXTRA="$common --max-step-prompts 64 --async-admission" \
    TAG=cap64-admission bash tools/dev/h200_tax.sh
  exit 0
fi
if [ "$what" = start ]; then  # issue 29: how the c=256 HTTP level gets going (its first steps, the
  # first wave's send spread and first tokens), then issue 26's cost at 256 rows and the merge's GPU test
  source tools/dev/h200_env.sh
  rm -f /tmp/trace-s.jsonl
  serve start --trace-file /tmp/trace-s.jsonl --max-active 256 --max-model-len 4096
  timeout 100 python3 tools/bench_serving.py --base-url http://127.0.0.1:8000 --profile short --prompt-words 90 \
    --max-tokens 200 --concurrency 256 --num-requests 256 --no-progress --out /tmp/warm.json >/dev/null 2>&1
  timeout 150 python3 tools/bench_serving.py --base-url http://127.0.0.1:8000 --profile short --prompt-words 90 \
    --max-tokens 200 --concurrency 256 --num-requests 512 --no-progress --trace-file /tmp/trace-s.jsonl \
    --trace-wait 20 --out "$OUT/start-http.json" 2>&1 | grep concurrency
  kill -TERM $pid; wait $pid
  python3 - "$OUT/start-http.json" <<'PY'
import json, sys
run = json.load(open(sys.argv[1]))["levels"][0]["runs"][0]
wave = [r for r in run["requests"] if r.get("sent_ms") is not None]
wave = sorted((r["sent_ms"], r["sent_ms"] + (r["ttft_ms"] or 0)) for r in wave)[:256]
print("first wave: sent over %.1f ms; first tokens at p0 %.1f p10 %.1f p50 %.1f p100 %.1f ms" % (
    wave[-1][0], *[sorted(t for _, t in wave)[int(q * 255)] for q in (0, .1, .5, 1)]))
print("window_ns", *run["window_ns"])
PY
  read -r since until < <(python3 -c 'import json,sys; print(*json.load(open(sys.argv[1]))["levels"][0]["runs"][0]["window_ns"])' "$OUT/start-http.json")
  python3 -m tools.benchkit.steps /tmp/trace-s.jsonl --since-ns "$since" --until-ns "$until" --gaps 6 --first 24
  for inv in 1 0; do
    echo "== gpu_probe batch 256 --batch-invariant $inv"
    timeout 100 python3 tools/dev/gpu_probe.py --batches 256 --variants triton --new-tokens 16 --batch-invariant $inv \
      --out "$OUT/probe256-inv$inv.json" 2>&1 | grep -E '"tpot_p50_ms"|rror' | cut -c1-120
  done
  timeout 100 python3 -m pytest -q -p no:cacheprovider tests/engine/kernels/test_mla_decode.py \
    -k test_gpu_the_merges_launch_shape_keeps_the_bits --tb=line 2>&1 | tail -2
  pack start
  exit 0
fi
if [ "$what" = tax3 ]; then  # issue 29's two levels in one call at the defaults, windows first send to last
  # completion (2026-12-06d), each window's idle and first steps
  LEVELS=64,256 NUM=512 SKIP_DETOK=1 SKIP_BURST=1 SLOWEST=3 FIRST=10 EXTRA="--max-active 256 --max-model-len 4096" \
    TAG=base bash tools/dev/h200_tax.sh
  pack tax3
  exit 0
fi
if [ "$what" = tax2 ]; then  # issue 29's two levels in one call: the defaults (64 prompts a step at most)
  # against --async-admission, with each run's idle gaps (steps --gaps)
  common="--max-active 256 --max-model-len 4096"
  LEVELS=64,256 NUM=512 SKIP_DETOK=1 SKIP_BURST=1 SLOWEST=4 EXTRA="$common" TAG=base bash tools/dev/h200_tax.sh
  LEVELS=64,256 NUM=512 SKIP_DETOK=1 SKIP_BURST=1 SLOWEST=4 EXTRA="$common --async-admission" TAG=admission \
    bash tools/dev/h200_tax.sh
  pack tax2
  exit 0
fi
source tools/dev/h200_env.sh
if [ "$what" = norm-linear-tests ]; then
  timeout 500 python3 -m pytest -q -p no:cacheprovider tests/engine/kernels/test_norm_linear.py \
    tests/engine/test_gpu_norm_linear.py -k "gpu or crowd" -rf --tb=short 2>&1 | grep -v "^  " | tail -12
  timeout 80 python3 -m pytest -q -p no:cacheprovider tests/engine/kernels/test_mla_decode.py -k gpu -rf \
    --tb=short 2>&1 | grep -v "^  " | tail -4
  exit 0
fi
if [ "$what" = norm-linear ]; then
  for flags in "--norm-linear-rows 1" "" "--batch-invariant 0"; do
    echo "== gpu_probe ${flags:-(defaults)}"
    # shellcheck disable=SC2086
    timeout 75 python3 tools/dev/gpu_probe.py --batches 1,64 --variants triton --new-tokens 32 --timeline $flags \
      --out "$OUT/norm-linear-${flags// /_}.json" 2>&1 | grep -E '"tpot_p50_ms"|rror' | cut -c1-160
  done
  exit 0
fi
for mode in batch-invariant no-batch-invariant; do
  echo "== bench_direct --$mode"
  timeout 150 python3 tools/bench_direct.py --preset lite --batches 1,256 --prompt-len 86 --new-tokens 64 --$mode \
    --out "$OUT/direct-$mode.json" 2>&1 | grep -E "TPOT|rror" | tail -4
done
SKIP_GATE=1 SERVE_FLAGS="--max-active 256 --max-model-len 4096" SERVING_ORDER="batch-invariant no-batch-invariant" \
  bash tools/dev/h200_invariance.sh serving 2>&1 | grep -v "^NVIDIA"
