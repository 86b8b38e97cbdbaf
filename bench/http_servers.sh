#!/usr/bin/env bash
# The same app under gunicorn (python -m serve, its defaults: gthread, 2 workers x 16 threads) and under
# granian's WSGI interface (2 workers x 16 blocking threads), back to back, wrk on TF Serving's REST predict:
# 1 image at c=32 and c=1, 64 images at c=2 (docs/benchmarks.md, "The HTTP server").
#
#   .venv/bin/python -m uv pip install --python .venv/bin/python granian==2.8.9   # not in the lock
#   MODEL_BASE_PATH=bench/peers/.cache/models DUR=10 bench/http_servers.sh
set -euo pipefail
cd "$(dirname "$0")/.."
export MODEL_BASE_PATH=${MODEL_BASE_PATH:-bench/peers/.cache/models} MODEL_NAME=${MODEL_NAME:-cifar10}
export GRPC_PORT=0 MALLOC_ARENA_MAX=2 TF_CPP_MIN_LOG_LEVEL=2 MODEL_BASE_PATH=$(realpath "$MODEL_BASE_PATH")
out=$(mktemp -d)
.venv/bin/python - "$out" <<'PY'
import json, sys
import numpy as np
for n in (1, 64):
    pixels = np.random.default_rng(n).integers(0, 256, (n, 32, 32, 3)).tolist()
    open(f"{sys.argv[1]}/{n}.json", "w").write(json.dumps({"instances": pixels}))
PY
measure() {  # NAME
  for _ in $(seq 120); do curl -sf localhost:8000/readyz >/dev/null && break; sleep 1; done
  for cell in "1 32" "1 1" "64 2"; do set -- $cell
    WRK_BODY=$out/$1.json WRK_CONTENT_TYPE=application/json wrk -t1 -c"$2" -d"${DUR:-10}"s --latency -s bench/wrk/post_body.lua \
      http://127.0.0.1:8000/v1/models/$MODEL_NAME:predict > "$out/run.txt"
    echo "$NAME, $1 image(s), c=$2: $(grep Requests/sec "$out/run.txt" | awk '{print $2}') requests/s," \
      "p50 $(grep ' 50%' "$out/run.txt" | awk '{print $2}'), p99 $(grep ' 99%' "$out/run.txt" | awk '{print $2}')" \
      "$(grep -E 'Non-2xx|Socket errors' "$out/run.txt" | tr '\n' ' ')"
  done
}
NAME=gunicorn; .venv/bin/python -m serve --port 8000 >"$out/gunicorn.log" 2>&1 & pid=$!; measure; kill $pid; wait $pid || true
NAME=granian; .venv/bin/granian --interface wsgi --workers 2 --blocking-threads 16 --port 8000 --factory serve:create_app \
  >"$out/granian.log" 2>&1 & pid=$!; measure; kill $pid; wait $pid || true
echo "lscpu: $(lscpu | grep 'Model name' | sed 's/Model name: *//'); load $(cut -d' ' -f1-3 /proc/loadavg)"
