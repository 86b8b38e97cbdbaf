"""Two serving replicas behind the shipped nginx: one lost and both replaced under load, and no request lost.

nginx runs deploy/nginx/nginx.conf with its upstream's one ``server`` line made two (tests/support/proxy.py),
in front of two gunicorns (``python -m serve``, one worker each) serving a copy of ``model_base``. Client
threads send TF Serving REST predictions through nginx throughout; every answer must be a 200 with the
prediction the model gives directly, and nothing else may come back (no 5xx, no connection error).

1. One replica's process group (gunicorn's master and worker) is SIGKILLed mid-load: nginx sends what
   the replica held, and what it is sent next, to the other (``proxy_next_upstream``), and passive
   health (``max_fails``) stops trying it. It is restarted on its port and takes requests again.
2. Version 2 is published (a copy of version 1 under the next number) and the replicas are replaced
   one at a time: SIGTERM (gunicorn's graceful stop), started again on the same port (now serving
   version 2), ready, then the other. The replicas look for no new version (``MODEL_POLL_S=0``, as a
   pod whose model comes with it): only a replacement changes what a replica serves. Every answer
   names (``X-Model-Version``) a version available when it was asked: 1 before the first
   replacement, 1 or 2 during, 2 once both are replaced.

Nothing waits for time to pass: each step waits, with a deadline, for requests to complete or for a
replica's /readyz. Skipped only where Debian's ``nginx`` is missing (scripts/test.sh installs it).
"""

import json
import math
import os
import shutil
import signal
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
import requests

import proxy
import synthetic
from live_server import free_port, start_server

pytestmark = [pytest.mark.skipif(proxy.nginx_binary() is None, reason="Debian's nginx is not installed (scripts/test.sh installs it)"),
              pytest.mark.end_to_end]

CLIENTS = 3  # one a synthetic class: each sends its own image
DEADLINE_S = 120  # generous: the machine is shared; nothing here waits for a deadline to pass
AFTER = 30  # requests that must complete after each step before the next
PREDICT = "/v1/models/cifar10:predict"
ENV = {"WEB_CONCURRENCY": "1", "GUNICORN_THREADS": "4", "SERVE_RUNTIME_THREADS": "1", "MODEL_POLL_S": "0",
       "SERVE_TRUSTED_PROXIES": "1", "SERVE_LOG_FORMAT": "json"}


class Load:
    """``CLIENTS`` threads, each sending its image to nginx in a loop until :meth:`stop`; every outcome recorded."""

    def __init__(self, port, images, expected):
        self.url = f"http://127.0.0.1:{port}{PREDICT}"
        self.bodies = [json.dumps({"instances": [image.tolist()]}).encode() for image in images]
        self.expected = expected
        self.records = []  # dicts: id, start, end, status, version, problem (None for a right answer)
        self.changed = threading.Condition()
        self.stopping = threading.Event()
        self.threads = [threading.Thread(target=self._client, args=(i,), daemon=True) for i in range(CLIENTS)]

    def _client(self, index):
        session = requests.Session()  # keep-alive to nginx, as a client would
        n = 0
        while not self.stopping.is_set():
            n += 1
            record = {"id": f"replicas-{index}-{n}", "start": time.monotonic(), "version": None, "status": None}
            try:
                response = session.post(self.url, data=self.bodies[index], timeout=DEADLINE_S,
                                        headers={"Content-Type": "application/json", "X-Request-Id": record["id"]})
                record["status"] = response.status_code
                record["version"] = response.headers.get("X-Model-Version")
                record["problem"] = self._check(index, response)
            except requests.RequestException as e:
                record["problem"] = f"{type(e).__name__}: {e}"
            record["end"] = time.monotonic()
            with self.changed:
                self.records.append(record)
                self.changed.notify_all()

    def _check(self, index, response):
        if response.status_code != 200:
            return f"{response.status_code}: {response.text[:200]}"
        (got,) = response.json()["predictions"]
        want = self.expected[index]
        # The batcher may run this image with others': the same class, the probabilities to float noise.
        if got["class_ids"] != want["class_ids"] or not np.allclose(got["probabilities"], want["probabilities"], atol=1e-4):
            return f"a wrong prediction: {got} (directly: {want})"
        return None

    def start(self):
        for thread in self.threads:
            thread.start()

    def stop(self):
        self.stopping.set()
        for thread in self.threads:
            thread.join(DEADLINE_S)

    def completed_since(self, since):
        with self.changed:
            return [r for r in self.records if r["start"] >= since]

    def wait_for(self, count, since, what):
        """Block until ``count`` requests that started at or after ``since`` have completed; fail at the deadline."""
        deadline = time.monotonic() + DEADLINE_S
        with self.changed:
            while sum(r["start"] >= since for r in self.records) < count:
                if not self.changed.wait(timeout=deadline - time.monotonic()) and time.monotonic() >= deadline:
                    raise AssertionError(f"{count} requests did not complete {what} within {DEADLINE_S} s")


class Replica:
    """One gunicorn (``python -m serve``) on a fixed port, in a process group of its own."""

    def __init__(self, name, models, folder):
        self.name, self.models, self.folder = name, models, folder
        self.port = free_port()
        self.address = f"127.0.0.1:{self.port}"
        self.process = None
        self.starts = 0

    def start(self):
        self.starts += 1
        with open(self.folder / f"{self.name}-{self.starts}.log", "wb") as log:
            self.process, _ = start_server(self.models, ENV, stderr=log, port=self.port, start_new_session=True)
        return time.monotonic()

    def kill(self):
        """SIGKILL to the master and its workers at once, as a lost host or an OOM kill of the pod."""
        os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait(DEADLINE_S)

    def stop(self):
        """gunicorn's graceful stop (SIGTERM): no new connections, the requests it holds answered."""
        self.process.terminate()
        assert self.process.wait(DEADLINE_S) == 0, f"{self.name} did not stop cleanly"

    def close(self):
        if self.process is not None and self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()


def nginx_lines(path):
    """nginx's access lines in ``path``, by request id."""
    lines = {}
    for line in path.read_text(errors="replace").splitlines():
        if line.startswith("{"):
            record = json.loads(line)
            lines[record["request_id"]] = record
    return lines


def wait_for_lines(path, ids):
    """nginx's access lines for every id in ``ids``, polled for until the deadline (nginx writes each as it answers)."""
    deadline = time.monotonic() + DEADLINE_S
    while True:
        lines = nginx_lines(path)
        if set(ids) <= set(lines) or time.monotonic() >= deadline:
            return lines
        time.sleep(0.1)


def taken_back(load, access_log, replica, since):
    """Wait until nginx has passed ``replica`` a request, started at or after ``since``, that it answered.

    nginx tests a replica it took out only once ``fail_timeout`` has passed (it has no active health
    checks), and until then counts it down however ready it is: stopping the other replica sooner
    would leave nginx no replica to send to. So the rollout waits for this, not for /readyz alone."""
    deadline = time.monotonic() + DEADLINE_S
    while True:
        since_ids = [r["id"] for r in load.completed_since(since)]
        lines = nginx_lines(access_log)
        if any(i in lines and lines[i]["upstream"] == replica.address and lines[i]["status"] == 200 for i in since_ids):
            return
        assert time.monotonic() < deadline, f"nginx sent {replica.name} no request within {DEADLINE_S} s of its start"
        load.wait_for(len(since_ids) + CLIENTS, since, f"while nginx took {replica.name} back")


def test_a_replica_killed_and_a_rolling_version_change_lose_no_request(model_base, tmp_path):
    began = time.monotonic()
    models = tmp_path / "models"
    shutil.copytree(model_base, models)
    replicas = [Replica(name, models, tmp_path) for name in ("a", "b")]
    nginx, load = None, None
    (fails,) = {p for _, _, p in proxy.upstream_servers()}
    max_fails = int(fails.split("max_fails=")[1].split()[0])
    fail_timeout = float(fails.split("fail_timeout=")[1].split()[0].removesuffix("s"))
    try:
        with ThreadPoolExecutor(len(replicas)) as pool:
            list(pool.map(Replica.start, replicas))
        # The answers to compare with: each image asked of a replica directly.
        images, _ = synthetic.make_images(1)
        assert len(images) == CLIENTS
        expected = []
        for image in images:
            response = requests.post(f"http://{replicas[0].address}{PREDICT}", json={"instances": [image.tolist()]},
                                     timeout=DEADLINE_S)
            assert response.status_code == 200 and response.headers["X-Model-Version"] == "1", response.text[:300]
            expected.append(response.json()["predictions"][0])

        port = free_port()
        access_log = tmp_path / "nginx-access.log"
        with open(access_log, "wb") as out, open(tmp_path / "nginx-error.log", "wb") as err:
            nginx = proxy.start(port, [r.port for r in replicas], stdout=out, stderr=err)
        load = Load(port, images, expected)
        load.start()
        load.wait_for(AFTER, began, "before the kill")

        # 1. SIGKILL one replica mid-load; then restart it where it was.
        lost = replicas[0]
        killed = time.monotonic()
        lost.kill()
        # Long enough for round robin alone to send it dozens; passive health sends it a few.
        load.wait_for(10 * AFTER, killed, "after the kill")
        restarting = time.monotonic()
        ready = lost.start()
        load.wait_for(AFTER, ready, "after the restart")
        taken_back(load, access_log, lost, ready)

        # 2. A rolling version change: publish 2, replace the replicas one at a time, each only once
        # nginx sends requests to the one before again (as a rollout waits for readiness).
        shutil.copytree(models / "1", models / "2")
        rolling = time.monotonic()
        for replica in replicas:
            replica.stop()
            replaced = replica.start()
            load.wait_for(AFTER, replaced, f"after {replica.name} was replaced")
            taken_back(load, access_log, replica, replaced)
        rolled = time.monotonic()
        load.wait_for(AFTER, rolled, "after both replicas were replaced")
    finally:
        if load is not None:
            load.stop()
        if nginx is not None:
            proxy.stop(nginx)
        for replica in replicas:
            replica.close()
    took = time.monotonic() - began

    records = load.records
    failed = [r for r in records if r["problem"] is not None]
    assert not failed, f"{len(failed)} of {len(records)} requests failed, e.g. {failed[:5]}"
    # Every answer names a version that was available when it was asked.
    for r in records:
        allowed = {"1"} if r["end"] < rolling else {"2"} if r["start"] >= rolled else {"1", "2"}
        assert r["version"] in allowed, f"{r['id']} answered by version {r['version']}, not {sorted(allowed)}"
    assert {r["version"] for r in records if rolling <= r["start"] < rolled} == {"1", "2"}

    # The retries and passive health, from nginx's access lines ("upstream": "A, B" for a retried request).
    lines = wait_for_lines(access_log, [r["id"] for r in records])
    assert set(lines) >= {r["id"] for r in records}, "nginx logged fewer requests than the clients sent"
    retried = [lines[r["id"]] for r in records if ", " in lines[r["id"]]["upstream"]]
    assert retried, "no request was retried on the other replica"
    assert all(line["status"] == 200 for line in retried)
    # While the lost replica was down, nginx tried it only a few times: those it held when it died, and
    # max_fails tries each time fail_timeout let it test the replica again (each of the clients at most).
    down = [lines[r["id"]] for r in records if killed <= r["start"] < restarting]
    tried_dead = [line for line in down if lost.address in line["upstream"].split(", ")]
    windows = 1 + math.ceil((restarting - killed) / fail_timeout)
    assert len(tried_dead) <= CLIENTS + windows * max(max_fails, CLIENTS), (len(tried_dead), len(down))
    print(f"\n{len(records)} requests through nginx in {took:.1f} s, {len(failed)} failed, {len(retried)} retried "
          f"on the other replica; the lost replica tried {len(tried_dead)} times in {len(down)} requests while down; "
          f"{sum(r['version'] == '2' for r in records)} answered by version 2")
