#!/usr/bin/env bash
# GPU calls, each carrying .whl/ (the `device` tool's run). Ran on 2026-12-06d's H100
# (docs/benchmarks/2026-12-06d-device.md): tax, norm-linear-tests, start, tax2, tax3 and the
# norm-linear probe. Next, in this order (about 30 minutes of device time; every open issue's targets
# are H200 figures, so on an H200 first of all):
#   1. bash tools/dev/h200_next.sh tax3    issue 29: c=64 and c=256 in one call at the defaults (HTTP with the
#                                          httpx and the raw client, replay, busy share, idle gaps, send-to-
#                                          receipt lag; ~5.5 min); then the 10 x 1,024
#                                          burst (h200_tax.sh without SKIP_BURST)
#   2. bash tools/dev/h200_sampling.sh serving   issue 33's profiles at c=1/64/256 (~4.5 min): the c=256
#                                          mix with the step-prompt bound on
#   3. bash tools/dev/h200_long.sh         issue 28's TTFT / TPOT / cold-start / mixed-load targets (never run)
#   4. bash tools/dev/h200_next.sh invariance   issue 26's cost: bench_direct 1 / 256 and serving c=256,
#                                          invariant against --no-batch-invariant
# The modes:
#   tax        issue 29 at c=256, two sides: the daemon without the step-prompt bound (now
#              --max-step-prompts 0) against --max-step-prompts 64 --async-admission
#   tax2       issue 29 at c=64 and c=256 in one call: the defaults against --async-admission
#   tax3       issue 29's two levels at the defaults, one side (windows: first send to last completion)
#   start      issue 29: the c=256 HTTP level's first steps and first wave; issue 26's cost at 256 rows
#              (on 2026-12-06d it also ran the merge's launch-shape GPU test, since removed with its knobs)
#   invariance issue 26's cost with the experts' wide tiling (h200_invariance.sh's parts)
#   norm-linear-tests  the GPU tests of the opt-in one-row invariant launches (norm_linear_rows) and of
#              the split attention
#   norm-linear  decode TPOT at batch 1 and 64 with them, without them, and without invariance
# Results go to $OUT; the modes that write many files pack them into one archive (8 files come back).
set -uo pipefail
what=${1:-tax3}
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"  # the device tool sets it
pack() {  # the device tool brings back 8 files at most: everything in $OUT as one archive
  (cd "$OUT" && tar czf "results-$1.tgz" --exclude='*.tgz' . && find . -type f ! -name '*.tgz' -delete)
}
if [ "$what" = tax ]; then
  common="--max-active 256 --max-model-len 4096"
  LEVELS=256 NUM=512 SKIP_DETOK=1 SKIP_BURST=1 EXTRA="$common --max-step-prompts 0" TAG=base bash tools/dev/h200_tax.sh
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
wave = [r for r in run["requests"] if r.get("sent_ms") is not None and r.get("ttft_ms") is not None]
wave = sorted((r["sent_ms"], r["sent_ms"] + r["ttft_ms"]) for r in wave)[:256]
if wave:
    firsts = sorted(t for _, t in wave)
    print("first wave (%d): sent over %.1f ms; first tokens at p0 %.1f p10 %.1f p50 %.1f p100 %.1f ms" % (
        len(wave), wave[-1][0], *[firsts[int(q * (len(firsts) - 1))] for q in (0, .1, .5, 1)]))
print("window_ns", *run["window_ns"])
PY
  read -r since until < <(python3 -c 'import json,sys; print(*json.load(open(sys.argv[1]))["levels"][0]["runs"][0]["window_ns"])' "$OUT/start-http.json")
  python3 -m tools.benchkit.steps /tmp/trace-s.jsonl --since-ns "$since" --until-ns "$until" --gaps 6 --first 24
  for inv in 1 0; do
    echo "== gpu_probe batch 256 --batch-invariant $inv"
    timeout 100 python3 tools/dev/gpu_probe.py --batches 256 --variants triton --new-tokens 16 --batch-invariant $inv \
      --out "$OUT/probe256-inv$inv.json" 2>&1 | grep -E '"tpot_p50_ms"|rror' | cut -c1-120
  done
  pack start
  exit 0
fi
if [ "$what" = tax3 ]; then  # issue 29's two levels in one call at the defaults, windows first send to last
  # completion (2026-12-06d), each window's idle and first steps
  LEVELS=64,256 NUM=512 SKIP_DETOK=1 SKIP_BURST=1 SLOWEST=3 FIRST=10 RAW=1 \
    EXTRA="--max-active 256 --max-model-len 4096" TAG=base bash tools/dev/h200_tax.sh
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
