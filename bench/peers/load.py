"""bench/peers' requests and table: the request bodies, the answer check, the median over rounds, the markdown.

Every cell posts one prepared body with ``wrk`` (``bench.harness.run_wrk``): 1 image at c=1 and c=32,
64 images a request at c=2, as JSON ``instances``, multipart PNG and v2 JSON.
"""

import json
import os
import statistics

import numpy as np

from bench import harness

JSON = "application/json"


class Cell:
    def __init__(self, key, kind, images, threads, connections):
        self.key, self.kind, self.images, self.threads, self.connections = key, kind, images, threads, connections

    @property
    def label(self):
        what = {"json": "JSON `instances`", "png": "multipart PNG", "v2": "v2 JSON",
                "grpc-tfs": "gRPC TF Serving `tensor_content`", "grpc-v2": "gRPC v2 `raw_input_contents`"}[self.kind]
        return f"{what}, {self.images} image{'s' if self.images > 1 else ''}, c={self.connections}"


CELLS = (
    Cell("json-1-c1", "json", 1, 1, 1),
    Cell("json-1-c32", "json", 1, 2, 32),
    Cell("json-64-c2", "json", 64, 1, 2),
    Cell("png-1-c1", "png", 1, 1, 1),
    Cell("png-1-c32", "png", 1, 2, 32),
    Cell("png-64-c2", "png", 64, 1, 2),
    Cell("v2-1-c1", "v2", 1, 1, 1),
    Cell("v2-1-c32", "v2", 1, 2, 32),
    Cell("v2-64-c2", "v2", 64, 1, 2),
    Cell("grpc-tfs-64-c2", "grpc-tfs", 64, 1, 2),
    Cell("grpc-v2-64-c2", "grpc-v2", 64, 1, 2),
)
#: The kinds of request bench/peers/grpc_load.py sends (wrk speaks HTTP alone).
GRPC_KINDS = {"grpc-tfs": "tfs", "grpc-v2": "v2"}


# -- bodies ------------------------------------------------------------------------------------
def body(kind, images, pngs):
    """(bytes, content type) of a request carrying ``images`` (uint8 [N, 32, 32, 3]) as ``kind``."""
    if kind == "json":
        return json.dumps({"instances": images.tolist()}, separators=(",", ":")).encode(), JSON
    if kind == "v2":
        tensor = {"name": "images", "shape": list(images.shape), "datatype": "UINT8", "data": images.ravel().tolist()}
        return json.dumps({"inputs": [tensor]}, separators=(",", ":")).encode(), JSON
    if kind == "png":
        files = [(f"{i}.png", data) for i, data in enumerate(pngs[: len(images)])]
        return harness.multipart(files, "image/png"), harness.MULTIPART
    raise ValueError(kind)


def write_bodies(folder, images, pngs):
    """``{(kind, count): (path, content type)}`` for every body a cell posts."""
    paths = {}
    for kind, count in {(c.kind, c.images) for c in CELLS if c.kind not in GRPC_KINDS}:
        data, content_type = body(kind, images[:count], pngs)
        path = os.path.join(folder, f"{kind}-{count}.body")
        with open(path, "wb") as f:
            f.write(data)
        paths[(kind, count)] = (path, content_type)
    return paths


# -- answers -----------------------------------------------------------------------------------
def answer_rows(answer):
    """``[(class id, probabilities or None)]`` from any server's JSON answer.

    v2 (``outputs``, the one named ``probabilities``); TF Serving (``predictions``, rows of
    probabilities or objects holding ``probabilities``); this project's ``/api/v1/predict``
    (``predictions`` of objects with ``class_id`` only); a bare array of rows (BentoML).
    """
    if isinstance(answer, dict) and "outputs" in answer:
        output = next(o for o in answer["outputs"] if o["name"] == "probabilities")
        probabilities = np.asarray(output["data"], np.float32).reshape(output["shape"])
        return [(int(p.argmax()), p) for p in probabilities]
    rows = answer["predictions"] if isinstance(answer, dict) else answer
    out = []
    for row in rows:
        if isinstance(row, dict) and "probabilities" not in row:
            out.append((int(row["class_id"]), None))
            continue
        p = np.asarray(row["probabilities"] if isinstance(row, dict) else row, np.float32)
        out.append((int(p.argmax()), p))
    return out


def check_answer(answer, reference, tolerance=1e-4):
    """None when every row's top class is the reference's (and its probabilities within ``tolerance``), else why not."""
    rows = answer_rows(answer)
    if len(rows) != len(reference):
        return f"{len(rows)} answers for {len(reference)} images"
    for i, ((class_id, probabilities), expected) in enumerate(zip(rows, reference)):
        if class_id != int(expected.argmax()):
            return f"image {i}: class {class_id}, this project's model says {int(expected.argmax())}"
        if probabilities is not None and float(np.abs(probabilities - expected).max()) > tolerance:
            return f"image {i}: probabilities differ by {float(np.abs(probabilities - expected).max()):.2g}"
    return None


# -- rounds -------------------------------------------------------------------------------------
def combine(rounds):
    """One result per server from ``rounds`` (each ``{server: result}``): the median rate and percentiles
    of each cell over the rounds, its errors and requests summed, any wrong answer kept, the largest memory."""
    combined = {}
    for name in rounds[0]:
        runs = [r[name] for r in rounds if name in r]
        cells = {}
        for key in {k for run in runs for k in run.get("cells", {})}:
            rows = [run["cells"][key] for run in runs if key in run.get("cells", {})]
            cell = {k: statistics.median(row[k] for row in rows) for k in ("requests_per_s", "p50_ms", "p99_ms")}
            cell.update({k: sum(row[k] for row in rows) for k in ("requests", "non_2xx", "socket_errors", "timeouts")})
            cell["wrong"] = next((row["wrong"] for row in rows if row.get("wrong")), None)
            cell["rounds"] = rows
            cells[key] = cell
        combined[name] = {"cells": cells, "rss_mb": max((run.get("rss_mb") or 0 for run in runs), default=0) or None,
                          "largest_process_mb": max((run.get("largest_process_mb") or 0 for run in runs), default=0) or None,
                          "load_average": [run.get("load_average") for run in runs]}
        failed = [run["failed"] for run in runs if "failed" in run]
        if failed:
            combined[name]["failed"] = "; ".join(failed)
    return combined


# -- the table ---------------------------------------------------------------------------------
def errors(row):
    return row["non_2xx"] + row["socket_errors"] + row["timeouts"]


def format_cell(cell, row):
    """One table entry: c=1 the p50 and p99; otherwise requests/s (images/s for 64) and p99; then any errors."""
    if row is None:
        return "—"
    if "error" in row:
        return f"failed: {row['error']}"
    if row["requests"] == 0:
        text = "no answer within the run"
    elif cell.connections == 1:
        text = f"{row['p50_ms']:.2f} / {row['p99_ms']:.2f} ms"
    elif cell.images > 1:
        text = f"{row['requests_per_s'] * cell.images:,.0f} img/s (p99 {row['p99_ms']:.1f} ms)"
    else:
        text = f"{row['requests_per_s']:,.0f} req/s (p99 {row['p99_ms']:.1f} ms)"
    if errors(row):
        text += f"; **{row['non_2xx']} non-2xx, {row['socket_errors']} socket errors, {row['timeouts']} timeouts**"
    if row.get("wrong"):
        text += f"; **wrong answer: {row['wrong']}**"
    return text


def markdown(results, servers):
    """Rows = cells (c=1: p50 / p99; c=32: requests/s; 64 images: images/s), columns = ``servers``."""
    lines = ["| cell | " + " | ".join(servers) + " |", "|---|" + "---|" * len(servers)]
    for cell in CELLS:
        entries = [format_cell(cell, results.get(name, {}).get("cells", {}).get(cell.key)) for name in servers]
        if all(e == "—" for e in entries):
            continue
        lines.append(f"| {cell.label} | " + " | ".join(entries) + " |")
    rss = [results.get(name, {}).get("rss_mb") for name in servers]
    lines.append("| resident memory, all processes after the run | " + " | ".join(f"{r:,.0f} MB" if r else "—" for r in rss) + " |")
    largest = [results.get(name, {}).get("largest_process_mb") for name in servers]
    lines.append("| resident memory, largest process (a worker) | " + " | ".join(f"{r:,.0f} MB" if r else "—" for r in largest) + " |")
    loads = [results.get(name, {}).get("load_average") or [] for name in servers]
    if any(loads):
        lines.append("| 1-min load average as the server started | " + " | ".join(", ".join(f"{x:.1f}" for x in la if x is not None) or "—" for la in loads) + " |")
    return "\n".join(lines)
