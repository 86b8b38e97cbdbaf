#!/usr/bin/env bash
# Set up (virtual environment, Python packages, Chromium for the browser test, Redis for the
# rate-limit test, nginx for the proxy test) and run the tests.
set -euo pipefail
cd "$(dirname "$0")/.."
if ! command -v chromium >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ]; then
    apt-get -o DPkg::Lock::Timeout=600 update -qq && apt-get -o DPkg::Lock::Timeout=600 install -y -qq chromium >/dev/null
  else
    sudo apt-get update -qq && sudo apt-get install -y -qq chromium >/dev/null
  fi
fi
# tests/serve/http/test_security.py starts a real Redis (the shared rate-limit store) on a loopback port.
if ! command -v redis-server >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ]; then
    apt-get -o DPkg::Lock::Timeout=600 update -qq && apt-get -o DPkg::Lock::Timeout=600 install -y -qq redis-server >/dev/null
  else
    sudo apt-get update -qq && sudo apt-get install -y -qq redis-server >/dev/null
  fi
fi
# tests/deploy/test_proxy.py runs Debian's nginx, as the image's proxy mode does, in front of a live server.
if ! command -v nginx >/dev/null 2>&1 && [ ! -x /usr/sbin/nginx ]; then
  if [ "$(id -u)" = 0 ]; then
    apt-get -o DPkg::Lock::Timeout=600 update -qq && apt-get -o DPkg::Lock::Timeout=600 install -y -qq --no-install-recommends nginx >/dev/null
  else
    sudo apt-get update -qq && sudo apt-get install -y -qq --no-install-recommends nginx >/dev/null
  fi
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
