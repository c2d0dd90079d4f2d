#!/usr/bin/env bash
# The open GPU checks of 2026-12-06 in one device call (the `device` tool's `run`, carrying .whl/),
# about 8 minutes, most valuable first, each section under its own time limit:
#   1. the sampler's GPU tests after the uniform fix (tests/engine/kernels/test_sample.py) and the
#      split sampler's, never run on a GPU (test_sample_split.py), plus the precompile test;
#   2. tools/dev/mla_tune.py: the split attention's launch shapes and rules at lite's shapes;
#   3. bash tools/dev/h200_splitkv.sh: its GPU tests and TPOT by context, long splits vs the 8-split cap.
# Usage: bash tools/dev/h200_next.sh   (section limits: SAMPLE_S, TUNE_S, SPLITKV_S)
set -uo pipefail
source tools/dev/h200_env.sh
echo "== 1. sampler GPU tests"
timeout ${SAMPLE_S:-200} python3 -m pytest -q -p no:cacheprovider tests/engine/kernels/test_sample.py \
  tests/engine/kernels/test_sample_split.py tests/engine/kernels/test_precompile.py -k gpu -rf --tb=short 2>&1 \
  | grep -v "^  " | tail -25 | tee "$OUT/sampler-gpu-tests.txt"
echo "== 2. mla_tune"
timeout ${TUNE_S:-140} python3 tools/dev/mla_tune.py --out "$OUT/mla-tune.json" 2>&1 | tail -64 | cut -c1-200
echo "== 3. split-KV"
TEST_S=90 PROBE_S=60 timeout ${SPLITKV_S:-170} bash tools/dev/h200_splitkv.sh 2>&1 | tail -20
