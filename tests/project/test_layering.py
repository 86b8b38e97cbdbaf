"""The stages import one another in one direction only: contract <- train <- export; contract <- serve;
tfs_protos <- export (TF Serving's warmup records), serve, client; nothing imports bench/ or tests/. Read from the sources with ``ast``."""

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
OURS = ("contract", "tfs_protos", "train", "export", "serve", "client", "bench", "tests")
#: What each shipped package may import of ours, itself included.
ALLOWED = {
    "contract": {"contract"},
    "tfs_protos": {"tfs_protos"},
    "train": {"contract", "train"},
    "export": {"contract", "tfs_protos", "train", "export"},
    "serve": {"contract", "tfs_protos", "serve"},
    "client": {"contract", "tfs_protos", "client"},
}


def imported_packages(path):
    """The top-level packages of ours that ``path`` imports, anywhere in the file (function bodies too)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module]
        else:
            continue
        found.update(name.split(".")[0] for name in names if name.split(".")[0] in OURS)
    return found


def test_each_package_imports_only_what_its_layer_allows():
    wrong = {}
    for package, allowed in ALLOWED.items():
        for path in sorted((ROOT / package).rglob("*.py")):
            extra = imported_packages(path) - allowed
            if extra:
                wrong[str(path.relative_to(ROOT))] = sorted(extra)
    assert not wrong, f"imports against the layering: {wrong}"


def test_the_scan_sees_imports_inside_functions():
    """export imports train's builder inside functions: the scan must find it, or it proves nothing."""
    assert "train" in imported_packages(ROOT / "export" / "verify.py")
    assert "tfs_protos" in imported_packages(ROOT / "serve" / "backends" / "tfserving.py")


#: Inside serve: the protocols (codecs) over the core over the backends; HTTP and gRPC around the protocols; telemetry
#: under all. What each folder may not import.
SERVE_FORBIDDEN = {
    "serve/protocols": ("serve.backends", "serve.core.decode", "serve.core.tensors", "serve.core.admission",
                        "limits"),
    "serve/core": ("flask", "werkzeug", "grpc", "serve.protocols", "serve.backends", "serve.http", "serve.grpc",
                   "serve.settings"),
    "serve/backends": ("flask", "werkzeug", "serve.protocols", "serve.core.service", "serve.http", "serve.grpc"),
    "serve/http": ("serve.protocols", "serve.backends", "serve.grpc", "serve.core.service"),
    "serve/grpc": ("flask", "werkzeug", "serve.http", "serve.backends"),
    "serve/telemetry": ("serve.core", "serve.protocols", "serve.backends", "serve.http", "serve.grpc"),
}


def imported_modules(path):
    """Every module ``path`` imports (``from a.b import c`` counts as ``a.b`` and ``a.b.c``)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.add(node.module)
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
    return found


def test_serve_layers_protocols_over_core_over_backends():
    """No protocol reaches past the core (to a backend, a runtime, the batcher, the decoder or the gate); the core knows
    no Flask and no gRPC; the transports know no backend; telemetry knows none of the layers it serves."""
    wrong = {}
    for folder, forbidden in SERVE_FORBIDDEN.items():
        for path in sorted((ROOT / folder).rglob("*.py")):
            bad = sorted(m for m in imported_modules(path) if m.startswith(forbidden))
            if bad:
                wrong[str(path.relative_to(ROOT))] = bad
    assert not wrong, f"imports against serve's layers: {wrong}"


def test_the_serve_scan_sees_what_it_forbids():
    """The scan finds the decoder in the core and the batcher in a loaded version, or it proves nothing."""
    assert "serve.core.decode" in imported_modules(ROOT / "serve" / "core" / "service.py")
    assert "serve.backends.batcher" in imported_modules(ROOT / "serve" / "backends" / "version.py")


def serve_modules():
    """``{module name: path}`` of every module of serve/ (a package as its ``__init__``)."""
    modules = {}
    for path in sorted((ROOT / "serve").rglob("*.py")):
        parts = path.relative_to(ROOT).with_suffix("").parts
        modules[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return modules


def import_graph(modules):
    """``{module: {modules of serve it imports}}``, function bodies included: ``from a import b`` is the module ``a.b``
    when that is one, else ``a``. A module's own packages are left out: importing it runs them first, whoever imports it."""
    graph = {}
    for name, path in modules.items():
        targets = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [f"{node.module}.{alias.name}" if f"{node.module}.{alias.name}" in modules else node.module
                         for alias in node.names]
            else:
                continue
            for imported in names:
                while imported and imported not in modules:
                    imported = imported.rpartition(".")[0]
                if imported and imported != name and not name.startswith(imported + "."):
                    targets.add(imported)
        graph[name] = targets
    return graph


def cycles(graph):
    """Every strongly connected group of more than one module (Tarjan's algorithm), each sorted."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(node):
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in graph[node]:
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            group = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                group.append(member)
                if member == node:
                    break
            if len(group) > 1:
                found.append(sorted(group))

    for node in graph:
        if node not in index:
            visit(node)
    return found


def test_serve_has_no_import_cycle():
    """Reading serve's imports as a graph (imports inside functions included), no module reaches itself."""
    assert cycles(import_graph(serve_modules())) == []


def test_the_cycle_finder_finds_one():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_no_test_module_imports_another():
    """Tests share helpers through tests/support/, never by importing one another's test modules."""
    wrong = {}
    for path in sorted((ROOT / "tests").rglob("test_*.py")):
        imported = {name.split(".")[-1] for name in imported_modules(path)}
        if any(name.startswith("test_") for name in imported):
            wrong[str(path.relative_to(ROOT))] = sorted(n for n in imported if n.startswith("test_"))
    assert not wrong, wrong


def test_the_tests_are_arranged_by_stage():
    stages = {"train", "export", "serve", "client", "deploy", "bench", "project"}
    flat = sorted(p.name for p in (ROOT / "tests").glob("test_*.py"))
    assert not flat, f"tests outside a stage folder: {flat}"
    assert {p.relative_to(ROOT / "tests").parts[0] for p in (ROOT / "tests").rglob("test_*.py")} <= stages
    # Within serve, the tests mirror the code: each folder of tests/serve/ is a package of serve/.
    folders = {p.parent.relative_to(ROOT / "tests" / "serve") for p in (ROOT / "tests" / "serve").rglob("test_*.py")}
    assert all((ROOT / "serve" / folder / "__init__.py").is_file() for folder in folders), sorted(map(str, folders))
