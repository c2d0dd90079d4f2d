#!/usr/bin/env bash
# One device call on the H200 (the `device` tool's `run`, carrying .whl/): the GPU tests, then the
# reliability gate with spawned daemons on CUDA (tiny model, bf16): every scenario on `local`, and the
# rank and fault-isolation scenarios on host-staged ep 2 (two ranks sharing the one GPU). Artifacts
# and daemon logs go to $OUT. Usage: bash tools/dev/h200_gate.sh
set -uo pipefail
source tools/dev/h200_env.sh; git log -1 --format=%H 2>/dev/null
echo "== GPU tests"
timeout 300 python3 -m pytest -q tests/engine/kernels tests/engine/test_gpu_*.py tests/ep/test_gpu.py -p no:cacheprovider 2>&1 \
  | tail -15 | tee "$OUT/gpu-tests.txt"
echo "== reliability, local, cuda"
# --allow-skips: at ep 1 the three rank scenarios are skipped; the host-staged ep 2 call below runs them
timeout 240 python3 tools/reliability.py --spawn --device cuda --work-dir /tmp/rl --allow-skips \
  --out "$OUT/reliability-local-cuda.json" 2>&1 | tail -30
echo "== reliability, host-staged ep 2, cuda"
timeout 200 python3 tools/reliability.py --spawn --device cuda --backend host-staged --ep-size 2 --work-dir /tmp/rh \
  --scenarios poisoned_neighbour,loop_stall_huge_prompts,double_sigterm,idle_rank_death,idle_rank_stall,expert_rank_failure \
  --out "$OUT/reliability-hs2-cuda.json" 2>&1 | tail -20
echo "== tracebacks in daemon logs:"; grep -l Traceback /tmp/rl/*.log /tmp/rh/*.log || echo none
tar czf "$OUT/daemon-logs.tgz" /tmp/rl/*.log /tmp/rh/*.log 2>/dev/null
