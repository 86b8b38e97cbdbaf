"""Writes the vendored KServe schemas in this folder from a kserve/kserve checkout.

    python deploy/kserve/schemas/vendor.py PATH/TO/kserve   # a checkout at the tag named in README.md

For each CRD it keeps the openAPIV3Schema of one served version with every ``description``
removed, and the subtrees in TRIMMED (fields these manifests do not use, most of the InferenceService
CRD's size: the same PodSpec repeated for the canary list, the explainer, the transformer, every
framework-specific predictor) replaced by ``{"x-vendor-trimmed": true}``. Everything else stays
as KServe wrote it: every field, type, enum, pattern, required list and ``x-kubernetes-*`` marker.
The output is sorted, indented JSON, so a new release shows up as a readable diff. It also copies the ClusterServingRuntime that the TF Serving
InferenceService names, with the image tag config/runtimes/kustomization.yaml gives it.
"""

import json
import sys
from pathlib import Path

import yaml

HERE = Path(__file__).resolve().parent
CRDS = {
    "inferenceservice-v1beta1.json": ("config/crd/full/serving.kserve.io_inferenceservices.yaml", "v1beta1"),
    "clusterservingruntime-v1alpha1.json": ("config/crd/full/serving.kserve.io_clusterservingruntimes.yaml", "v1alpha1"),
}
RUNTIME = "config/runtimes/kserve-tensorflow-serving.yaml"
#: What the tests turn into "trimmed from the vendored schema" errors: a manifest that starts using
#: one of these needs this script run again with the path taken out of the list.
FRAMEWORKS = ["huggingface", "lightgbm", "onnx", "paddle", "pmml", "pytorch", "sklearn", "tensorflow", "triton", "xgboost"]
TRIMMED = {
    "inferenceservice-v1beta1.json": [
        "status", "spec.canary", "spec.explainer", "spec.transformer",
        *(f"spec.predictor.{name}" for name in FRAMEWORKS + ["workerSpec", "initContainers", "affinity"]),
    ],
    "clusterservingruntime-v1alpha1.json": ["status", "spec.workerSpec", "spec.affinity", "spec.volumes"],
}
MARKER = {"x-vendor-trimmed": True}


def strip_descriptions(node):
    if isinstance(node, dict):
        return {k: strip_descriptions(v) for k, v in node.items() if not (k == "description" and isinstance(v, str))}
    if isinstance(node, list):
        return [strip_descriptions(v) for v in node]
    return node


def trim(schema, dotted):
    node, parts = schema, dotted.split(".")
    for part in parts[:-1]:
        node = node["properties"][part]
    assert parts[-1] in node["properties"], dotted
    node["properties"][parts[-1]] = dict(MARKER)


def main(checkout):
    checkout = Path(checkout)
    for out, (path, version) in CRDS.items():
        crd = yaml.safe_load((checkout / path).read_text())
        served = next(v for v in crd["spec"]["versions"] if v["name"] == version)
        schema = strip_descriptions(served["schema"]["openAPIV3Schema"])
        for dotted in TRIMMED[out]:
            trim(schema, dotted)
        (HERE / out).write_text(json.dumps(schema, indent=1, sort_keys=True) + "\n")
    runtime = yaml.safe_load((checkout / RUNTIME).read_text())
    images = yaml.safe_load((checkout / "config/runtimes/kustomization.yaml").read_text())["images"]
    image = next(i for i in images if i["name"] == "tensorflow-serving")
    container = runtime["spec"]["containers"][0]
    assert container["image"] == "tensorflow-serving:replace", container["image"]
    container["image"] = f"{image['newName']}:{image['newTag']}"
    header = f"# {RUNTIME} of kserve/kserve, image from config/runtimes/kustomization.yaml (see README.md)\n"
    (HERE / "kserve-tensorflow-serving.yaml").write_text(header + yaml.safe_dump(runtime, sort_keys=False))


if __name__ == "__main__":
    main(sys.argv[1])
