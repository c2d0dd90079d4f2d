#!/usr/bin/env bash
# One device call (carrying .whl/), 2-10 minutes (145 s on an H100, compiles cached by the calls
# before): issue 26's batch-1 cost in the invariant
# linear, and where a long prompt's prefill time goes (issue 28 part 1).
#   1. linear_bench --rows 1 --sweep one: the one-row candidates of the invariant linear, each shape;
#   2. decode TPOT at batch 1 (gpu_probe), one process each: the defaults with the kernel sequence of
#      one replay (--timeline), LinearTiling candidates, and --batch-invariant 0;
#   3. the packed prefill's top kernels at 4,620 and 16,384 tokens (gpu_probe --prefill-profile).
# Usage: bash tools/dev/h200_onerow.sh   (CANDIDATES: ';'-separated gpu_probe flag sets; section
# limits SWEEP_S, PROBE_S a probe, PREFILL_S: with five candidates they may add up past 600 s)
set -uo pipefail
source tools/dev/h200_env.sh
echo "== 1. linear_bench one row"
timeout ${SWEEP_S:-140} python3 tools/dev/linear_bench.py --rows 1 --sweep one \
  --shapes q_kv_a,o_proj,shared_gate_up,shared_down_2,dense_gate_up,dense_down,lm_head \
  --out "$OUT/linear-one.json" 2>&1 | tail -120 | cut -c1-120
echo "== 2. TPOT batch 1"
timeout ${PROBE_S:-70} python3 tools/dev/gpu_probe.py --batches 1 --variants triton --timeline --new-tokens 32 \
  --out "$OUT/onerow-base.json" 2>&1 | grep -E '"tpot_p50_ms"|rror' | cut -c1-200
DEFAULT_SETS="--linear-n-min 16 --linear-programs 128 --linear-stages 6;--linear-programs 528;--linear-stages 4"
DEFAULT_SETS+=";--linear-k-chunk 512;--batch-invariant 0"
IFS=';' read -ra sets <<< "${CANDIDATES:-$DEFAULT_SETS}"
i=0
for flags in "${sets[@]}"; do
  i=$((i + 1)); echo "-- $flags"
  # shellcheck disable=SC2086
  timeout ${PROBE_S:-70} python3 tools/dev/gpu_probe.py --batches 1 --variants triton --new-tokens 32 \
    $flags --out "$OUT/onerow-$i.json" 2>&1 | grep -E '"tpot_p50_ms"|rror' | cut -c1-200
done
echo "== 3. prefill profile"
timeout ${PREFILL_S:-100} python3 tools/dev/gpu_probe.py --prefill-profile 1x4620,1x16384 \
  > "$OUT/prefill-profile.txt" 2>&1
grep -E "prefill_rows|Name|^---|^ *[_a-z]" "$OUT/prefill-profile.txt" | head -70 | cut -c1-160
