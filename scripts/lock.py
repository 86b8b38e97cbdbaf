"""Write the lock files: requirements/EXTRA.txt for every extra in pyproject.toml, exact pins with hashes.

    .venv/bin/python scripts/lock.py        # after any change to pyproject.toml's dependencies
    .venv/bin/python scripts/lock.py --upgrade-package gunicorn   # move one package, keep the rest

uv is not a dependency of the project: scripts/test.sh installs it into .venv from
requirements/scripts/uv.txt (elsewhere: ``pip install --require-hashes -r requirements/scripts/uv.txt``).

The locks are for CPython 3.11 on Linux x86_64 (glibc 2.31 or newer): this project's machines, CI
and the serving image (python:3.11-slim-bookworm). ``requirements/test.txt`` (the ``test`` extra,
which holds every other extra but ``tpu`` and ``gpu``) is resolved first and constrains every other
file, so a package has the same version in every lock. The build backend (``[build-system]
requires``) is locked into each file too, so ``pip install --no-build-isolation --no-deps -e .``
after the lock downloads nothing unpinned. Each file starts with a digest of pyproject.toml's
dependency tables; tests/project/test_lock.py fails when it is stale or when a pin does not satisfy a
requirement.

Two installs need more than an extra, and their locks live in ``requirements/scripts/`` (made last,
constrained by the same files): ``accelerator.txt``, scripts/accelerator_check.sh's environment (the
``gpu`` and ``export`` extras and TensorFlow's own CUDA libraries, ``tensorflow[and-cuda]`` at
pyproject.toml's TensorFlow pin), and ``uv.txt``, the installer scripts/test.sh uses (UV_VERSION).
"""

import hashlib
import json
import os
import re
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
SCRIPTS_DIR = os.path.join(LOCK_DIR, "scripts")
UV_VERSION = "0.13.9"  # scripts/test.sh installs the lock with it; moved here by hand, on purpose


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


def script_locks(data):
    """{path: (extras, inputs)} of the locks in SCRIPTS_DIR; inputs are requirement lines beside the extras."""
    pins = [r for r in data["project"]["optional-dependencies"]["train"] if re.match(r"tensorflow\s*==", r)]
    assert len(pins) == 1, f"the train extra has no single tensorflow==VERSION pin: {pins}"
    return {
        os.path.join(SCRIPTS_DIR, "accelerator.txt"): (["gpu", "export"], [pins[0].replace("tensorflow", "tensorflow[and-cuda]", 1)]),
        os.path.join(SCRIPTS_DIR, "uv.txt"): (None, [f"uv=={UV_VERSION}"]),  # None: not the project, uv alone
    }


def compile_one(out, data, inputs, extras, constraints, extra_args, labels):
    """Lock ``inputs`` (files) and, unless ``extras`` is None, pyproject.toml with ``extras`` into ``out``."""
    cmd = [sys.executable, "-m", "uv", "pip", "compile", *([] if extras is None else ["pyproject.toml"]), *inputs,
           "--python-version", PYTHON_VERSION, "--python-platform", PLATFORM, "--generate-hashes",
           "--custom-compile-command", "python scripts/lock.py", "--quiet", "-o", out, *extra_args]
    for extra in extras or []:
        cmd += ["--extra", extra]
    for path in constraints:
        cmd += ["-c", os.path.relpath(path, REPO)]
    subprocess.run(cmd, cwd=REPO, check=True)
    with open(out) as f:
        text = f.read()
    # The temporary files' paths would change on every run; name what they hold instead.
    for path, label in labels.items():
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
        labels = {build_in: "[build-system] requires", constraints: "scripts/lock.py CONSTRAINTS"}
        for name in [FIRST] + [n for n in names if n != FIRST]:
            print(f"locking {lock_path(name)}", file=sys.stderr)
            compile_one(lock_path(name), data, [build_in], [] if name == BASE else [name], [constraints] +
                        ([] if name == FIRST else [lock_path(FIRST)]), argv, labels)
        os.makedirs(SCRIPTS_DIR, exist_ok=True)
        for out, (extras, lines) in script_locks(data).items():
            print(f"locking {out}", file=sys.stderr)
            inputs = os.path.join(tmp, os.path.basename(out)[:-4] + ".in")
            with open(inputs, "w") as f:
                f.write("\n".join(lines) + "\n")
            if extras is not None:
                # The same versions as every other lock: the test lock's, then the extras' own.
                compile_one(out, data, [build_in, inputs], extras, [constraints, lock_path(FIRST)] +
                            [lock_path(e) for e in extras], argv, {**labels, inputs: "scripts/lock.py script_locks"})
            else:
                compile_one(out, data, [inputs], None, [], argv, {inputs: "scripts/lock.py script_locks"})
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
