#!/usr/bin/env bash
# One device call (carrying .whl/), about 9 minutes: where issue 26's batch-1 cost sits, then issue
# 28 part 2's split attention on the GPU with the tuned defaults.
#   1. the decode graph's kernel timeline at batch 1, batch-invariant and not (gpu_probe --timeline);
#   2. the split attention's GPU tests (tests/engine/kernels/test_mla_decode.py -k gpu);
#   3. decode TPOT at batch 1 by context, the defaults and --decode-merge-group 8 (h200_splitkv.sh).
# Usage: bash tools/dev/h200_call1.sh   (section limits: TIMELINE_S, TEST_S, PROBE_S)
set -uo pipefail
source tools/dev/h200_env.sh
for bi in 1 0; do
  echo "== 1. gpu_probe --timeline --batch-invariant $bi (batch 1)"
  timeout ${TIMELINE_S:-110} python3 tools/dev/gpu_probe.py --batches 1 --variants triton --timeline \
    --batch-invariant $bi --new-tokens 32 --out "$OUT/timeline-bi$bi.json" > "$OUT/timeline-bi$bi.txt" 2>&1
  grep -E '"tpot_p50_ms"|timeline_batch' "$OUT/timeline-bi$bi.txt" | cut -c1-300
done
echo "== 2. split attention GPU tests"
timeout ${TEST_S:-150} python3 -m pytest -q -p no:cacheprovider tests/engine/kernels/test_mla_decode.py -k gpu -rf \
  --tb=short 2>&1 | grep -v "^  " | tail -15 | tee "$OUT/mla-gpu-tests.txt"
echo "== 3. TPOT by context"
SKIP_TESTS=1 SIDES="base group" PROBE_S=${PROBE_S:-85} bash tools/dev/h200_splitkv.sh 2>&1 | grep -v "^NVIDIA"
