"""The server's environment variables are read in one place (serve.settings) and listed once, in
serve/README.md, and that list is complete."""

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "serve" / "README.md"
#: The one module that reads the server's environment.
READER = "serve/settings.py"


def variables_read(path):
    """Names read through ``env.get("X")``, ``os.environ.get("X")``, ``os.environ["X"]`` or ``"X" in os.environ``."""
    names = set()
    for node in ast.walk(ast.parse((ROOT / path).read_text())):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "get" and node.args:
            key = node.args[0]
        elif isinstance(node, ast.Subscript):
            key = node.slice
        elif isinstance(node, ast.Compare) and isinstance(node.ops[0], (ast.In, ast.NotIn)):
            key = node.left
        else:
            continue
        if isinstance(key, ast.Constant) and isinstance(key.value, str) and re.fullmatch(r"[A-Z][A-Z0-9_]+", key.value):
            names.add(key.value)
    return names


def variables_listed(text=None):
    """The upper-case names in the first cell of the table rows of ``text`` (serve/README.md's by default)."""
    names = set()
    for line in (README.read_text() if text is None else text).splitlines():
        if line.startswith("| `"):
            first_cell = line.split("|")[1]
            names.update(n for n in re.findall(r"`([^`]+)`", first_cell) if re.fullmatch(r"[A-Z][A-Z0-9_]+", n))
    return names


def _is_environ(node):
    return isinstance(node, ast.Attribute) and node.attr == "environ" and isinstance(node.value, ast.Name) and node.value.id == "os"


def environment_reads(path):
    """Names read from ``os.environ`` (``.get``, ``[...]``, ``in``) or ``os.getenv`` in ``path``; writes are not reads."""
    names = set()
    for node in ast.walk(ast.parse((ROOT / path).read_text())):
        key = None
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.args:
            if (node.func.attr == "get" and _is_environ(node.func.value)) or (
                node.func.attr == "getenv" and isinstance(node.func.value, ast.Name) and node.func.value.id == "os"
            ):
                key = node.args[0]
        elif isinstance(node, ast.Subscript) and _is_environ(node.value) and isinstance(node.ctx, ast.Load):
            key = node.slice
        elif isinstance(node, ast.Compare) and any(_is_environ(c) for c in node.comparators):
            key = node.left
        if isinstance(key, ast.Constant) and isinstance(key.value, str):
            names.add(key.value)
    return names


def test_only_the_settings_module_reads_the_environment():
    readers = {
        str(path.relative_to(ROOT)): environment_reads(path.relative_to(ROOT))
        for path in (ROOT / "serve").rglob("*.py")
        if str(path.relative_to(ROOT)) != READER
    }
    assert not {path: names for path, names in readers.items() if names}, "read these through serve.settings.Settings"
    assert environment_reads(READER) == set(), "serve.settings reads through its table of fields, not by name"


def test_every_variable_the_server_reads_is_listed_in_serve_readme():
    from serve.settings import Settings

    read = set(Settings.variables())
    assert {"MODEL_NAME", "SERVE_BACKEND", "SERVE_API_KEYS", "WEB_CONCURRENCY"} <= read
    missing = read - variables_listed()
    assert not missing, f"serve/README.md's configuration tables lack {sorted(missing)}"


def test_every_listed_variable_is_read_by_the_server():
    sources = "\n".join(path.read_text() for path in (ROOT / "serve").rglob("*.py"))
    unread = {name for name in variables_listed() if f'"{name}"' not in sources and f"'{name}'" not in sources}
    assert not unread, f"serve/README.md lists {sorted(unread)}, which nothing in serve/ reads"


def test_the_other_pages_link_to_the_list_instead_of_repeating_it():
    deploy = (ROOT / "docs" / "deploy.md").read_text()
    assert "serve/README.md#configuration-environment-variables" in deploy
    assert not variables_listed(deploy), "docs/deploy.md has a table of variables again; link to serve/README.md"
    settings_doc = ast.get_docstring(ast.parse((ROOT / "serve" / "settings.py").read_text()))
    assert "serve/README.md" in settings_doc
    assert not re.search(r"``[A-Z][A-Z0-9_]+``", settings_doc), "serve/settings.py's docstring lists variables again"
