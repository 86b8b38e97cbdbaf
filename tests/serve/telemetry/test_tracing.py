"""OpenTelemetry traces (serve/telemetry/tracing.py): a span per request on every protocol, child spans for the stages with
the right parents, the caller's ``traceparent`` honoured and passed on to TF Serving, nothing when off, and
``OTEL_TRACES_EXPORTER=console`` printing the spans of one request from a real server."""

import base64
import json
import threading

import grpc
import numpy as np
import pytest
import requests
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind

import contract
import synthetic
from batching import Gate, count_queued
from live_server import free_port, start_server, stop_server
from tfs_protos import tensors
from tfs_protos.tensorflow_serving.apis import predict_pb2, prediction_service_pb2_grpc
from tfserving_standin import tfserving  # noqa: F401  (imported for its fixture)

DEADLINE_S = 60
TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT_ID = "00f067aa0ba902b7"
TRACEPARENT = f"00-{TRACE_ID}-{PARENT_ID}-01"


@pytest.fixture(scope="module")
def memory():
    """A provider that keeps every span in memory, as it ends."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return provider, exporter


@pytest.fixture()
def spans(memory):
    """The spans ended during the test."""
    memory[1].clear()
    return memory[1].get_finished_spans


def _app(model_base, memory, **config):
    from serve import create_app

    app = create_app({"TESTING": True, "MODEL_DIR": str(model_base), "MODEL_NAME": "cifar10", **config},
                     tracer_provider=memory[0])
    if app.extensions["serve.backend"].kind == "local":
        app.extensions["serve.backend"].wait_loaded()
    return app


@pytest.fixture(scope="module")
def traced(model_base, memory):
    app = _app(model_base, memory, TRACES_EXPORTER="console")  # the test's provider replaces the console's
    yield app
    app.extensions["serve.backend"].close()


@pytest.fixture(scope="module")
def untraced(model_base, memory):
    app = _app(model_base, memory)  # OTEL_TRACES_EXPORTER unset: the provider is never used
    yield app
    app.extensions["serve.backend"].close()


def _grpc_target(app):
    from serve.grpc import server as grpc_server

    server, port = grpc_server.make_server(app, "127.0.0.1:0", threads=4, reuse_port=False)
    server.start()
    return server, f"127.0.0.1:{port}"


def _png():
    return synthetic.encode(synthetic.make_images(1)[0][0])


def _b64():
    return base64.b64encode(_png()).decode()


#: route: (path, body, the request span's name: the method and the route's rule, never the raw path)
ROUTES = {
    "api": ("/api/v1/predict", lambda: {"instances": [{"b64": _b64()}]}, "POST /api/v1/predict"),
    "tfserving-rest": ("/v1/models/cifar10:predict",
                       lambda: {"signature_name": contract.SIGNATURE_BYTES, "instances": [{"b64": _b64()}]},
                       "POST /v1/models/<model:name>:predict"),
    "v2": ("/v2/models/cifar10/infer", lambda: {"inputs": [{"name": contract.INPUT_BYTES, "datatype": "BYTES", "shape": [1],
                                                            "parameters": {"content_type": "base64"}, "data": [_b64()]}]},
           "POST /v2/models/<name>/infer"),
}


def _named(found, name):
    matching = [span for span in found if span.name == name]
    assert len(matching) == 1, f"{name}: {[span.name for span in found]}"
    return matching[0]


def _hex(number, digits):
    return format(number, f"0{digits}x")


@pytest.mark.end_to_end
@pytest.mark.parametrize("route", ROUTES)
def test_an_http_request_is_a_span_with_a_child_for_each_stage(traced, spans, route):
    path, body, span_name = ROUTES[route]
    answer = traced.test_client().post(path, json=body(), headers={"traceparent": TRACEPARENT, "X-Request-Id": f"t-{route}"})
    assert answer.status_code == 200, answer.get_data(as_text=True)[:300]
    found = spans()
    request = _named(found, span_name)
    assert request.kind == SpanKind.SERVER
    assert request.attributes["serve.request_id"] == f"t-{route}" == answer.headers["X-Request-Id"]
    # The caller's traceparent: its trace, and its span as the parent.
    assert _hex(request.context.trace_id, 32) == TRACE_ID and _hex(request.parent.span_id, 16) == PARENT_ID
    assert request.parent.is_remote
    for stage in ("serve.decode", "serve.model"):
        child = _named(found, stage)
        assert child.parent.span_id == request.context.span_id and child.context.trace_id == request.context.trace_id
    assert _named(found, "serve.model").attributes["serve.batch.images"] == 1


@pytest.mark.end_to_end
def test_without_a_traceparent_a_request_starts_its_own_trace(traced, spans):
    answer = traced.test_client().post("/api/v1/predict", json=ROUTES["api"][1]())
    assert answer.status_code == 200
    request = _named(spans(), "POST /api/v1/predict")
    assert request.parent is None and _hex(request.context.trace_id, 32) != TRACE_ID


@pytest.mark.end_to_end
def test_probes_and_scrapes_are_not_traced(traced, spans):
    client = traced.test_client()
    assert client.get("/healthz").status_code == 200 and client.get("/metrics").status_code == 200
    assert spans() == ()


@pytest.mark.end_to_end
def test_a_grpc_predict_is_a_span_with_its_stages(traced, spans):
    server, target = _grpc_target(traced)
    try:
        with grpc.insecure_channel(target) as channel:
            request = predict_pb2.PredictRequest()
            request.model_spec.name = "cifar10"
            request.model_spec.signature_name = contract.SIGNATURE_BYTES
            request.inputs[contract.INPUT_BYTES].CopyFrom(tensors.to_proto(np.array([_png(), _png()], dtype=object)))
            _, call = prediction_service_pb2_grpc.PredictionServiceStub(channel).Predict.with_call(
                request, metadata=(("traceparent", TRACEPARENT), ("x-request-id", "grpc-1")), timeout=DEADLINE_S)
    finally:
        server.stop(None).wait()
    assert dict(call.initial_metadata())["x-request-id"] == "grpc-1"
    found = spans()
    rpc = _named(found, "/tensorflow.serving.PredictionService/Predict")
    assert rpc.kind == SpanKind.SERVER and rpc.attributes["serve.request_id"] == "grpc-1"
    assert _hex(rpc.context.trace_id, 32) == TRACE_ID and _hex(rpc.parent.span_id, 16) == PARENT_ID
    for stage in ("serve.decode", "serve.model"):
        assert _named(found, stage).parent.span_id == rpc.context.span_id
    assert _named(found, "serve.decode").attributes["serve.images"] == 2


@pytest.mark.end_to_end
def test_grpc_health_checks_are_not_traced(traced, spans):
    from tfs_protos.grpc_health.v1 import health_pb2, health_pb2_grpc

    server, target = _grpc_target(traced)
    try:
        with grpc.insecure_channel(target) as channel:
            health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=DEADLINE_S)
    finally:
        server.stop(None).wait()
    assert spans() == ()


@pytest.mark.end_to_end
@pytest.mark.parametrize("kind", ["tfserving-rest", "tfserving-grpc"])
def test_the_tfserving_hop_is_a_client_span_whose_context_tf_serving_receives(model_base, memory, spans, tfserving, kind):  # noqa: F811
    app = _app(model_base, memory, BACKEND=kind, TRACES_EXPORTER="otlp", TFSERVING_REST_URL=tfserving.rest_url,
               TFSERVING_GRPC_TARGET=tfserving.grpc_target, TFSERVING_TIMEOUT_S=DEADLINE_S)
    try:
        before = len(tfserving.traceparents)
        answer = app.test_client().post("/api/v1/predict", json=ROUTES["api"][1](), headers={"traceparent": TRACEPARENT})
        assert answer.status_code == 200, answer.get_json()
    finally:
        app.extensions["serve.backend"].close()
    found = spans()
    request = _named(found, "POST /api/v1/predict")
    predict = [(what, given) for protocol, what, given in tfserving.traceparents[before:]
               if what == "Predict" or what.startswith("POST ")]
    assert len(predict) == 1, tfserving.traceparents[before:]
    version, trace_id, parent_id, flags = predict[0][1].split("-")
    assert trace_id == TRACE_ID and flags == "01"
    hop = next(span for span in found if span.context.span_id == int(parent_id, 16))
    assert hop.kind == SpanKind.CLIENT and hop.name == ("tfserving Predict" if kind == "tfserving-grpc" else "tfserving POST")
    assert hop.parent.span_id == request.context.span_id


@pytest.mark.end_to_end
def test_with_traces_off_nothing_is_recorded_or_passed_on(model_base, memory, spans, untraced, tfserving):  # noqa: F811
    client = untraced.test_client()
    for route, (path, body, _) in ROUTES.items():
        assert client.post(path, json=body(), headers={"traceparent": TRACEPARENT}).status_code == 200, route
    server, target = _grpc_target(untraced)
    try:
        with grpc.insecure_channel(target) as channel:
            request = predict_pb2.PredictRequest()
            request.model_spec.name = "cifar10"
            request.inputs[contract.INPUT_PIXELS].CopyFrom(tensors.to_proto(synthetic.make_images(1)[0][:1]))
            prediction_service_pb2_grpc.PredictionServiceStub(channel).Predict(
                request, metadata=(("traceparent", TRACEPARENT),), timeout=DEADLINE_S)
    finally:
        server.stop(None).wait()
    remote = _app(model_base, memory, BACKEND="tfserving-rest", TFSERVING_REST_URL=tfserving.rest_url,
                  TFSERVING_TIMEOUT_S=DEADLINE_S)
    try:
        before = len(tfserving.traceparents)
        assert remote.test_client().post("/api/v1/predict", json=ROUTES["api"][1](),
                                         headers={"traceparent": TRACEPARENT}).status_code == 200
    finally:
        remote.extensions["serve.backend"].close()
    assert spans() == ()
    assert tfserving.traceparents[before:] and all(given is None for _, _, given in tfserving.traceparents[before:])
    assert "serve.tracer_provider" not in untraced.extensions


# -- the batcher: a request that waited, and a batch run for several ------------------------


@pytest.mark.end_to_end
def test_a_queued_request_records_its_wait_and_the_batch_span_names_every_request(traced, memory, spans):
    from serve.backends.batcher import Batcher

    gate = Gate(lambda images: {"echo": images.copy()})  # holds the first call, so the next requests queue behind it
    batcher = Batcher(gate, max_batch=8, max_wait_s=0)
    queued = count_queued(batcher)
    tracer = memory[0].get_tracer("test")
    errors = []

    def client(name):
        try:
            with tracer.start_as_current_span(name):
                batcher.submit(np.zeros((1, 2, 2, 3), np.uint8))
        except Exception as e:  # noqa: BLE001 - asserted below
            errors.append(e)

    first = threading.Thread(target=client, args=("first",))
    first.start()
    assert gate.entered.wait(DEADLINE_S)  # the first runs inline and holds the model...
    others = [threading.Thread(target=client, args=(name,)) for name in ("second", "third")]
    for thread in others:
        thread.start()
    for _ in others:  # ...so these two queue behind it
        assert queued.acquire(timeout=DEADLINE_S), "a request never reached the queue"
    gate.opened.set()
    for thread in [first, *others]:
        thread.join(DEADLINE_S)
    batcher.close()
    assert not errors
    found = spans()
    requests_ = {name: _named(found, name) for name in ("first", "second", "third")}
    waits = [span for span in found if span.name == "serve.batch_wait"]
    assert sorted(w.parent.span_id for w in waits) == sorted(requests_[n].context.span_id for n in ("second", "third"))
    models = [span for span in found if span.name == "serve.model"]
    inline = [m for m in models if m.parent.span_id == requests_["first"].context.span_id]
    assert len(inline) == 1 and inline[0].attributes["serve.batch.requests"] == 1
    # Run on the batcher's thread, each batch is a child of its first request and links to the others:
    # between them they name both queued requests, once each.
    named = []
    for model in models:
        if model is not inline[0]:
            named += [model.parent.span_id] + [link.context.span_id for link in model.links]
            assert model.context.trace_id in {requests_["second"].context.trace_id, requests_["third"].context.trace_id}
    assert sorted(named) == sorted(requests_[n].context.span_id for n in ("second", "third"))


# -- a real server, OTEL_TRACES_EXPORTER=console ----------------------------------------------


def _json_objects(text):
    """The JSON objects written one after another in ``text`` (the console exporter indents each span)."""
    decoder, objects, index = json.JSONDecoder(), [], 0
    while True:
        start = text.find("{", index)
        if start < 0:
            return objects
        try:
            value, index = decoder.raw_decode(text, start)
        except ValueError:
            index = start + 1
            continue
        objects.append(value)


@pytest.mark.end_to_end
def test_console_prints_the_spans_of_one_request_from_a_real_server(model_base, tmp_path):
    out = tmp_path / "stdout.txt"
    grpc_port = free_port()
    grpc_trace = "0af7651916cd43dd8448eb211c80319c"
    with out.open("w") as stdout:
        process, url = start_server(model_base, {"OTEL_TRACES_EXPORTER": "console", "OTEL_SERVICE_NAME": "cifar10-test",
                                                 "WEB_CONCURRENCY": "1"}, args=("--grpc-port", str(grpc_port)), stdout=stdout)
        try:
            answer = requests.post(f"{url}/api/v1/predict", json=ROUTES["api"][1](), timeout=DEADLINE_S,
                                   headers={"traceparent": TRACEPARENT, "X-Request-Id": "console-1"})
            assert answer.status_code == 200
            # The worker's gRPC server, started after the fork, is traced by the same provider.
            with grpc.insecure_channel(f"127.0.0.1:{grpc_port}") as channel:
                request = predict_pb2.PredictRequest()
                request.model_spec.name = "cifar10"
                request.inputs[contract.INPUT_PIXELS].CopyFrom(tensors.to_proto(synthetic.make_images(1)[0][:1]))
                prediction_service_pb2_grpc.PredictionServiceStub(channel).Predict(
                    request, metadata=(("traceparent", f"00-{grpc_trace}-{PARENT_ID}-01"),), timeout=DEADLINE_S)
        finally:
            stop_server(process)  # the worker flushes its spans as it exits
    every = _json_objects(out.read_text())
    grpc_spans = {span["name"] for span in every if span.get("context", {}).get("trace_id") == f"0x{grpc_trace}"}
    assert {"/tensorflow.serving.PredictionService/Predict", "serve.model"} <= grpc_spans, grpc_spans
    printed = [span for span in every if span.get("context", {}).get("trace_id") == f"0x{TRACE_ID}"]
    by_name = {span["name"]: span for span in printed}
    assert {"POST /api/v1/predict", "serve.decode", "serve.model"} <= set(by_name), printed
    request = by_name["POST /api/v1/predict"]
    assert request["parent_id"] == f"0x{PARENT_ID}" and request["attributes"]["serve.request_id"] == "console-1"
    assert request["resource"]["attributes"]["service.name"] == "cifar10-test"
    assert by_name["serve.model"]["parent_id"] == request["context"]["span_id"]
    assert not any(span["name"].endswith("/readyz") for span in every)


# -- settings --------------------------------------------------------------------------------


def test_the_exporter_is_a_checked_setting_and_the_service_has_a_name(monkeypatch):
    from opentelemetry.sdk.resources import SERVICE_NAME

    from serve.telemetry import tracing
    from serve.settings import Settings, SettingsError

    assert Settings.from_env({}).traces_exporter == "none"
    assert Settings.from_env({"OTEL_TRACES_EXPORTER": " otlp , console,otlp"}).traces_exporter == "otlp,console"
    for bad in ("zipkin", "none,console", ","):
        with pytest.raises(SettingsError, match="OTEL_TRACES_EXPORTER"):
            Settings.from_env({"OTEL_TRACES_EXPORTER": bad})
    for variable in ("OTEL_EXPORTER_OTLP_PROTOCOL", "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"):
        assert getattr(Settings.from_env({variable: "http/protobuf"}), variable[5:].lower().replace("exporter_", "")) == "http/protobuf"
        with pytest.raises(SettingsError, match=variable):  # no gRPC exporter is installed: refused, not ignored
            Settings.from_env({variable: "grpc"})
    assert type(tracing.exporter("console")).__name__ == "ConsoleSpanExporter"
    assert type(tracing.exporter("otlp")).__name__ == "OTLPSpanExporter"
    monkeypatch.delenv("OTEL_SERVICE_NAME", raising=False)
    monkeypatch.delenv("OTEL_RESOURCE_ATTRIBUTES", raising=False)
    assert tracing.resource(Settings.from_env({})).attributes[SERVICE_NAME] == "serve"
    monkeypatch.setenv("OTEL_RESOURCE_ATTRIBUTES", "service.name=from-attributes")
    assert tracing.resource(Settings.from_env({})).attributes[SERVICE_NAME] == "from-attributes"
    monkeypatch.setenv("OTEL_SERVICE_NAME", "from-name")
    assert tracing.resource(Settings.from_env({"OTEL_SERVICE_NAME": "from-name"})).attributes[SERVICE_NAME] == "from-name"
