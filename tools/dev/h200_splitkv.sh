#!/usr/bin/env bash
# Issue 28 part 2 (split-KV decode in the batch-invariant plan, engine/kernels/mla_fixed.py) on the
# GPU, one device call (carrying .whl/), about 6 minutes:
#   1. the GPU tests of the split attention (tests/engine/kernels/test_mla_decode.py -k gpu: a row's
#      bits alone and in batches up to 256, long rows to 33k keys, against float64, graph replays);
#   2. decode TPOT of the lite preset at batch 1 (and BATCHES) over CONTEXTS, an A/B in one call, each
#      side its own process (tools/dev/gpu_probe.py): the defaults (long splits, 64-key splits and
#      steps, 4 warps, 2 stages), a first merge level over groups of 8 of a long row's splits
#      (--decode-merge-group 8, opt-in), and at most 8 splits a row (--decode-long-split 0, the rule
#      before split-KV); with SIDES also "before": the launch shape before 2026-12-06's tune (32-key
#      splits and steps, 8 warps, 3 stages, no merge unroll).
# Usage: [CONTEXTS=1024,4096,16384,32768] [BATCHES=1] [SIDES="base group cap before"] bash tools/dev/h200_splitkv.sh
set -uo pipefail
source tools/dev/h200_env.sh
CONTEXTS=${CONTEXTS:-1024,4096,16384,32768}
if [ "${SKIP_TESTS:-0}" != 1 ]; then
  echo "== GPU tests of the split attention"
  timeout ${TEST_S:-200} python3 -m pytest -q -p no:cacheprovider tests/engine/kernels/test_mla_decode.py -k gpu -rf 2>&1 \
    | tail -12 | tee "$OUT/mla-gpu-tests.txt"
fi
for side in ${SIDES:-base group cap}; do
  case $side in base) flags="";; group) flags="--decode-merge-group 8";; cap) flags="--decode-long-split 0";;
    before) flags="--decode-split-len 32 --decode-block-n 32 --decode-split-warps 8 --decode-split-stages 3 --decode-merge-unroll 1";;
  esac
  echo "== decode TPOT by context, $side $flags"
  timeout ${PROBE_S:-150} python3 tools/dev/gpu_probe.py --variants triton --batches ${BATCHES:-1} --contexts "$CONTEXTS" \
    --new-tokens 48 $flags --out "$OUT/splitkv-$side.json" 2>&1 \
    | grep -E '"batch"|rror' | grep -v ceilings | cut -c1-300
done
