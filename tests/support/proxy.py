"""The image's proxy mode: nginx with deploy/nginx/nginx.conf, read and started as the image starts it.

Shared by tests/deploy/test_proxy.py (a real nginx in front of a live gunicorn), test_replicas.py (in
front of two), test_k8s.py and test_deploy.py (the manifests and compose.yaml run the same command).
"""

import re
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import requests

ROOT = Path(__file__).resolve().parents[2]
#: The file in the repository, and where the Dockerfile copies it.
CONFIG = ROOT / "deploy" / "nginx" / "nginx.conf"
IMAGE_CONFIG = "/etc/nginx/serve.conf"
#: nginx as the image's proxy mode runs it (Dockerfile, compose.yaml, deploy/k8s/base/frontend.yaml).
COMMAND = ["nginx", "-p", "/tmp/", "-c", IMAGE_CONFIG, "-e", "stderr", "-g", "daemon off;"]
STARTUP_TIMEOUT_S = 60


def directives(name, text=None):
    """Every value of the directive ``name`` in the config (comments dropped), in order."""
    text = CONFIG.read_text() if text is None else text
    lines = (line.split("#", 1)[0] for line in text.splitlines())
    return [m.group(1).strip() for line in lines for m in [re.match(rf"\s*{re.escape(name)}\s+([^;]*);", line)] if m]


def listen_port(text=None):
    (port,) = directives("listen", text)
    return int(port)


def upstream_servers(text=None):
    """The ``server`` lines of the ``upstream`` that ``proxy_pass`` names: [(host, port, parameters)], in order."""
    text = CONFIG.read_text() if text is None else text
    (target,) = directives("proxy_pass", text)
    name = target.removeprefix("http://").rstrip("/")
    block = re.search(rf"^\s*upstream\s+{re.escape(name)}\s*{{(.*?)^\s*}}", text, re.MULTILINE | re.DOTALL)
    assert block, f"proxy_pass names {name!r}, and no upstream block of that name is in the config"
    servers = []
    for value in directives("server", block.group(1)):
        address, _, parameters = value.partition(" ")
        host, _, port = address.rpartition(":")
        servers.append((host, int(port), parameters.strip()))
    return servers


def upstream(text=None):
    """(host, port) of the one server that requests go to: the shipped config's, gunicorn beside nginx."""
    ((host, port, _),) = upstream_servers(text)
    return host, port


def size_bytes(value):
    """An nginx size (``16m``, ``256k``, ``1024``) in bytes."""
    number, unit = re.fullmatch(r"(\d+)([kKmMgG]?)", value).groups()
    return int(number) * {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30}[unit.lower()]


def nginx_binary():
    """Debian's nginx (scripts/test.sh installs it), or None."""
    return shutil.which("nginx") or (shutil.which("nginx", path="/usr/sbin:/sbin"))


def start(port, upstream_port, stdout=None, stderr=None):
    """nginx with the repository's config, listening on ``port`` in front of 127.0.0.1:``upstream_port``.

    ``upstream_port``: a port, or a list of them for replicas: the upstream's one ``server`` line
    becomes one a port, each with the shipped line's parameters, as docs/deploy.md writes them.
    Only the ports change: the paths stay as they are, relative to ``-p``, a new folder (the
    image gives ``/tmp/``) that :func:`stop` removes. Returns the process once nginx answers on its port.
    """
    text = CONFIG.read_text()
    ports = [upstream_port] if isinstance(upstream_port, int) else list(upstream_port)
    listen, ((host, default_upstream, parameters),) = f"listen {listen_port(text)};", upstream_servers(text)
    server = f"server {host}:{default_upstream} {parameters};"
    assert text.count(listen) == 1 and text.count(server) == 1 and host == "127.0.0.1"
    indent = re.search(rf"^([ \t]*){re.escape(server)}", text, re.MULTILINE).group(1)
    servers = f"\n{indent}".join(f"server 127.0.0.1:{p} {parameters};" for p in ports)
    moved = text.replace(listen, f"listen 127.0.0.1:{port};").replace(server, servers)
    # Started as root (as tests may be), nginx runs its workers as nobody, who must reach the
    # folders it makes for them here: a folder of its own, readable on the way, as /tmp/ is.
    prefix = Path(tempfile.mkdtemp(prefix="serve-nginx-"))
    prefix.chmod(0o755)
    config = prefix / "serve.conf"
    config.write_text(moved)
    command = [nginx_binary(), *COMMAND[1:]]
    command[command.index("-p") + 1] = f"{prefix}/"
    command[command.index("-c") + 1] = str(config)
    process = subprocess.Popen(command, stdout=stdout, stderr=stderr)
    process.serve_prefix = prefix
    deadline = time.monotonic() + STARTUP_TIMEOUT_S
    while time.monotonic() < deadline:
        if process.poll() is not None:
            shutil.rmtree(prefix, ignore_errors=True)
            raise RuntimeError(f"nginx exited with code {process.returncode}")
        try:
            requests.get(f"http://127.0.0.1:{port}/healthz", timeout=5)
            return process
        except requests.ConnectionError:
            time.sleep(0.2)
    process.kill()
    shutil.rmtree(prefix, ignore_errors=True)
    raise RuntimeError(f"nginx not listening within {STARTUP_TIMEOUT_S} s")


def stop(process):
    """A graceful quit (SIGQUIT), as the pod's preStop hook asks for."""
    import signal

    process.send_signal(signal.SIGQUIT)
    try:
        process.wait(timeout=30)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
    shutil.rmtree(process.serve_prefix, ignore_errors=True)
