#!/usr/bin/env bash
# Issue 33, the split sampler at large batches (one device call, carrying .whl/): a launch's programs
# capped by KernelConfig.sample.programs (SampleTiling.chunks_for: 256 rows split over 8 programs a
# row, not 50), the same bits by construction.
#   1. tools/dev/sample_bench.py: the kernel's device time at 256 rows of the mix (flat logits:
#      random weights' shape) for chunks 64 / 8 / 2, with bits_equal against the first;
#   2. bench_direct A/B in one call: greedy, top-p and the mix at batch 1 and 256, --sample-programs 0
#      (every batch at 64 chunks, the default) against --sample-programs 2048 (the candidate).
# Usage: bash tools/dev/h200_sample_programs.sh   (everything under $OUT; KERNEL_S=0 skips 1)
set -uo pipefail
source tools/dev/h200_env.sh
[ "${KERNEL_S:-120}" = 0 ] || { echo "== sample_bench: chunks 64 / 8 / 2 at 256 rows"
timeout ${KERNEL_S:-120} python3 tools/dev/sample_bench.py --device cuda --rows 256 --mixes ${MIXES:-mix,top_p} \
  --logits flat --chunks ${CHUNKS:-64,8,2} --out "$OUT/sample-programs.json" 2>&1 | grep '^{' \
  | python3 -c "import json,sys
for l in sys.stdin:
    r = json.loads(l); print(r['mix'], r['rows'], {k: v for k, v in r.items() if k.startswith(('kernel_us', 'bits_equal', 'sweeps_mean'))})"
}
for side in before after; do
  extra="--sample-programs 2048"; [ $side = before ] && extra="--sample-programs 0"
  echo "== bench_direct $side ($extra)"
  timeout ${DIRECT_S:-150} python3 tools/bench_direct.py --preset lite --batches 1,256 --prompt-len 86 --new-tokens 32 \
    --warmup 1 --iters 3 --sampling greedy,top-p,mix $extra --out "$OUT/direct-$side.json" 2>&1 | grep -E "TPOT|rror" | tail -8
done
