"""Every command in the docs and the records that names a bench module or script names one that exists: at HEAD; or,
quoted with the commit it ran at (``code of `COMMIT```) or as ``COMMIT:PATH`` (``git show``'s form), at that commit."""

import importlib.util
import os
import re
import subprocess

import pytest

from bench import record

DOCS = ["README.md", "serve/README.md", "bench/README.md", "bench/records/README.md",
        *(os.path.join("docs", n) for n in sorted(os.listdir(os.path.join(record.ROOT, "docs"))) if n.endswith(".md"))]
MODULE = re.compile(r"python3? -m (bench(?:\.[a-z_0-9]+)*)(?![.\w])")  # not a placeholder: bench.SUBJECT.NAME
SCRIPT = re.compile(r"(?<![\w/.:-])(bench/[\w/.-]+\.(?:py|sh|lua|txt))")
COMMIT = re.compile(r"code of `([0-9a-f]{7,40})(?:-dirty)?`")  # dirty: the commit its changes were made on
AT_COMMIT = re.compile(r"\b([0-9a-f]{7,40}):(bench/[\w/.-]+\.(?:py|sh))")


def git(*args):
    return subprocess.run(["git", *args], cwd=record.ROOT, capture_output=True, text=True)


def existed(path, commit):
    return git("cat-file", "-e", f"{commit}:{path}").returncode == 0


def module_files(name):
    """The files ``python -m name`` may run, relative to the repository root: ``NAME.py`` or ``NAME/__main__.py``."""
    base = os.path.join(*name.split("."))
    return [base + ".py", os.path.join(base, "__main__.py")]


def mentions(text):
    """``(line, paths)`` of every bench module or script a text names, ``paths`` the files it may be."""
    for line in text.splitlines():
        for name in MODULE.findall(line):
            yield line, module_files(name)
        for path in SCRIPT.findall(line):
            yield line, [path.rstrip(".")]


def missing(text):
    """What ``text`` names that exists neither at HEAD nor at the commit its line quotes."""
    out = [f"{commit}:{path}" for commit, path in AT_COMMIT.findall(text) if not existed(path, commit)]
    for line, paths in mentions(text):
        if any(os.path.isfile(os.path.join(record.ROOT, path)) for path in paths):
            continue
        commit = COMMIT.search(line)
        if commit is None or not any(existed(path, commit.group(1)) for path in paths):
            out.append(paths[-1])
    return out


@pytest.fixture(scope="module", autouse=True)
def full_history():
    if git("rev-parse", "--is-shallow-repository").stdout.strip() == "true":
        pytest.skip("a shallow clone: the commits the docs quote are not here")


@pytest.mark.parametrize("path", DOCS)
def test_the_docs_name_only_bench_code_that_exists(path):
    with open(os.path.join(record.ROOT, path)) as f:
        assert missing(f.read()) == []


def test_every_records_command_names_code_that_exists_or_existed_at_its_commit():
    wrong = {name: missing(f"{rec['command']} code of `{rec['commit'].removesuffix('-dirty')}`")
             for name, rec in record.load_all().items()}
    assert {name: paths for name, paths in wrong.items() if paths} == {}


def test_the_check_itself_catches_a_module_that_is_gone():
    assert missing("python -m bench.serving.nothing_here --json x") == ["bench/serving/nothing_here/__main__.py"]
    assert missing("python bench/jpeg_draft.py --repeats 10") == ["bench/jpeg_draft.py"]
    assert missing("python bench/jpeg_draft.py; code of `f44b73d`") == []  # it was there when it ran
    assert missing("python -m bench.research.ood_uploads --run R; code of `d796333`") == []  # a module file since deleted
    assert missing("python -m bench.research.ood_uploads --run R") == ["bench/research/ood_uploads/__main__.py"]
    assert missing("python -m bench.research.ood_uploads --run R; code of `d796333-dirty`") == []
    assert missing("git show f196439:bench/multiprocess_keras_repro.py") == []
    assert missing("git show f196439:bench/never_was.py") == ["f196439:bench/never_was.py"]
    assert missing("python -m bench.peers --only this") == []
    assert importlib.util.find_spec("bench.serving.speed") is not None
