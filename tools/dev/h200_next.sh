#!/usr/bin/env bash
# The open GPU checks of 2026-12-06 in one device call (the `device` tool's `run`, carrying .whl/ and
# .ab/), about 9 minutes, most valuable first, each section under its own time limit:
#   1. the sampler's GPU tests after the uniform fix and the per-row plan launch
#      (tests/engine/kernels/test_sample.py, test_sample_split.py, test_precompile.py);
#   2. a same-call A/B of the split sampler's per-row plan (tools/dev/sample_bench.py --chunks 64 at
#      1 and 256 rows, top-p and the mix, flat and peaked logits): the tree in .ab/before (the commit
#      before it: `git archive 90bf320 | tar -x -C .ab/before`) against this checkout, then each
#      launch's device time at 256 rows after (--launches);
#   3. tools/dev/mla_tune.py: the split attention's launch shapes and rules at lite's shapes.
# Usage: bash tools/dev/h200_next.sh   (section limits: SAMPLE_S, BENCH_S, TUNE_S)
set -uo pipefail
source tools/dev/h200_env.sh
HERE=$PWD
echo "== 1. sampler GPU tests"
timeout ${SAMPLE_S:-200} python3 -m pytest -q -p no:cacheprovider tests/engine/kernels/test_sample.py \
  tests/engine/kernels/test_sample_split.py tests/engine/kernels/test_precompile.py -k gpu -rf --tb=short 2>&1 \
  | grep -v "^  " | tail -25 | tee "$OUT/sampler-gpu-tests.txt"
echo "== 2. split sampler A/B: before (re-fold in every program) vs after (one plan a row)"
for name in before after; do
  tree=$([ $name = before ] && echo "$HERE/.ab/before" || echo "$HERE")
  dev=$(bash "$tree/tools/dev/devpath.sh" "/tmp/pg-$name")
  (cd "$tree" && PYTHONPATH=$dev:$tree:/tmp/site timeout ${BENCH_S:-100} python3 tools/dev/sample_bench.py \
     --device cuda --chunks 64 --rows 1,256 --mixes top_p,mix --logits flat,peaked --out "$OUT/fold-$name.json" 2>&1 \
     | cut -c1-400 | sed "s/^/$name /" | tail -8)
done
timeout 60 python3 tools/dev/sample_bench.py --device cuda --launches --rows 256 --mixes top_p,mix --chunks 64 \
  --logits flat --out "$OUT/fold-launches.json" 2>&1 | cut -c1-600 | tail -6
echo "== 3. mla_tune"
timeout ${TUNE_S:-140} python3 tools/dev/mla_tune.py --out "$OUT/mla-tune.json" 2>&1 | tail -64 | cut -c1-200
