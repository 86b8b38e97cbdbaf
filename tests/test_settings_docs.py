"""The server's environment variables are listed once, in serve/README.md, and that list is complete."""

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "serve" / "README.md"
#: The modules that read the server's environment: the Flask settings and gunicorn's configuration.
READERS = ("serve/settings.py", "serve/gunicorn_conf.py")


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


def test_every_variable_the_server_reads_is_listed_in_serve_readme():
    read = set().union(*(variables_read(path) for path in READERS))
    assert {"MODEL_NAME", "SERVE_BACKEND", "SERVE_API_KEYS", "WEB_CONCURRENCY"} <= read  # the scan finds them
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
