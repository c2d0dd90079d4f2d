# Sourced by the tools/dev/h200_*.sh scripts: the GPU machine's set-up (the wheels carried in .whl/,
# the checkout as the `pegainfer` package, $OUT) and `serve NAME FLAGS...`, which starts
# `pegainfer serve --random-preset lite --device cuda --port 8000 FLAGS...` in the background (log in
# $OUT/serve-NAME.log, pid in $pid) and waits for /ready (READY_TRIES half-seconds, default 720).
# the project's run-time dependencies that the image lacks: ../shared/device/wheels.sh httptools python-json-logger
for w in starlette uvicorn httptools orjson python_json_logger opentelemetry_sdk; do  # what the image lacks
  ls .whl/$w-*.whl >/dev/null 2>&1 || echo "h200_env: no $w wheel in .whl/ (run ../shared/device/wheels.sh httptools python-json-logger): pegainfer's CLI will not import" >&2
done
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
  && export PYTHONPATH=$(bash tools/dev/devpath.sh /tmp/pegainfer-dev):$PWD:/tmp/site || exit 1
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader

serve() {
  local name=$1; shift
  python3 -m pegainfer.daemon.cli serve --random-preset lite --device cuda --port 8000 "$@" \
    > "$OUT/serve-$name.log" 2>&1 &
  pid=$!
  for _ in $(seq ${READY_TRIES:-720}); do
    curl -sf http://127.0.0.1:8000/ready >/dev/null && break
    kill -0 $pid 2>/dev/null || { echo "serve $name: the daemon exited; its log's tail:"; tail -3 "$OUT/serve-$name.log"; break; }
    sleep 0.5
  done
}

agreement_trained() {  # agreement_trained SECONDS: issue 30's bf16 agreement on the trained default model
  # (ours and HF bf16 against HF float32, 64 held-out Python prompts x 64 greedy tokens), whole output kept
  timeout "$1" python3 tools/agreement.py --model engine/data/tiny-stdlib-trained --device cuda --dtype bfloat16 \
    --cases tests/data/cases_python.json --max-tokens 64 --out "$OUT/agreement-trained.json" > "$OUT/agreement-trained.txt" 2>&1
  tail -20 "$OUT/agreement-trained.txt"
}
