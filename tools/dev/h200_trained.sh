#!/usr/bin/env bash
# Issue 30 on the H200: the trained default model (engine/data/tiny-stdlib-trained), one device call per
# part (the `device` tool's `run`, carrying .whl/; each under 10 minutes):
#   agreement  tools/agreement.py on the shipped checkpoint: HF float32 (reference), HF bf16, and ours in
#              bf16 on the served path (CUDA graphs, Triton kernels), 64 held-out Python prompts x 64
#              greedy tokens (tests/data/cases_python.json); then the HF exactness gate in float32 on
#              the GPU (tools/hf_oracle.py, the committed case set). ~3-5 minutes (not measured).
#   train      tools/train_tiny.py --device cuda: the same model and corpus at batch 32 for 4,000 steps,
#              capped at 6.5 minutes of training (~1 minute of BPE and tokenising before it), into
#              $OUT/trained-gpu; then its greedy continuation of "def " prompts (pegainfer generate).
# Usage: bash tools/dev/h200_trained.sh [agreement|train]   (default agreement)
# The targets, read from $OUT/agreement-trained.json: ours_vs_reference prefix share >= the
# hf_vs_reference one, the same for the teacher-forced share, and ours' forced share >= 0.99.
set -uo pipefail
source tools/dev/h200_env.sh
what=${1:-agreement}
MODEL=engine/data/tiny-stdlib-trained
if [ "$what" = agreement ]; then
  echo "== tools/agreement.py, trained checkpoint, bf16 vs float32, 64 prompts x 64 tokens"
  agreement_trained ${AGREE_S:-360}
  echo "== tools/hf_oracle.py, trained checkpoint, float32 on cuda (committed case set)"
  timeout ${GATE_S:-180} python3 tools/hf_oracle.py --model $MODEL --device cuda --dtype float32 \
    --out "$OUT/gate-trained-cuda.json" 2>&1 | tail -3
fi
if [ "$what" = train ]; then
  echo "== tools/train_tiny.py on the GPU (batch 32, 4000 steps, <= 6.5 minutes of training)"
  timeout ${TRAIN_S:-540} python3 tools/train_tiny.py --device cuda --out "$OUT/trained-gpu" --batch 32 \
    --steps 4000 --minutes 6.5 --log-every 50 2>&1 | tail -6
  for p in "def " "import os" "class Parser:"; do
    python3 -m pegainfer.daemon.cli generate --model "$OUT/trained-gpu" --prompt "$p" --max-tokens 48 --json \
      2> "$OUT/generate.err" | python3 -c "import json,sys; print(repr(json.load(sys.stdin)['text']))" \
      || tail -2 "$OUT/generate.err"
  done
fi
