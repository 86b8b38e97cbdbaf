#!/usr/bin/env bash
# Build the serving image from this repository's Dockerfile and run it as a user would: with a real
# exported model mounted at /models, checked over HTTP against the in-process server, then stopped
# and removed. CI runs it (.ci/run); it needs root, no registry, and about 3 minutes on 2 cores.
#
#   ./scripts/container_check.sh            # after scripts/test.sh has made .venv
#   ./scripts/container_check.sh --prepare  # steps 1 and 2 only (.ci/run does them while the tests run)
#
# What it does:
#   1. installs Debian's podman, runc, buildah and debootstrap when they are missing;
#   2. makes the base image once and keeps it (podman image exists): Debian bookworm by debootstrap
#      (minbase) with Debian's python3 (3.11) and venv, imported as localhost/cifar-base:bookworm-python3.11
#      and passed to the Dockerfile as BASE_IMAGE. It is not Docker Hub's python:3.11-slim-bookworm
#      (there is no registry to pull that from here), so it does not take that name;
#   3. trains seed_cnn for a few epochs on synthetic images and exports it (about a minute);
#   4. builds the image (`podman build --pull=never`; pip downloads the locked wheels from PyPI inside
#      the build, with the host's CA bundle mounted read-only where HTTPS goes through a proxy: it is
#      never copied into the image);
#   5. runs it with runc (crun refuses this machine's cgroup layout) and explicit nofile and nproc
#      limits no higher than the host's, the model mounted read-only, the port on loopback only;
#   6. checks /healthz, /readyz, one /api/v1/predict whose class equals the in-process server's on
#      the same model and image, the image's own HEALTHCHECK, a clean log (no traceback, no
#      permission error such as gunicorn 25+'s control socket under the missing /home/app) and a
#      graceful stop (exit code 0);
#   7. runs the proxy mode once: a second container from the image runs nginx (its documented
#      command, a read-only root, /tmp a tmpfs) in the first's network namespace, as the Kubernetes
#      pod and compose.yaml do; the same checks through nginx on 8080, a body over the server's limit
#      refused by nginx with 413, a clean nginx log and a graceful quit;
#   8. removes the containers, the image it built and its temporary files on any exit (trap).
# Any failed check exits non-zero.
set -euo pipefail
cd "$(dirname "$0")/.."

PREPARE_ONLY=0
case "${1:-}" in
    --prepare) PREPARE_ONLY=1 ;;
    "") ;;
    *) echo "usage: $0 [--prepare]" >&2; exit 2 ;;
esac
PYTHON=${PYTHON:-.venv/bin/python}
BASE_IMAGE=localhost/cifar-base:bookworm-python3.11
IMAGE=localhost/cifar-serve:check-$$
NAME=cifar-serve-check-$$
PROXY=cifar-serve-proxy-check-$$
# The image's proxy mode, as compose.yaml and deploy/k8s/base/frontend.yaml run it.
PROXY_COMMAND=(nginx -p /tmp/ -c /etc/nginx/serve.conf -e stderr -g 'daemon off;')
DEBIAN_MIRROR=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
HOST_CA=/etc/ssl/certs/ca-certificates.crt
LOCK=${LOCK:-requirements/serve.txt}  # the Dockerfile's default; a lock file inside this repository
START=$SECONDS

say() { printf '== container check [%3ds] %s\n' "$((SECONDS - START))" "$*"; }
fail() { printf 'container check FAILED: %s\n' "$*" >&2; exit 1; }

WORK=$(mktemp -d /tmp/container-check.XXXXXX)
cleanup() {
    local code=$?
    if podman container exists "$PROXY" 2>/dev/null; then
        if [ "$code" != 0 ]; then
            echo "--- proxy log (last 20 lines) ---" >&2
            podman logs "$PROXY" 2>&1 | tail -20 >&2 || true
        fi
        podman rm -f -t 5 "$PROXY" >/dev/null 2>&1 || true
    fi
    if podman container exists "$NAME" 2>/dev/null; then
        if [ "$code" != 0 ]; then
            echo "--- container log (last 40 lines) ---" >&2
            podman logs "$NAME" 2>&1 | tail -40 >&2 || true
        fi
        podman rm -f -t 5 "$NAME" >/dev/null 2>&1 || true
    fi
    if podman image exists "$IMAGE" 2>/dev/null; then
        podman rmi -f "$IMAGE" >/dev/null 2>&1 || true
    fi
    # debootstrap mounts /proc (and more) inside the root it builds; an interrupted one leaves them.
    awk -v work="$WORK/" 'index($2, work) == 1 {print $2}' /proc/mounts | sort -r | while read -r mount; do
        umount -l "$mount" || true
    done
    rm -rf "$WORK"
    exit "$code"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# --- 1. the container tools ---------------------------------------------------------------------
missing=()
for tool in podman runc buildah debootstrap; do
    command -v "$tool" >/dev/null 2>&1 || missing+=("$tool")
done
if [ ${#missing[@]} -gt 0 ]; then
    say "installing ${missing[*]} from Debian"
    [ "$(id -u)" = 0 ] || fail "needs root to install ${missing[*]} and to run podman"
    # scripts/test.sh may be running apt at the same time (.ci/run): wait for its locks.
    apt_get() {
        local attempt
        for attempt in 1 2 3 4 5 6; do
            DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 "$@" && return 0
            echo "apt-get $1: attempt $attempt failed; trying again in 10 s" >&2
            sleep 10
        done
        return 1
    }
    apt_get update -qq || fail "apt-get update failed"
    apt_get install -y -qq podman runc buildah debootstrap >/dev/null || fail "installing ${missing[*]} failed"
fi
[ "$(id -u)" = 0 ] || fail "needs root (podman builds and runs as root here)"

# --- 2. the base image, made once ----------------------------------------------------------------
if podman image exists "$BASE_IMAGE"; then
    say "base image $BASE_IMAGE is cached"
else
    say "making $BASE_IMAGE with debootstrap (bookworm, minbase) from $DEBIAN_MIRROR"
    rootfs="$WORK/rootfs"
    debootstrap --variant=minbase --include=python3,python3-venv,python-is-python3,ca-certificates \
        bookworm "$rootfs" "$DEBIAN_MIRROR" >"$WORK/debootstrap.log" 2>&1 \
        || { tail -20 "$WORK/debootstrap.log" >&2; fail "debootstrap failed"; }
    rm -rf "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/var/lib/apt/lists/*
    tar -C "$rootfs" -c . | podman import --change 'CMD ["python3"]' - "$BASE_IMAGE" >"$WORK/import.log" 2>&1 \
        || { tail -20 "$WORK/import.log" >&2; fail "podman import failed"; }
    rm -rf "$rootfs"
fi

if [ "$PREPARE_ONLY" = 1 ]; then
    say "prepared: tools and $BASE_IMAGE"
    exit 0
fi

# --- 3. a real exported model, and the in-process server's answer --------------------------------
say "training and exporting a small seed_cnn on synthetic images"
TF_CPP_MIN_LOG_LEVEL=2 MODEL_WORK="$WORK" "$PYTHON" - <<'PY'
import json, os, sys

sys.path.insert(0, "tests/support")  # synthetic.py: the tests' small three-class images
import synthetic
from train import quiet

work = os.environ["MODEL_WORK"]
with quiet.native_startup():
    from export import exporter
    from train import trainer

    splits = synthetic.make_splits()
    run = os.path.join(work, "run")
    # conftest.py's trained_run: a confident model, so export's int8 check passes on 48 test images.
    trainer.run(trainer.Config(output=run, precision="float32", tpu="none", verbose=0, recipe=dict(
        epochs=4, batch_size=16, schedule="constant", augment=False, label_smoothing=0.0)), splits=splits)
    exporter.run(run_dir=run, model_dir=os.path.join(work, "models"), name="cifar10", verbose=0)

image = synthetic.encode(splits.x_test[0])
with open(os.path.join(work, "probe.png"), "wb") as f:
    f.write(image)

# The same model and runtime in this process, as the image runs it (SERVE_RUNTIME=litert).
for key in [k for k in os.environ if k.startswith(("SERVE_", "GUNICORN_", "API_KEY"))]:
    del os.environ[key]
os.environ.update(MODEL_BASE_PATH=os.path.join(work, "models"), MODEL_NAME="cifar10", SERVE_BACKEND="local",
                  SERVE_RUNTIME="litert")
os.environ.pop("PROMETHEUS_MULTIPROC_DIR", None)
from serve import create_app

client = create_app().test_client()
response = client.post("/api/v1/predict", data={"file": (__import__("io").BytesIO(image), "probe.png")},
                       content_type="multipart/form-data")
assert response.status_code == 200, response.get_data(as_text=True)
top = response.get_json()["predictions"][0]
with open(os.path.join(work, "expected.json"), "w") as f:
    json.dump({"class_id": top["class_id"], "label": top["label"]}, f)
PY
chmod -R a+rX "$WORK/models"
say "in-process answer: $(cat "$WORK/expected.json")"

# --- 4. the image ---------------------------------------------------------------------------------
# Explicit limits for every container, the build's included: podman's defaults (nofile 1048576, a
# large nproc) are more than runc may set here ("error setting rlimit type 6: operation not
# permitted"), so each is the host's soft limit, capped (2 workers x 16 threads need far less).
cap() { if [ "$1" = unlimited ] || [ "$1" -gt "$2" ]; then echo "$2"; else echo "$1"; fi; }
nofile=$(cap "$(ulimit -Sn)" 8192)
nproc=$(cap "$(ulimit -Su)" 4096)
limits=(--runtime runc --ulimit "nofile=$nofile:$nofile" --ulimit "nproc=$nproc:$nproc")
build_args=(--pull=never --format docker --layers=false "${limits[@]}" --build-arg "BASE_IMAGE=$BASE_IMAGE"
            --build-arg "LOCK=$LOCK" -t "$IMAGE")
[ -f "$HOST_CA" ] && build_args+=(-v "$HOST_CA:$HOST_CA:ro")
say "building $IMAGE from the Dockerfile ($LOCK)"
podman build "${build_args[@]}" . >"$WORK/build.log" 2>&1 || { tail -30 "$WORK/build.log" >&2; fail "podman build failed"; }
size=$(podman image inspect --format '{{.Size}}' "$IMAGE")
say "image built: $((size / 1000000)) MB"

# --- 5. run it -------------------------------------------------------------------------------------
free_port() { "$PYTHON" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
port=$(free_port)
proxy_port=$(free_port)
say "running it (runc, nofile=$nofile, nproc=$nproc, 127.0.0.1:$port -> 8000, 127.0.0.1:$proxy_port -> 8080, /models read-only)"
# No systemd here to run the HEALTHCHECK on a timer: the check below runs it itself.
# (podman still says on stderr that it cannot reach systemd for the timer: kept in engine.log.)
podman run -d --name "$NAME" "${limits[@]}" --health-interval=disable \
    -p "127.0.0.1:$port:8000" -p "127.0.0.1:$proxy_port:8080" -v "$WORK/models:/models:ro" "$IMAGE" >/dev/null 2>"$WORK/engine.log" \
    || { cat "$WORK/engine.log" >&2; fail "podman run failed"; }

# --- 6. check it ----------------------------------------------------------------------------------
cat >"$WORK/http_check.py" <<'PY'
import json, socket, sys, time

import requests

port, probe, expected_file, mode = sys.argv[1:]
base = f"http://127.0.0.1:{port}"


def wait_for(path, deadline_s=180):
    """Poll until the route answers 200; the deadline is generous for a loaded 2-core machine."""
    deadline, last = time.monotonic() + deadline_s, None
    while time.monotonic() < deadline:
        try:
            response = requests.get(base + path, timeout=5)
            if response.status_code == 200:
                return response
            last = f"{response.status_code} {response.text[:200]}"
        except requests.RequestException as exc:
            last = repr(exc)
        time.sleep(0.5)
    sys.exit(f"{path} never answered 200 within {deadline_s} s (last: {last})")


wait_for("/healthz")
print(f"/healthz 200")
ready = wait_for("/readyz")
print(f"/readyz 200 {ready.text.strip()[:200]}")
with open(probe, "rb") as f:
    response = requests.post(base + "/api/v1/predict", files={"file": ("probe.png", f, "image/png")}, timeout=60)
if response.status_code != 200:
    sys.exit(f"/api/v1/predict answered {response.status_code}: {response.text[:300]}")
top = response.json()["predictions"][0]
got = {"class_id": top["class_id"], "label": top["label"]}
with open(expected_file) as f:
    expected = json.load(f)
if got != expected:
    sys.exit(f"the container says {got}, the in-process server {expected}")
print(f"/api/v1/predict 200 {got}, as in process")
if mode == "proxy":
    if not response.headers.get("X-Request-Id"):
        sys.exit("no X-Request-Id on the answer through nginx")
    # SERVE_MAX_UPLOAD_MB's default, 16 MiB, plus one byte: nginx refuses it from the header alone.
    with socket.create_connection(("127.0.0.1", int(port)), timeout=30) as sock:
        sock.sendall(b"POST /api/v1/predict HTTP/1.1\r\nHost: x\r\nContent-Length: 16777217\r\n\r\n")
        head = sock.recv(4096).decode("latin-1")
    if not head.startswith("HTTP/1.1 413") or '"error"' not in head:
        sys.exit(f"an over-limit body through nginx: {head[:300]!r}")
    print("over the body limit: 413 from nginx, JSON")
PY
"$PYTHON" "$WORK/http_check.py" "$port" "$WORK/probe.png" "$WORK/expected.json" direct || fail "HTTP checks"

# The image's own HEALTHCHECK, as the engine runs it (it needs the docker format to survive the build).
podman healthcheck run "$NAME" >/dev/null || fail "the image's HEALTHCHECK reports unhealthy"
say "HEALTHCHECK healthy"

# --- 7. the proxy mode: nginx from the same image, in the server's network namespace ---------------
say "proxy mode: nginx in a second container, read-only root, in front of gunicorn"
podman run -d --name "$PROXY" "${limits[@]}" --health-interval=disable --read-only \
    --network "container:$NAME" "$IMAGE" "${PROXY_COMMAND[@]}" >/dev/null 2>>"$WORK/engine.log" \
    || { cat "$WORK/engine.log" >&2; fail "podman run (proxy) failed"; }
"$PYTHON" "$WORK/http_check.py" "$proxy_port" "$WORK/probe.png" "$WORK/expected.json" proxy || fail "HTTP checks through nginx"
# What the pod's preStop hook does: a graceful quit, then nginx exits by itself.
# podman can report the exec as failed when the container's main process exits while the exec ends
# (containers/podman#10825): nginx exiting by itself, 0 and in time, is what says the quit worked.
podman exec "$PROXY" nginx -p /tmp/ -c /etc/nginx/serve.conf -s quit \
    || say "podman exec reported the quit as failed; judging it by nginx's exit"
proxy_code=$(timeout 60 podman wait "$PROXY") || fail "nginx did not exit within 60 s of the quit"
proxy_log=$(podman logs "$PROXY" 2>&1)
[ "$proxy_code" = 0 ] || fail "nginx exited with $proxy_code on a graceful quit"
grep -q '"logger": "nginx.access"' <<<"$proxy_log" || fail "nginx wrote no access log line to stdout"
# nginx logs each 413 at [error] ("client intended to send too large body"): the one above was asked for.
if grep -vF 'client intended to send too large body' <<<"$proxy_log" | grep -nE '\[(emerg|alert|crit|error)\]|Permission denied'; then
    fail "nginx's log shows an error (above)"
fi
say "proxy mode: answered through nginx, quit cleanly, log clean"

podman stop -t 30 "$NAME" >/dev/null 2>>"$WORK/engine.log" || { cat "$WORK/engine.log" >&2; fail "podman stop failed"; }
code=$(podman inspect --format '{{.State.ExitCode}}' "$NAME")
log=$(podman logs "$NAME" 2>&1)
[ "$code" = 0 ] || fail "the server exited with $code on SIGTERM"
if grep -nE 'Traceback|Errno|Permission denied|Control server error|\[(ERROR|CRITICAL)\]' <<<"$log"; then
    fail "the container's log shows an error (above)"
fi
say "stopped cleanly (exit 0), log clean; total $((SECONDS - START)) s"
