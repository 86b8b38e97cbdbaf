"""The micro-batcher alone, with a plain function standing in for the model."""

import threading

import numpy as np
import pytest

from batching import Gate, count_queued
from serve.backends.batcher import Batcher

DEADLINE_S = 60  # how long a step may take on a loaded machine before the test calls it stuck


def _identity(images):
    return {"echo": images.copy(), "sum": images.reshape(len(images), -1).sum(axis=1)}


def _behind_a_held_call(gate, batcher, queued, threads):
    """Run ``threads`` (each submits once): the first finds the batcher idle and runs inline, where the gate holds it,
    so all the others queue behind it, whatever the machine's load; then the gate opens and the batcher closes."""
    threads[0].start()
    assert gate.entered.wait(DEADLINE_S)
    for t in threads[1:]:
        t.start()
    for _ in threads[1:]:
        assert queued.acquire(timeout=DEADLINE_S), "a request never reached the queue"
    gate.opened.set()
    for t in threads:
        t.join(timeout=DEADLINE_S)
    batcher.close()


def test_every_request_gets_its_own_rows_and_batches_stay_bounded():
    gate = Gate(_identity)
    batcher = Batcher(gate, max_batch=8, max_wait_s=0.005)
    queued = count_queued(batcher)
    results, errors = {}, []

    def client(i, n):
        images = np.full((n, 2, 2, 3), i, np.uint8)
        try:
            results[i] = batcher.submit(images)
        except Exception as e:  # noqa: BLE001 - collected and asserted below
            errors.append(e)

    _behind_a_held_call(gate, batcher, queued, [threading.Thread(target=client, args=(i, 1 + i % 3)) for i in range(40)])
    assert not errors
    for i in range(40):
        n = 1 + i % 3
        assert results[i]["echo"].shape == (n, 2, 2, 3) and (results[i]["echo"] == i).all()
        np.testing.assert_array_equal(results[i]["sum"], np.full(n, i * 12))
    assert max(batcher.batch_sizes) <= 8
    assert sum(size * count for size, count in batcher.batch_sizes.items()) == sum(1 + i % 3 for i in range(40))
    # 78 queued images in batches of at most 8, each but the first and the last at least 6 (a request is 1-3).
    assert sum(count for size, count in batcher.batch_sizes.items() if size >= 6) >= 8, batcher.batch_sizes


def test_a_lone_request_runs_at_once():
    # A batcher that waited to fill its batch would take the whole hour; the thread gives up
    # after a minute, far longer than any loaded machine needs for one call.
    batcher = Batcher(_identity, max_batch=32, max_wait_s=3600.0)
    result = {}
    thread = threading.Thread(target=lambda: result.update(batcher.submit(np.full((1, 2, 2, 3), 7, np.uint8))), daemon=True)
    thread.start()
    thread.join(DEADLINE_S)
    try:
        assert "echo" in result, "an idle batcher never waits to fill a batch"
        assert (result["echo"] == 7).all() and result["echo"].shape == (1, 2, 2, 3)
        assert dict(batcher.batch_sizes) == {1: 1}
    finally:
        batcher.close()


def test_a_failing_batch_fails_its_requests_and_the_batcher_carries_on():
    calls = []

    def flaky(images):
        calls.append(len(images))
        if len(calls) == 1:
            raise ValueError("model exploded")
        return {"echo": images}

    batcher = Batcher(flaky, max_batch=4)
    try:
        batcher.submit(np.zeros((1, 2, 2, 3), np.uint8))
    except ValueError as e:
        assert "exploded" in str(e)
    else:
        raise AssertionError("the error reached the caller")
    assert batcher.submit(np.ones((2, 2, 2, 3), np.uint8))["echo"].shape == (2, 2, 2, 3)
    batcher.close()


def test_requests_that_queue_while_the_model_runs_share_its_next_call():
    """The next batch is gathered when the model is free, not when its first request arrived: none is left behind."""
    gate = Gate(_identity)
    batcher = Batcher(gate, max_batch=32, max_wait_s=0.0)
    queued = count_queued(batcher)
    _behind_a_held_call(gate, batcher, queued,
                        [threading.Thread(target=batcher.submit, args=(np.full((1, 2, 2, 3), i, np.uint8),)) for i in range(7)])
    assert dict(batcher.batch_sizes) == {1: 1, 6: 1}


# -- no model call over max_batch ---------------------------------------------------


def test_a_request_larger_than_max_batch_is_run_in_parts_of_at_most_max_batch():
    calls = []

    def model(images):
        calls.append(len(images))
        return {"sum": images.reshape(len(images), -1).sum(axis=1)}

    batcher = Batcher(model, max_batch=4, max_wait_s=0)
    try:
        images = np.arange(10 * 3, dtype=np.uint8).reshape(10, 3)
        out = batcher.submit(images)
        assert max(calls) <= 4 and sum(calls) == 10
        np.testing.assert_array_equal(out["sum"], images.sum(axis=1))  # in order
        assert all(size <= 4 for size in batcher.batch_sizes)
    finally:
        batcher.close()


def test_a_failing_part_fails_the_whole_request():
    def model(images):
        if images[0, 0] >= 4:
            raise RuntimeError("the second part broke")
        return {"x": images}

    batcher = Batcher(model, max_batch=4, max_wait_s=0)
    try:
        with pytest.raises(RuntimeError, match="second part"):
            batcher.submit(np.arange(8, dtype=np.uint8).reshape(8, 1))
    finally:
        batcher.close()


@pytest.mark.end_to_end
def test_the_local_backend_never_calls_the_model_with_more_than_max_batch(model_base):
    from serve import create_app

    app = create_app({"TESTING": True, "MODEL_DIR": str(model_base), "MODEL_NAME": "cifar10", "MAX_BATCH": 8})
    backend = app.extensions["serve.backend"]
    backend.wait_loaded()
    try:
        images = np.random.default_rng(0).integers(0, 256, (50, 32, 32, 3), dtype=np.uint8)
        response = app.test_client().post("/v1/models/cifar10:predict", json={"instances": images.tolist()})
        assert response.status_code == 200 and len(response.get_json()["predictions"]) == 50
        assert max(backend.batch_sizes) <= 8
        whole = app.test_client().post("/v1/models/cifar10:predict", json={"instances": images[:8].tolist()})
        assert [p["class_ids"] for p in response.get_json()["predictions"][:8]] == [p["class_ids"] for p in whole.get_json()["predictions"]]
    finally:
        backend.close()
