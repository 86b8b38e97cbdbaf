"""Checks of the KServe manifests in deploy/kserve/, offline: no cluster runs where these tests do.

Every kustomization is rendered with ``kubectl kustomize`` (as tests/deploy/test_k8s.py renders deploy/k8s/),
and what comes out is:

* valid, strictly (no unknown field), against the KServe CRD schemas vendored in
  deploy/kserve/schemas/ (InferenceService v1beta1 and ClusterServingRuntime v1alpha1 of KServe
  v0.20.0), and the plain Kubernetes objects against the Kubernetes schemas as in test_k8s;
* within the rules KServe's admission webhook and Knative's validation apply at the same versions
  (name format, deployment modes, autoscaler classes and metrics, the pod fields Knative accepts by
  default), as far as they concern these manifests;
* consistent with the rest of the project: the front end predictor runs the Dockerfile's image,
  port, user and probes with deploy/k8s's probe timings and resources, sets only variables that
  serve/settings.py knows (and KServe's own STORAGE_URI); the storage URI, mounted at /mnt/models,
  is the folder where the export Job writes and deploy/k8s serves from; TF Serving runs the image
  of compose.yaml through KServe's tensorflow runtime under the model name the front end asks for,
  and the front end reaches it through the Service KServe makes; the canary changes only the model
  and the traffic split.

What this cannot show (docs/deploy.md says so too): that KServe admits and reconciles them, that the
storage initializer mounts the claim, that Knative routes the canary split.
"""

import copy
import hashlib
import json
import os
import re
from pathlib import Path
from urllib.parse import urlsplit

import pytest
import yaml

from manifests import OLDEST_K8S, claim_path, env_of, kubernetes_schema_errors, kustomize, one, selects, tfserving_probe_passes
from project_files import compose, dockerfile_env, final_stage, instruction, project_version, split_image

ROOT = Path(__file__).resolve().parents[2]
KSERVE = ROOT / "deploy" / "kserve"
K8S = ROOT / "deploy" / "k8s"
SCHEMAS = KSERVE / "schemas"

TARGETS = ["custom", "tfserving", "knative", "canary"]
#: What these manifests are checked against from deploy/k8s.
K8S_TARGETS = ["overlays/local", "overlays/tfserving", "storage", "training/export"]
NAMESPACE = "cifar"

# KServe v0.20.0 (pkg/constants/constants.go, pkg/apis/serving/v1beta1/*_validation.go).
ISVC_API_VERSION = "serving.kserve.io/v1beta1"
ISVC_NAME = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")  # IsvcNameFmt
MODEL_MOUNT = "/mnt/models"  # DefaultModelLocalMountPath
STORAGE_URI_VARIABLE = "STORAGE_URI"  # CustomSpecStorageUriEnvVarKey: read by KServe, not the server
PREDICTOR_CONTAINER = "kserve-container"  # InferenceServiceContainerName
PREDICTOR_POD_LABELS = ("serving.kserve.io/inferenceservice", "component")  # InferenceServicePodLabelKey, KServiceComponentLabel
SERVICE_PORT = 80  # CommonDefaultHttpPort: the predictor Service's port
DEFAULT_CONTAINER_PORT = 8080  # InferenceServiceDefaultHttpPort: its target when the container declares none
MODE = "serving.kserve.io/deploymentMode"
MODES = {"Standard", "Knative"}
AUTOSCALER_CLASS = "serving.kserve.io/autoscalerClass"
KNATIVE_CLASS = "autoscaling.knative.dev/class"
KNATIVE_HPA = "hpa.autoscaling.knative.dev"
HPA_METRICS, KPA_METRICS = {"cpu", "memory"}, {"concurrency", "rps"}
#: Predictor fields that are KServe's (ComponentExtensionSpec and PredictorSpec), not the pod's.
KSERVE_PREDICTOR_FIELDS = {
    "minReplicas", "maxReplicas", "scaleTarget", "scaleMetric", "scaleMetricType", "containerConcurrency",
    "timeout", "canaryTrafficPercent", "logger", "batcher", "labels", "annotations", "deploymentStrategy",
    "autoScaling", "model", "storageUris", "name", "storageContainerName",
}

# Knative Serving's defaults (knative/serving pkg/apis/serving/fieldmask.go and k8s_validation.go,
# config/core/configmaps/features.yaml at knative-v1.23): what a Knative-mode pod may set without
# turning on a feature flag.
KNATIVE_POD_FIELDS = {"serviceAccountName", "containers", "volumes", "imagePullSecrets", "enableServiceLinks",
                      "automountServiceAccountToken"}
KNATIVE_CONTAINER_FIELDS = {"name", "args", "command", "env", "workingDir", "envFrom", "image", "imagePullPolicy",
                            "livenessProbe", "ports", "readinessProbe", "resources", "securityContext", "startupProbe",
                            "terminationMessagePath", "terminationMessagePolicy", "volumeMounts"}
KNATIVE_SECURITY_FIELDS = {"capabilities", "readOnlyRootFilesystem", "runAsUser", "runAsGroup", "runAsNonRoot",
                           "allowPrivilegeEscalation", "seccompProfile"}
KNATIVE_VOLUME_SOURCES = {"secret", "configMap", "projected", "emptyDir"}
KNATIVE_PORT_NAMES = {"", "h2c", "http1"}
KNATIVE_RESERVED_ENV = {"PORT", "K_SERVICE", "K_CONFIGURATION", "K_REVISION"}  # Knative sets these itself
KNATIVE_RESERVED_PORTS = {8012, 8013, 8022, 9090, 9091, 8008}  # queue-proxy's and the profiler's
KNATIVE_RESERVED_PATHS = {"/", "/dev", "/dev/log"}


# --- rendering --------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def rendered():
    """{target: [resource, ...]} for every target in deploy/kserve/."""
    return {target: kustomize(KSERVE / target) for target in TARGETS}


@pytest.fixture(scope="module")
def k8s():
    """The deploy/k8s targets these manifests must agree with."""
    return {target: kustomize(K8S / target) for target in K8S_TARGETS}


def isvc(rendered, target):
    return one(rendered[target], "InferenceService")


def predictor_container(service):
    containers = service["spec"]["predictor"]["containers"]
    assert [c["name"] for c in containers] == [PREDICTOR_CONTAINER]
    return containers[0]


def deployment_container(resources, deployment, name):
    return next(c for c in one(resources, "Deployment", deployment)["spec"]["template"]["spec"]["containers"] if c["name"] == name)


def predictor_pod_labels(service):
    """The labels KServe puts on every predictor pod of ``service``."""
    return {PREDICTOR_POD_LABELS[0]: service["metadata"]["name"], PREDICTOR_POD_LABELS[1]: "predictor"}


def custom_predictors(rendered):
    return [(t, isvc(rendered, t)) for t in TARGETS if "containers" in isvc(rendered, t)["spec"]["predictor"]]


def test_every_kustomization_is_rendered():
    found = {str(p.parent.relative_to(KSERVE)) for p in KSERVE.rglob("kustomization.yaml")}
    assert found == set(TARGETS)


# --- the Dockerfile, compose.yaml, the project ---------------------------------------------------


def dockerfile_final_stage():
    """The serving Dockerfile's final stage, and its environment."""
    return final_stage(ROOT / "Dockerfile"), dockerfile_env(ROOT / "Dockerfile")


def server_settings(c, image_env):
    """What serve.settings makes of the image's environment with the container's on top."""
    from serve.settings import Settings

    own = {k: v for k, v in env_of(c).items() if k != STORAGE_URI_VARIABLE}
    return Settings.from_env({**image_env, **own})


# --- schemas ------------------------------------------------------------------------------------

TRIMMED = "x-vendor-trimmed"


def strict(schema):
    """A CRD's structural schema as JSON Schema in which a field it does not name is an error."""
    if isinstance(schema, list):
        return [strict(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    if schema.get(TRIMMED):
        return {"not": {}, TRIMMED: True}
    out = {k: (strict(v) if k in ("properties", "items", "additionalProperties", "anyOf", "allOf", "oneOf") else v)
           for k, v in schema.items()}
    if "properties" in out:
        out["properties"] = {k: strict(v) for k, v in schema["properties"].items()}
        if "additionalProperties" not in out and not schema.get("x-kubernetes-preserve-unknown-fields"):
            out["additionalProperties"] = False
    return out


@pytest.fixture(scope="module")
def validators():
    import jsonschema

    def load(name):
        schema = strict(json.loads((SCHEMAS / name).read_text()))
        jsonschema.Draft7Validator.check_schema(schema)
        return jsonschema.Draft7Validator(schema)

    return {
        ("serving.kserve.io/v1beta1", "InferenceService"): load("inferenceservice-v1beta1.json"),
        ("serving.kserve.io/v1alpha1", "ClusterServingRuntime"): load("clusterservingruntime-v1alpha1.json"),
    }


def schema_errors(validators, resource):
    validator = validators[(resource["apiVersion"], resource["kind"])]
    errors = []
    for e in validator.iter_errors(resource):
        where = ".".join(str(p) for p in e.absolute_path)
        if isinstance(e.schema, dict) and e.schema.get(TRIMMED):
            errors.append(f"{where}: trimmed from the vendored schema (deploy/kserve/schemas/README.md: re-vendor)")
        else:
            errors.append(f"{where}: {e.message}")
    return errors


def test_vendored_schemas_are_the_files_the_readme_describes():
    readme = (SCHEMAS / "README.md").read_text()
    assert "v0.20.0" in readme
    listed = dict(re.findall(r"^\| `([\w.-]+)` \| `([0-9a-f]{64})` \|$", readme, re.M))
    vendored = {p.name for p in SCHEMAS.iterdir() if p.suffix in (".json", ".yaml")}
    assert set(listed) == vendored
    for name, digest in listed.items():
        assert hashlib.sha256((SCHEMAS / name).read_bytes()).hexdigest() == digest, f"{name} differs from what README.md records"


def test_inferenceservices_match_the_vendored_crd_schema(rendered, validators):
    errors = []
    for target, resources in rendered.items():
        for r in resources:
            if r["apiVersion"].startswith("serving.kserve.io/"):
                errors += [f"{target}: {r['kind']}/{r['metadata']['name']}: {e}" for e in schema_errors(validators, r)]
    assert not errors, "\n".join(errors)
    for target in TARGETS:
        service = isvc(rendered, target)
        assert service["apiVersion"] == ISVC_API_VERSION
        assert ISVC_NAME.match(service["metadata"]["name"]), service["metadata"]["name"]


def test_vendored_runtime_matches_its_schema(validators):
    runtime = yaml.safe_load((SCHEMAS / "kserve-tensorflow-serving.yaml").read_text())
    assert not schema_errors(validators, runtime)


@pytest.mark.parametrize("mutation, expected", [
    (lambda s: s["spec"]["predictor"].update(canaryTrafficPercentage=10), "Additional properties"),
    (lambda s: s["spec"]["predictor"]["containers"][0].update(readinesProbe={}), "Additional properties"),
    (lambda s: s["spec"]["predictor"].update(minReplicas="2"), "is not of type 'integer'"),
    (lambda s: s["spec"]["predictor"].update(deploymentStrategy={"type": "Recreate", "rollingUpdate": 1}), "is not of type 'object'"),
    (lambda s: s["spec"].pop("predictor"), "'predictor' is a required property"),
    (lambda s: s["spec"].update(transformer={"containers": []}), "trimmed from the vendored schema"),
])
def test_schema_validation_can_fail(rendered, validators, mutation, expected):
    """The check above can fail: an unknown field, a wrong type, a missing required one, a trimmed one."""
    service = copy.deepcopy(isvc(rendered, "custom"))
    assert not schema_errors(validators, service)
    mutation(service)
    errors = schema_errors(validators, service)
    assert any(expected in e for e in errors), errors


@pytest.mark.parametrize("version", [OLDEST_K8S, "latest"])
def test_kubernetes_objects_match_the_kubernetes_schemas(rendered, version):
    kubernetes = {target: [r for r in resources if not r["apiVersion"].startswith("serving.kserve.io/")]
                  for target, resources in rendered.items()}
    errors = kubernetes_schema_errors(kubernetes, version)
    assert not errors, "\n".join(errors)


def test_everything_lives_in_one_namespace_and_is_labelled(rendered):
    for target, resources in rendered.items():
        for r in resources:
            assert r["metadata"].get("namespace") == NAMESPACE, f"{target}: {r['kind']}/{r['metadata']['name']}"
            assert r["metadata"]["labels"]["app.kubernetes.io/part-of"] == "cifar-tpu-pipeline"


# --- KServe's and Knative's own rules ------------------------------------------------------------


def test_deployment_modes_and_autoscaling_are_ones_kserve_accepts(rendered):
    """validateAutoScalingCompExtension and the KPA/HPA rules of KServe's webhook, per deployment mode."""
    for target in TARGETS:
        service = isvc(rendered, target)
        annotations, predictor = service["metadata"]["annotations"], service["spec"]["predictor"]
        mode = annotations[MODE]
        assert mode in MODES, f"{target}: {mode}"  # explicit: the cluster's default differs between KServe releases
        metric = predictor.get("scaleMetric")
        if mode == "Standard" or annotations.get(KNATIVE_CLASS) == KNATIVE_HPA:
            if mode == "Standard":
                assert annotations.get(AUTOSCALER_CLASS, "hpa") == "hpa", target
            assert (metric or "cpu") in HPA_METRICS, target
            if (metric or "cpu") == "cpu" and "scaleTarget" in predictor:
                assert 1 <= predictor["scaleTarget"] <= 100, target
        else:
            assert (metric or "concurrency") in KPA_METRICS, target
        if mode == "Knative":
            assert "deploymentStrategy" not in predictor, f"{target}: KServe takes deploymentStrategy in Standard mode only"
        assert 1 <= predictor["minReplicas"] <= predictor["maxReplicas"], target


def test_canary_traffic_is_split_only_where_kserve_can(rendered):
    """canaryTrafficPercent is KServe's split between Knative revisions: Knative mode, 0..100."""
    for target in TARGETS:
        service = isvc(rendered, target)
        for component in ("predictor", "transformer", "explainer"):
            percent = service["spec"].get(component, {}).get("canaryTrafficPercent")
            if percent is not None:
                assert isinstance(percent, int) and 0 <= percent <= 100, f"{target}: {percent}"
                assert service["metadata"]["annotations"][MODE] == "Knative", target
    # The canary target splits: a share to the new revision, the rest to the last one.
    assert 0 < isvc(rendered, "canary")["spec"]["predictor"]["canaryTrafficPercent"] < 100


def test_the_canary_changes_only_the_model_and_the_split(rendered):
    base, canary = isvc(rendered, "knative"), copy.deepcopy(isvc(rendered, "canary"))
    assert canary["metadata"]["name"] == base["metadata"]["name"]  # the same object, updated: a new revision
    base_uri, canary_uri = (env_of(predictor_container(s))[STORAGE_URI_VARIABLE] for s in (base, canary))
    assert canary_uri != base_uri
    predictor = canary["spec"]["predictor"]
    del predictor["canaryTrafficPercent"]
    next(e for e in predictor["containers"][0]["env"] if e["name"] == STORAGE_URI_VARIABLE)["value"] = base_uri
    assert canary["metadata"]["annotations"].pop("serving.kserve.io/enable-tag-routing") == "true"
    assert canary == base
    # The base is ../custom in Knative mode, nothing else: the annotations and Knative's rules.
    custom = copy.deepcopy(isvc(rendered, "custom"))
    custom["metadata"]["annotations"].update({MODE: "Knative", KNATIVE_CLASS: KNATIVE_HPA})
    del custom["spec"]["predictor"]["deploymentStrategy"]
    assert custom == base


def test_custom_predictors_use_only_what_knative_accepts_by_default(rendered):
    """One spec for both modes: the custom predictor's pod passes Knative's validation with no feature flag."""
    for target, service in custom_predictors(rendered):
        predictor = service["spec"]["predictor"]
        pod_fields = set(predictor) - KSERVE_PREDICTOR_FIELDS
        assert pod_fields <= KNATIVE_POD_FIELDS, f"{target}: {sorted(pod_fields - KNATIVE_POD_FIELDS)}"
        assert predictor.get("automountServiceAccountToken", False) is False
        for volume in predictor.get("volumes", []):
            assert set(volume) - {"name"} <= KNATIVE_VOLUME_SOURCES, f"{target}: {volume}"
        c = predictor_container(service)
        assert set(c) <= KNATIVE_CONTAINER_FIELDS, f"{target}: {sorted(set(c) - KNATIVE_CONTAINER_FIELDS)}"
        assert set(c["securityContext"]) <= KNATIVE_SECURITY_FIELDS, target
        assert "add" not in c["securityContext"].get("capabilities", {})
        assert len(c["ports"]) == 1 and c["ports"][0].get("name", "") in KNATIVE_PORT_NAMES, target
        assert c["ports"][0]["containerPort"] not in KNATIVE_RESERVED_PORTS, target
        assert not set(env_of(c)) & KNATIVE_RESERVED_ENV, target
        assert not {m["mountPath"] for m in c.get("volumeMounts", [])} & KNATIVE_RESERVED_PATHS, target
        for kind in ("startupProbe", "readinessProbe", "livenessProbe"):
            port = (c.get(kind, {}).get("httpGet") or {}).get("port")
            assert port in (None, c["ports"][0].get("name"), c["ports"][0]["containerPort"]), f"{target}: {kind} port {port}"


def test_every_container_is_locked_down(rendered):
    for target, service in [(t, isvc(rendered, t)) for t in TARGETS]:
        predictor = service["spec"]["predictor"]
        assert predictor["automountServiceAccountToken"] is False
        c = predictor.get("model") or predictor_container(service)
        sc = c["securityContext"]
        assert sc["runAsNonRoot"] is True and sc["runAsUser"] >= 10000, target
        assert sc["allowPrivilegeEscalation"] is False and sc["readOnlyRootFilesystem"] is True, target
        assert sc["capabilities"]["drop"] == ["ALL"] and sc["seccompProfile"]["type"] == "RuntimeDefault", target
        assert {"cpu", "memory"} <= set(c["resources"]["limits"]), target
        tmp = next(m for m in c["volumeMounts"] if m["mountPath"] == "/tmp")
        assert "emptyDir" in next(v for v in predictor["volumes"] if v["name"] == tmp["name"]), target


# --- the front end predictor against the Dockerfile, deploy/k8s and serve/ ------------------------


@pytest.mark.parametrize("target", ["custom", "knative", "canary"])
def test_front_end_predictor_runs_the_dockerfiles_image_as_deploy_k8s_does(rendered, k8s, target):
    c = predictor_container(isvc(rendered, target))
    stage, image_env = dockerfile_final_stage()
    k8s_serve = deployment_container(k8s["overlays/local"], "cifar-serve", "serve")

    built = split_image(compose()["services"]["serve"]["image"])[0]
    assert split_image(c["image"]) == (built, project_version()) and c["image"] == k8s_serve["image"]
    assert c["imagePullPolicy"] == k8s_serve["imagePullPolicy"]
    assert "command" not in c and "args" not in c  # the image's CMD runs
    (port,) = c["ports"]
    assert port["containerPort"] == int(image_env["PORT"])
    assert port["containerPort"] in {int(p) for p in instruction(stage, "EXPOSE").split()}
    assert port["name"] == "http1"  # gunicorn speaks HTTP/1.1; Knative sets PORT to this port (the same 8000)
    uid, _, gid = instruction(stage, "USER").partition(":")
    assert (c["securityContext"]["runAsUser"], c["securityContext"]["runAsGroup"]) == (int(uid), int(gid))
    assert c["resources"] == k8s_serve["resources"]
    # The probes of deploy/k8s, on this port: the same routes and timings (test_k8s asks the app
    # that those routes answer).
    for kind in ("startupProbe", "readinessProbe", "livenessProbe"):
        ours, theirs = copy.deepcopy(c[kind]), copy.deepcopy(k8s_serve[kind])
        assert ours["httpGet"].pop("port") == port["name"]
        theirs["httpGet"].pop("port")
        assert ours == theirs, kind
    # Prometheus's multiprocess folder is on the writable /tmp.
    assert os.path.commonpath([image_env["PROMETHEUS_MULTIPROC_DIR"], "/tmp"]) == "/tmp"


@pytest.mark.parametrize("target", ["custom", "knative", "canary"])
def test_front_end_predictor_environment_is_what_the_server_reads(rendered, k8s, target):
    from serve.settings import BACKENDS, Settings

    c = predictor_container(isvc(rendered, target))
    env = env_of(c)
    unknown = set(env) - set(Settings.variables()) - {STORAGE_URI_VARIABLE}
    assert not unknown, f"serve/settings.py knows no variable named {sorted(unknown)}"
    assert STORAGE_URI_VARIABLE in env
    _, image_env = dockerfile_final_stage()
    settings = server_settings(c, image_env)  # raises SettingsError on a value the server refuses
    assert settings.backend == "local" and settings.backend in BACKENDS
    # As deploy/k8s: one worker per requested core, one model thread per worker. Not its
    # SERVE_TRUSTED_PROXIES, which counts the nginx beside gunicorn in deploy/k8s's pod: the
    # predictor has none, and a count with no proxy would let clients choose their address.
    k8s_env = env_of(deployment_container(k8s["overlays/local"], "cifar-serve", "serve"))
    assert k8s_env.pop("SERVE_TRUSTED_PROXIES") == "1" and "SERVE_TRUSTED_PROXIES" not in env
    assert {k: env[k] for k in k8s_env} == k8s_env
    assert settings.web_concurrency == int(c["resources"]["requests"]["cpu"]) == int(c["resources"]["limits"]["cpu"])


# --- where the model comes from ------------------------------------------------------------------


def pvc_location(uri):
    """``(claim, path in the claim)`` of a pvc://CLAIM/PATH storage URI, as KServe's ParsePvcURI splits it."""
    assert uri.startswith("pvc://"), uri
    claim, _, path = uri.removeprefix("pvc://").partition("/")
    return claim, os.path.normpath(path or ".")


def exported_location(k8s):
    """Where the export Job writes the folder of versions NAME/N/, and the model's name."""
    from export.exporter import build_parser

    job = one(k8s["training/export"], "Job")
    c = job["spec"]["template"]["spec"]["containers"][0]
    args = build_parser().parse_args(c["args"])
    return claim_path(job, c, os.path.join(args.model_dir, args.model_name)), args.model_name


def test_storage_uri_is_where_the_export_job_writes_and_the_server_reads(rendered, k8s):
    _, image_env = dockerfile_final_stage()
    (claim, folder), name = exported_location(k8s)
    assert claim in {r["metadata"]["name"] for r in k8s["storage"] if r["kind"] == "PersistentVolumeClaim"}
    # deploy/k8s's front end reads the same folder, through MODEL_BASE_PATH/MODEL_NAME.
    local = one(k8s["overlays/local"], "Deployment", "cifar-serve")
    local_c = deployment_container(k8s["overlays/local"], "cifar-serve", "serve")
    assert claim_path(local, local_c, server_settings(local_c, image_env).model_dir) == (claim, folder)
    for target in ("custom", "knative"):
        c = predictor_container(isvc(rendered, target))
        settings = server_settings(c, image_env)
        # KServe mounts the storage URI at /mnt/models; the server's model folder is inside it.
        inside = os.path.relpath(settings.model_dir, MODEL_MOUNT)
        assert not inside.startswith(".."), f"{target}: {settings.model_dir} is not under {MODEL_MOUNT}"
        uri_claim, uri_path = pvc_location(env_of(c)[STORAGE_URI_VARIABLE])
        assert (uri_claim, os.path.normpath(os.path.join(uri_path, inside))) == (claim, folder), target
        assert settings.model_name == name  # the name in the front end's URLs
    # The canary's model is another folder of versions on the same volume.
    canary_claim, canary_path = pvc_location(env_of(predictor_container(isvc(rendered, "canary")))[STORAGE_URI_VARIABLE])
    assert canary_claim == claim and canary_path != folder
    assert os.path.basename(canary_path) == name  # as the export Job writes it: --model-dir=/models/candidates


# --- TF Serving as the predictor ------------------------------------------------------------------


def runtime():
    return yaml.safe_load((SCHEMAS / "kserve-tensorflow-serving.yaml").read_text())


def runtime_flags():
    (c,) = runtime()["spec"]["containers"]
    return dict(a.removeprefix("--").split("=", 1) for a in c["args"])


def test_tfserving_predictor_runs_composes_image_through_kserves_runtime(rendered, k8s):
    service = isvc(rendered, "tfserving")
    model = service["spec"]["predictor"]["model"]
    served = runtime()
    assert model["runtime"] == served["metadata"]["name"]
    assert {"name": model["modelFormat"]["name"], "version": model["modelFormat"]["version"]} in [
        {"name": f["name"], "version": f["version"]} for f in served["spec"]["supportedModelFormats"]]
    assert model["protocolVersion"] in served["spec"]["protocolVersions"]
    # runtimeVersion replaces the runtime image's tag: the image is then compose.yaml's, exactly.
    runtime_image, _ = split_image(served["spec"]["containers"][0]["image"])
    assert f"{runtime_image}:{model['runtimeVersion']}" == compose()["services"]["tfserving"]["image"]
    # The runtime's flags stay whole: nothing appended, no port of its own (the Service's 80 goes to 8080).
    assert "args" not in model and "command" not in model and "ports" not in model
    assert int(runtime_flags()["rest_api_port"]) == DEFAULT_CONTAINER_PORT
    assert model["resources"] == deployment_container(k8s["overlays/tfserving"], "tfserving", "tfserving")["resources"]


def test_tfserving_serves_the_exported_folder_under_the_front_ends_model_name(rendered, k8s):
    service = isvc(rendered, "tfserving")
    flags = runtime_flags()
    (claim, folder), name = exported_location(k8s)
    # --model_base_path is the mount itself: the storage URI is the folder of versions.
    assert flags["model_base_path"] == MODEL_MOUNT
    assert pvc_location(service["spec"]["predictor"]["model"]["storageUri"]) == (claim, folder)
    # --model_name={{.Name}}: the InferenceService's name is the model the front end asks for.
    assert flags["model_name"] == "{{.Name}}"
    _, image_env = dockerfile_final_stage()
    front_end = deployment_container(rendered["tfserving"], "cifar-serve", "serve")
    assert service["metadata"]["name"] == server_settings(front_end, image_env).model_name == name


def test_front_end_reaches_the_predictor_through_kserves_service(rendered):
    from serve.settings import Settings

    resources = rendered["tfserving"]
    service = isvc(rendered, "tfserving")
    front_end = deployment_container(resources, "cifar-serve", "serve")
    env = env_of(front_end)
    assert set(env) <= set(Settings.variables())
    _, image_env = dockerfile_final_stage()
    assert server_settings(front_end, image_env).backend == "tfserving-rest"
    url = urlsplit(env["TFSERVING_REST_URL"])
    name, namespace = service["metadata"]["name"], service["metadata"]["namespace"]
    # PredictorServiceName: NAME-predictor, in the InferenceService's namespace, on port 80.
    assert (url.scheme, url.hostname, url.port or SERVICE_PORT, url.path) == ("http", f"{name}-predictor.{namespace}.svc", SERVICE_PORT, "")
    # Only the front end's pods may reach the predictor, on the runtime's REST port.
    policy = one(resources, "NetworkPolicy", f"{name}-predictor")
    assert policy["spec"]["podSelector"]["matchLabels"] == predictor_pod_labels(service)
    assert service["metadata"]["annotations"][MODE] == "Standard"  # in Knative mode requests come from its gateway
    (rule,) = policy["spec"]["ingress"]
    pod_labels = one(resources, "Deployment", "cifar-serve")["spec"]["template"]["metadata"]["labels"]
    assert [selects(f["podSelector"]["matchLabels"], pod_labels) for f in rule["from"]] == [True]
    assert [p["port"] for p in rule["ports"]] == [int(runtime_flags()["rest_api_port"])]


def test_front_end_in_front_of_tfserving_is_deploy_k8s_with_another_backend(rendered, k8s):
    """Every object of deploy/k8s/base as overlays/tfserving renders it, but for the backend variables."""
    backend = {"SERVE_BACKEND", "TFSERVING_GRPC_TARGET", "TFSERVING_REST_URL"}
    ours = {(r["kind"], r["metadata"]["name"]): copy.deepcopy(r) for r in rendered["tfserving"]}
    theirs = {(r["kind"], r["metadata"]["name"]): copy.deepcopy(r) for r in k8s["overlays/tfserving"]}
    front_end = {key for key, r in theirs.items() if r["metadata"].get("labels", {}).get("app.kubernetes.io/name") == "cifar-serve"
                 or key[1] == "cifar-serve"}
    assert ("Deployment", "cifar-serve") in front_end and len(front_end) == 6  # with its Service, account, HPA, budget, policy
    for key in front_end:
        for r in (ours[key], theirs[key]):
            if key[0] == "Deployment":
                for c in r["spec"]["template"]["spec"]["containers"]:
                    if "env" in c:  # the proxy container has none
                        c["env"] = [e for e in c["env"] if e["name"] not in backend]
        assert ours[key] == theirs[key], key
    assert set(ours) - front_end == {("InferenceService", "cifar10"), ("NetworkPolicy", "cifar10-predictor")}


@pytest.mark.parametrize("state, ready", [("AVAILABLE", True), ("LOADING", False), (None, False)])
def test_tfserving_readiness_waits_for_an_available_model(rendered, state, ready):
    """The readiness command, pointed at a loopback stand-in for TF Serving's REST port."""
    service = isvc(rendered, "tfserving")
    command = service["spec"]["predictor"]["model"]["readinessProbe"]["exec"]["command"]
    rest, name = runtime_flags()["rest_api_port"], service["metadata"]["name"]
    assert tfserving_probe_passes(command, rest, name, state) == ready


# --- scaling and disruption against deploy/k8s ----------------------------------------------------


def test_scaling_follows_deploy_k8s(rendered, k8s):
    for target, workload, source in (("custom", "cifar-serve", "overlays/local"), ("tfserving", "tfserving", "overlays/tfserving")):
        predictor = isvc(rendered, target)["spec"]["predictor"]
        hpa = one(k8s[source], "HorizontalPodAutoscaler", workload)["spec"]
        # KServe's predictor scales on one metric: the CPU one. deploy/k8s's per-pod custom metrics
        # (requests under way, images queued) have no counterpart there (docs/deploy.md, KServe).
        # deploy/k8s's front end counts its gunicorn container's CPU alone (ContainerResource): the
        # predictor's one container is that container.
        (metric,) = [m.get("resource") or m["containerResource"] for m in hpa["metrics"] if m["type"] in ("Resource", "ContainerResource")]
        assert (predictor["minReplicas"], predictor["maxReplicas"]) == (hpa["minReplicas"], hpa["maxReplicas"]), target
        assert (predictor["scaleMetric"], predictor["scaleTarget"]) == (metric["name"], metric["target"]["averageUtilization"])
        rolling = one(k8s[source], "Deployment", workload)["spec"]["strategy"]
        assert predictor["deploymentStrategy"] == rolling, target


@pytest.mark.parametrize("target", ["custom", "knative", "canary"])
def test_budget_selects_the_predictor_pods(rendered, target):
    service = isvc(rendered, target)
    budget = one(rendered[target], "PodDisruptionBudget")
    assert budget["spec"]["selector"]["matchLabels"] == predictor_pod_labels(service)
    assert budget["spec"]["minAvailable"] < service["spec"]["predictor"]["minReplicas"]  # never blocks a drain


# --- the docs -----------------------------------------------------------------------------------


def test_docs_name_every_target_and_only_paths_that_exist():
    text = (ROOT / "docs" / "deploy.md").read_text()
    section = text.split("\n## KServe\n", 1)[1].split("\n## ", 1)[0]
    mentioned = set(re.findall(r"deploy/kserve/[\w./-]*[\w-]", section))
    assert {f"deploy/kserve/{t}" for t in TARGETS} <= mentioned
    assert not [m for m in mentioned if not (ROOT / m).exists()]
