#!/usr/bin/env bash
# Set up (virtual environment, Python packages, Chromium for the browser test, Redis for the
# rate-limit test, nginx for the proxy test) and run the tests.
set -euo pipefail
cd "$(dirname "$0")/.."
# Debian packages the tests run: Chromium (the browser tests), Redis (tests/serve/http/test_security.py's
# shared rate-limit store, on a loopback port), nginx (tests/deploy/test_proxy.py, as the image's proxy mode).
missing=()
command -v chromium >/dev/null 2>&1 || missing+=(chromium)
command -v redis-server >/dev/null 2>&1 || missing+=(redis-server)
command -v nginx >/dev/null 2>&1 || [ -x /usr/sbin/nginx ] || missing+=(nginx)
if [ ${#missing[@]} -gt 0 ]; then
  sudo=$([ "$(id -u)" = 0 ] || echo sudo)
  # Another apt may hold its locks (.ci/run prepares the container tools beside the tests), and
  # DPkg::Lock::Timeout does not wait for the package lists' lock that apt-get update takes: try again.
  for attempt in $(seq 30); do
    $sudo apt-get -o DPkg::Lock::Timeout=600 update -qq \
      && $sudo env DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 install -y -qq "${missing[@]}" >/dev/null \
      && break
    [ "$attempt" -lt 30 ] || { echo "scripts/test.sh: could not install ${missing[*]} from Debian" >&2; exit 1; }
    echo "apt-get: attempt $attempt failed; trying again in 10 s" >&2
    sleep 10
  done
fi
python3 -m venv .venv
# The locked versions, each checked against its hash (requirements/test.txt: every extra but tpu and
# gpu; docs/training.md, "Installs and the lock"), then the project itself with nothing else resolved. uv installs
# them (itself locked, requirements/scripts/uv.txt): into a fresh .venv in about 1.5 minutes where
# pip took 5, with the platform's certificates as pip uses them. --compile-bytecode does what pip
# does by default: without the .pyc files every process that imports TensorFlow spends 10 s more.
.venv/bin/python -m pip install -q --require-hashes -r requirements/scripts/uv.txt
.venv/bin/python -m uv pip install -q --python .venv/bin/python --system-certs --compile-bytecode --require-hashes -r requirements/test.txt
.venv/bin/python -m uv pip install -q --python .venv/bin/python --system-certs --no-deps --no-build-isolation -e .
# One worker a core (pytest-xdist), each test file on one worker so its module fixtures are built once.
# Much of the suite leaves a core idle (interpreter and TensorFlow start-ups, subprocesses, servers):
# on the quiet 2-core AVX2 machine the 1,022 tests took 854 s with two workers against 1,044 s in one
# process. `./scripts/test.sh -n 0` runs them in one process; arguments given override these.
.venv/bin/python -m pytest -n auto --dist loadfile "$@"
