#!/usr/bin/env bash
# One device call (carrying .whl/), about 8 minutes: the routed experts' wide tiling for prompt-sized
# steps (ExpertTilings.many_rows, above many_rows_min_routes routes), issue 28 part 1.
#   1. the packed prefill at 4,620 and 16,384 tokens, the defaults against --expert-many-routes 0
#      (the 32-row tiling at every size, as before), one process each (gpu_probe --prefill-profile:
#      eager device time, the top kernels, the graphed runner step);
#   2. the expert kernels' GPU tests (a route's bits alone and in crowds to 1,024 tokens, every tiling
#      and the wide candidates the same bits);
#   3. kernel_bench --sweep many at 1,024 and 512 tokens (grouped GEMMs' time beside it; fused_route
#      lists the routes of at most 1,024 tokens).
# Usage: bash tools/dev/h200_experts.sh   (section limits: PREFILL_S, TEST_S, SWEEP_S)
set -uo pipefail
source tools/dev/h200_env.sh
for name in many off; do
  flags=""; [ $name = off ] && flags="--expert-many-routes 0"
  echo "== 1. prefill profile, $name ${flags:-(the defaults)}"
  # shellcheck disable=SC2086
  timeout ${PREFILL_S:-110} python3 tools/dev/gpu_probe.py --prefill-profile 1x4620,1x16384 $flags \
    > "$OUT/prefill-$name.txt" 2>&1
  grep -E "prefill_rows|_gate_up_kernel|_down_kernel|_linear_kernel|_prompt_kernel|rror" \
    "$OUT/prefill-$name.txt" | cut -c1-140 | sed 's/  */ /g'
done
echo "== 2. expert kernels' GPU tests"
timeout ${TEST_S:-150} python3 -m pytest -q -p no:cacheprovider tests/engine/kernels/test_moe_experts.py -k gpu -rf \
  --tb=short 2>&1 | grep -v "^  " | tail -12 | tee "$OUT/experts-gpu-tests.txt"
echo "== 3. kernel_bench --sweep many"
timeout ${SWEEP_S:-150} python3 tools/dev/kernel_bench.py --batches 1024,512 --sweep many \
  --out "$OUT/experts-many.json" 2>&1 | cut -c1-1500
