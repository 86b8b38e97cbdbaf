"""Write the lock files: requirements/EXTRA.txt for every extra in pyproject.toml, exact pins with hashes.

    .venv/bin/python -m pip install uv      # once; uv is not a dependency of the project
    .venv/bin/python scripts/lock.py        # after any change to pyproject.toml's dependencies
    .venv/bin/python scripts/lock.py --upgrade-package gunicorn   # move one package, keep the rest

The locks are for CPython 3.11 on Linux x86_64 (glibc 2.31 or newer): this project's machines, CI
and the serving image (python:3.11-slim-bookworm). ``requirements/test.txt`` (the ``test`` extra,
which holds every other extra but ``tpu`` and ``gpu``) is resolved first and constrains every other
file, so a package has the same version in every lock. The build backend (``[build-system]
requires``) is locked into each file too, so ``pip install --no-build-isolation --no-deps -e .``
after the lock downloads nothing unpinned. Each file starts with a digest of pyproject.toml's
dependency tables; tests/test_lock.py fails when it is stale or when a pin does not satisfy a
requirement.
"""

import hashlib
import json
import os
import subprocess
import sys
import tempfile

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LOCK_DIR = os.path.join(REPO, "requirements")
PYTHON_VERSION = "3.11"
PLATFORM = "x86_64-manylinux_2_31"  # libtpu ships manylinux_2_31 wheels only
BASE = "client"  # the file for the install without extras (the client)
FIRST = "test"  # resolved first; constrains every other file
DIGEST_PREFIX = "# pyproject.toml dependencies sha256: "
# uv ignores upper bounds in a package's Requires-Python (pip does not): releases that would resolve
# but that pip refuses on Python 3.11 are kept out here.
CONSTRAINTS = [
    "backports-strenum<1.3",  # for ai-edge-litert; 1.3.x declares Requires-Python <3.11
]


def pyproject(path=os.path.join(REPO, "pyproject.toml")):
    with open(path, "rb") as f:
        return tomllib.load(f)


def dependency_tables(data):
    """What the locks are made from: every requirement pyproject.toml declares, build backend included."""
    project = data["project"]
    return {
        "requires-python": project.get("requires-python"),
        "dependencies": project.get("dependencies", []),
        "optional-dependencies": project.get("optional-dependencies", {}),
        "build-system": data.get("build-system", {}).get("requires", []),
    }


def dependency_digest(data):
    text = json.dumps(dependency_tables(data), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()


def lock_names(data):
    """The lock files' names: BASE (no extra) and one per extra."""
    return [BASE, *data["project"].get("optional-dependencies", {})]


def lock_path(name):
    return os.path.join(LOCK_DIR, f"{name}.txt")


def compile_one(name, data, build_in, constraints, extra_args):
    out = lock_path(name)
    cmd = [sys.executable, "-m", "uv", "pip", "compile", "pyproject.toml", build_in,
           "--python-version", PYTHON_VERSION, "--python-platform", PLATFORM, "--generate-hashes",
           "--custom-compile-command", "python scripts/lock.py", "--quiet", "-c", constraints, "-o", out, *extra_args]
    if name != BASE:
        cmd += ["--extra", name]
    if name != FIRST:
        cmd += ["-c", os.path.relpath(lock_path(FIRST), REPO)]
    subprocess.run(cmd, cwd=REPO, check=True)
    with open(out) as f:
        text = f.read()
    # The temporary file's path would change on every run; name what it holds instead.
    for path, label in ((build_in, "[build-system] requires"), (constraints, "scripts/lock.py CONSTRAINTS")):
        text = text.replace(os.path.relpath(path, REPO), label).replace(path, label)
    with open(out, "w") as f:
        f.write(f"{DIGEST_PREFIX}{dependency_digest(data)}\n{text}")


def main(argv):
    data = pyproject()
    os.makedirs(LOCK_DIR, exist_ok=True)
    names = lock_names(data)
    with tempfile.TemporaryDirectory() as tmp:
        build_in = os.path.join(tmp, "build-system.in")
        with open(build_in, "w") as f:
            f.write("\n".join(data["build-system"]["requires"]) + "\n")
        constraints = os.path.join(tmp, "python-3.11.txt")
        with open(constraints, "w") as f:
            f.write("\n".join(CONSTRAINTS) + "\n")
        for name in [FIRST] + [n for n in names if n != FIRST]:
            print(f"locking {lock_path(name)}", file=sys.stderr)
            compile_one(name, data, build_in, constraints, argv)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
