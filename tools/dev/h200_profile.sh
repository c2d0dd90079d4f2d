#!/usr/bin/env bash
# Kernel timelines of the captured decode graph (tools/dev/gpu_probe.py --timeline: each kernel's
# device time and the idle gaps, CUPTI through torch.profiler), batch invariant and not, at the batch
# sizes where issue 26's cost and issue 27's peak are decided. One device call (carrying .whl/);
# everything goes to $OUT (timeline-inv1.txt, timeline-inv0.txt). BATCHES and PROBE_S are settings.
# Usage: [INVARIANT="1 0"] [BATCHES=1,256,1024] [LINEAR=1] bash tools/dev/h200_profile.sh
set -uo pipefail
source tools/dev/h200_env.sh
for inv in ${INVARIANT-1 0}; do  # INVARIANT="" skips the timelines
  nvidia-smi --query-gpu=memory.used --format=csv,noheader
  echo "== decode graph timelines, --batch-invariant $inv, batches ${BATCHES:-1,256,1024}"
  timeout ${PROBE_S:-150} python3 tools/dev/gpu_probe.py --batches ${BATCHES:-1,256,1024} --variants triton \
    --new-tokens 8 --timeline --batch-invariant "$inv" --out "$OUT/probe-inv$inv.json" > "$OUT/timeline-inv$inv.txt" 2>&1
  echo "rc=$?"; python3 - "$OUT/timeline-inv$inv.txt" <<'PY'
import json, sys
for line in open(sys.argv[1]):
    if not line.startswith("{"):
        continue
    d = json.loads(line)
    if "timeline_batch" in d and "top" in d:
        print(f"batch {d['timeline_batch']}: span {d['span_us']} us, busy {d['busy_us']}, idle {d['idle_us']}, kernels {d['kernels']}")
        for k in d["top"][:14]:
            print(f"   {k['us']:9.1f} us  n={k['n']:4d}  gap {k['gap_before_us']:7.1f}  {k['name']}")
    elif "tpot_p50_ms" in d:
        print({k: v for k, v in d.items() if k in ("batch", "variant", "tpot_p50_ms")})
PY
done
if [ "${LINEAR:-0}" = 1 ]; then
  echo "== the invariant linear at many rows, bit-neutral tilings (tools/dev/linear_bench.py --sweep wide)"
  timeout ${LINEAR_S:-120} python3 tools/dev/linear_bench.py --rows ${LINEAR_ROWS:-256,1024} --sweep wide \
    --shapes ${LINEAR_SHAPES:-o_proj,q_kv_a,shared_gate_up,shared_down_2,lm_head} --out "$OUT/linear-wide.json" 2>&1 | tail -80
fi
