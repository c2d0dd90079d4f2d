#!/usr/bin/env bash
# Issue 28 part 2 (split-KV decode in the batch-invariant plan, engine/kernels/mla_fixed.py) on the
# GPU, one device call (carrying .whl/), about 6 minutes:
#   1. the GPU tests of the split attention (tests/engine/kernels/test_mla_decode.py -k gpu: a row's
#      bits alone and in batches up to 256, long rows to 33k keys, against float64, graph replays);
#   2. decode TPOT of the lite preset at batch 1 (and BATCHES) over CONTEXTS, an A/B in one call:
#      the rule with long splits (the default, decode_long_split 256) against --decode-long-split 0
#      (at most 8 splits a row, the rule before), each its own process (tools/dev/gpu_probe.py).
# Usage: [CONTEXTS=1024,4096,16384,32768] [BATCHES=1] bash tools/dev/h200_splitkv.sh
set -uo pipefail
source tools/dev/h200_env.sh
CONTEXTS=${CONTEXTS:-1024,4096,16384,32768}
if [ "${SKIP_TESTS:-0}" != 1 ]; then
  echo "== GPU tests of the split attention"
  timeout ${TEST_S:-200} python3 -m pytest -q -p no:cacheprovider tests/engine/kernels/test_mla_decode.py -k gpu -rf 2>&1 \
    | tail -12 | tee "$OUT/mla-gpu-tests.txt"
fi
for long in ${LONGS:-256 0}; do
  echo "== decode TPOT by context, --decode-long-split $long"
  timeout ${PROBE_S:-150} python3 tools/dev/gpu_probe.py --variants triton --batches ${BATCHES:-1} --contexts "$CONTEXTS" \
    --new-tokens 48 --decode-long-split "$long" --out "$OUT/splitkv-long$long.json" 2>&1 \
    | grep -E '"batch"|rror' | grep -v ceilings | cut -c1-300
done
