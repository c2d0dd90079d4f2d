#!/usr/bin/env bash
# The second GPU call of 2026-12-06 (the `device` tool's `run`, carrying .whl/ and .ab/), ~8 minutes:
#   1. decode TPOT by context at batch 1 (tools/dev/gpu_probe.py --contexts), an A/B in one call: the
#      split attention's launch shape before the tune (--decode-split-len 32 --decode-block-n 32
#      --decode-split-warps 8 --decode-split-stages 3 --decode-merge-unroll 1) against the defaults
#      since (64-key splits and steps, 4 warps, 2 stages, the merge unrolled by 2), each its own process (on 2026-12-06 it ran 64/64/4 with 3 stages
#      as the candidate, before those became the defaults);
#   2. tools/dev/mla_tune.py round 2 (those shapes combined, at 1-256 rows);
#   3. the split sampler's per-row plan, same-call A/B at 256 rows (tools/dev/sample_bench.py,
#      top-p and the mix on flat logits): .ab/before (90bf320, each program re-folds) vs this checkout.
# Usage: bash tools/dev/h200_tune2.sh   (section limits: PROBE_S, TUNE_S, BENCH_S)
set -uo pipefail
source tools/dev/h200_env.sh
HERE=$PWD
CONTEXTS=${CONTEXTS:-1024,4096,16384,32768}
for side in before default; do
  flags=$([ $side = before ] && echo "--decode-split-len 32 --decode-block-n 32 --decode-split-warps 8 --decode-split-stages 3 --decode-merge-unroll 1")
  echo "== 1. decode TPOT by context, $side $flags"
  timeout ${PROBE_S:-80} python3 tools/dev/gpu_probe.py --variants triton --batches 1 --contexts "$CONTEXTS" \
    --new-tokens 48 $flags --out "$OUT/tpot-$side.json" 2>&1 | grep -E '"batch"|rror' | grep -v ceilings | cut -c1-300
done
echo "== 2. mla_tune round 2"
timeout ${TUNE_S:-110} python3 tools/dev/mla_tune.py --variants base,r1,bwg,g8r,g4r \
  --out "$OUT/mla-tune2.json" 2>&1 | tail -60 | cut -c1-200
echo "== 3. split sampler A/B at 256 rows: before (re-fold in every program) vs after (one plan a row)"
for name in before after; do
  tree=$([ $name = before ] && echo "$HERE/.ab/before" || echo "$HERE")
  dev=$(bash "$tree/tools/dev/devpath.sh" "/tmp/pg-$name")
  (cd "$tree" && PYTHONPATH=$dev:$tree:/tmp/site timeout ${BENCH_S:-100} python3 tools/dev/sample_bench.py \
     --device cuda --chunks 64 --rows 256 --mixes top_p,mix --logits flat --out "$OUT/fold-$name.json" 2>&1 \
     | grep '^{' | cut -c1-400 | sed "s/^/$name /" | tail -4)
done
