#!/usr/bin/env bash
# The next GPU call (after 2026-12-06's H100 calls: docs/benchmarks/2026-12-06b-device.md), on the
# H200 (the `device` tool's `run`, carrying .whl/), about 9 minutes:
#   1. the split attention's GPU tests with the tuned defaults and the per-row grouped merge
#      (tests/engine/kernels/test_mla_decode.py -k gpu);
#   2. decode TPOT at batch 1 by context, one process a side (tools/dev/h200_splitkv.sh, no tests):
#      the defaults, --decode-merge-group 8, and the launch shape before the tune;
#   3. mla_tune: the defaults, round 1's rule, the per-row groups of 8 and 4.
# Then, as its own call, issue 33's targets on the H200: `bash tools/dev/h200_sampling.sh serving`.
# Usage: bash tools/dev/h200_next.sh   (section limits: TEST_S, PROBE_S, TUNE_S)
set -uo pipefail
source tools/dev/h200_env.sh
echo "== 1. split attention GPU tests"
timeout ${TEST_S:-200} python3 -m pytest -q -p no:cacheprovider tests/engine/kernels/test_mla_decode.py -k gpu -rf \
  --tb=short 2>&1 | grep -v "^  " | tail -15 | tee "$OUT/mla-gpu-tests.txt"
echo "== 2. TPOT by context"
SKIP_TESTS=1 SIDES="base group before" PROBE_S=${PROBE_S:-80} bash tools/dev/h200_splitkv.sh 2>&1 | grep -v "^NVIDIA"
echo "== 3. mla_tune"
timeout ${TUNE_S:-80} python3 tools/dev/mla_tune.py --variants base,r1,g8r,g4r --out "$OUT/mla-tune.json" 2>&1 \
  | tail -24 | cut -c1-200
