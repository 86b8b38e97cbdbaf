"""The project's build files as the deployment tests read them: the Dockerfiles' stages, instructions and
environment, compose.yaml, and the version in pyproject.toml. Shared by tests/deploy/test_k8s.py and test_kserve.py."""

import tomllib
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]


def dockerfile_stages(path):
    """[(stage name, [instruction dict, ...]), ...] as dockerfile-parse reads ``path``."""
    from dockerfile_parse import DockerfileParser

    stages = []
    for item in DockerfileParser(str(path)).structure:
        if item["instruction"] == "FROM":
            stages.append((item["value"].split()[-1], []))
        elif stages and item["instruction"] != "COMMENT":
            stages[-1][1].append(item)
    return stages


def final_stage(path):
    return dockerfile_stages(path)[-1][1]


def instruction(stage, name):
    values = [item["value"] for item in stage if item["instruction"] == name]
    assert len(values) == 1, f"{len(values)} {name} instructions"
    return values[0]


def dockerfile_env(path):
    from dockerfile_parse import DockerfileParser

    return DockerfileParser(str(path)).envs


def compose():
    return yaml.safe_load((ROOT / "compose.yaml").read_text())


def project_version():
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]


def split_image(image):
    name, _, tag = image.rpartition(":")
    return name, tag
