"""The lock files (requirements/*.txt) agree with pyproject.toml, and every install goes through them."""

import os
import re

import pytest
from packaging.markers import default_environment
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

from scripts import lock

REPO = lock.REPO

PROJECT = canonicalize_name("cifar-tpu-pipeline")
# Where the locks are meant to install (scripts/lock.py): CPython 3.11 on Linux x86_64.
LOCKED_ENVIRONMENT = {**default_environment(), "python_version": "3.11", "python_full_version": "3.11.7",
                      "implementation_name": "cpython", "platform_python_implementation": "CPython",
                      "sys_platform": "linux", "platform_system": "Linux", "os_name": "posix",
                      "platform_machine": "x86_64"}
PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==([^\s\\;]+)")


def _read(name):
    with open(lock.lock_path(name)) as f:
        return f.read()


def _pins(text):
    """{canonical name: Version} of a lock file, and the names that carry no --hash."""
    pins, unhashed, current = {}, [], None
    for line in text.splitlines():
        match = PIN.match(line)
        if match:
            current = canonicalize_name(match.group(1))
            assert current not in pins, f"{current} is pinned twice"
            pins[current] = Version(match.group(2))
            unhashed.append(current)
        elif current and line.strip().startswith("--hash=sha256:") and current in unhashed:
            unhashed.remove(current)
    return pins, unhashed


def _requirements(data, name):
    """Every requirement the lock ``name`` must satisfy: the base, the extra with the extras it names, the build backend."""
    optional = data["project"].get("optional-dependencies", {})
    wanted, seen, stack = [], set(), [] if name == lock.BASE else [name]
    for text in data["project"].get("dependencies", []) + data["build-system"]["requires"]:
        wanted.append(Requirement(text))
    while stack:
        extra = stack.pop()
        if extra in seen:
            continue
        seen.add(extra)
        for text in optional[extra]:
            req = Requirement(text)
            if canonicalize_name(req.name) == PROJECT:
                stack.extend(req.extras)
            else:
                wanted.append(req)
    return wanted


DATA = lock.pyproject()
NAMES = lock.lock_names(DATA)


def test_there_is_one_lock_per_extra_and_one_for_the_base_install():
    present = sorted(f[:-4] for f in os.listdir(lock.LOCK_DIR) if f.endswith(".txt"))
    assert present == sorted(NAMES)


@pytest.mark.parametrize("name", NAMES)
def test_the_lock_was_made_from_the_dependencies_pyproject_declares_now(name):
    first = _read(name).splitlines()[0]
    assert first == lock.DIGEST_PREFIX + lock.dependency_digest(DATA), (
        f"requirements/{name}.txt is stale: pyproject.toml's dependencies changed since it was made; "
        "run `python scripts/lock.py` (docs/training.md: 'Installs and the lock')"
    )


@pytest.mark.parametrize("name", NAMES)
def test_every_requirement_is_satisfied_by_an_exact_pin_with_hashes(name):
    pins, unhashed = _pins(_read(name))
    assert pins, "no pins read"
    assert not unhashed, f"pins without hashes (pip --require-hashes refuses them): {unhashed}"
    for req in _requirements(DATA, name):
        if req.marker is not None and not req.marker.evaluate(LOCKED_ENVIRONMENT):
            continue
        key = canonicalize_name(req.name)
        assert key in pins, f"{req} is not in requirements/{name}.txt"
        assert req.specifier.contains(pins[key], prereleases=True), f"{key}=={pins[key]} does not satisfy {req}"
    assert PROJECT not in pins, "the project itself is installed from the work tree, not the lock"


def test_a_package_has_one_version_in_every_lock():
    versions = {}
    for name in NAMES:
        for key, version in _pins(_read(name))[0].items():
            versions.setdefault(key, {}).setdefault(version, []).append(name)
    split = {key: found for key, found in versions.items() if len(found) > 1}
    assert not split, split


def test_no_lock_pulls_in_torch():
    for name in NAMES:
        pins = _pins(_read(name))[0]
        assert "torch" not in pins, f"requirements/{name}.txt pulls in torch"


def test_the_digest_sees_a_changed_requirement():
    changed = {**DATA, "project": {**DATA["project"], "dependencies": DATA["project"]["dependencies"] + ["six"]}}
    assert lock.dependency_digest(changed) != lock.dependency_digest(DATA)
    # Formatting, comments and other tables do not count.
    assert lock.dependency_digest({**DATA, "tool": {}}) == lock.dependency_digest(DATA)


@pytest.mark.parametrize("path, lock_file", [
    ("scripts/test.sh", "requirements/test.txt"),
    ("scripts/main.sh", "requirements/all.txt"),
    ("Dockerfile", "requirements/serve.txt"),
    ("deploy/k8s/train.Dockerfile", "requirements/${extra}.txt"),  # each extra of EXTRAS
    ("scripts/accelerator_check.sh", "requirements/scripts/accelerator.txt"),
])
def test_every_install_goes_through_the_lock(path, lock_file):
    with open(os.path.join(REPO, path)) as f:
        text = f.read()
    assert "--require-hashes" in text and lock_file in text, f"{path} does not install from {lock_file}"
    # The project itself goes in afterwards, with nothing resolved beside the lock.
    installs = [line for line in text.splitlines() if re.search(r"pip install", line) and not line.lstrip().startswith("#")]
    for line in installs:
        assert "--require-hashes" in line or "--no-deps" in line, f"{path}: an install outside the lock: {line.strip()}"
