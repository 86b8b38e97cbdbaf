"""docs/benchmarks.md's regions of serving. The request path: its cost in instructions and its layers."""

import os

from bench.report.core import region, table


ROUTES = {"tfserving": "TF Serving JSON `instances`, `/v1/models/cifar10:predict`", "v2": "v2 JSON, `/v2/models/cifar10/infer`",
          "api": "multipart PNG, `/api/v1/predict`", "healthz": "`GET /healthz`", "hello": "the hello-world floor, the same JSON body"}


@region("serving-request-cost")
def request_cost(report):
    """The instructions a request, before (the table transcribed at the round's start) and now, and the 30% targets."""
    before = {row[0]: row[1] for row in report["serving-request-cost-avx2"]["table"]["rows"]}
    now = report["serving-request-cost-avx512-bf16-amx"]["instructions_a_request"]
    floor_before, floor_now = before[ROUTES["hello"]], now["hello"]
    rows = []
    for route, label in ROUTES.items():
        old, new = before[label], now[route]
        rows.append([label, f"{old:,.0f}", f"{new:,.0f}", f"{new / old - 1:+.1%}", f"{old / floor_before:.2f}x", f"{new / floor_now:.2f}x"])
        if route in ("tfserving", "v2"):
            report.target(f"request cost, {label.split(',')[0]}: ≥ 30% under the round's start", new / old - 1, -0.30, "{:+.1%}",
                          ["serving-request-cost-avx512-bf16-amx"], at_least=False)
    return table(["request (one image)", "before (record 1)", "now (record 2)", "change", "before, x the floor", "now, x the floor"], rows)


@region("serving-layers")
def serving_layers(report):
    """Each layer's mean time a request under gunicorn, for each model and concurrency, from bench.serving.layers."""
    found = report.matching("serving-layers-*")
    columns, cells = ["layer (µs a request, mean)"], []
    for _, rec in found:
        model = os.path.basename(rec["model_dir"].rstrip("/").removesuffix("/models/cifar10"))
        for label, cell_ in rec["cells"].items():
            columns.append(f"{model}, {label}")
            cells.append(cell_)
    layers = list(cells[0]["layers_us"])
    rows = [[layer, *(f"{c['layers_us'][layer]:,.0f}" for c in cells)] for layer in layers]
    rows.append(["requests/s (wrk)", *(f"{c['wrk']['requests_per_s']:,.0f}" for c in cells)])
    return table(columns, rows)
