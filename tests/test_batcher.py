"""The micro-batcher alone, with a plain function standing in for the model."""

import threading
import time

import numpy as np

from serve.batcher import Batcher


def _slow_identity(images):
    time.sleep(0.01)  # long enough for other requests to queue behind a running batch
    return {"echo": images.copy(), "sum": images.reshape(len(images), -1).sum(axis=1)}


def test_every_request_gets_its_own_rows_and_batches_stay_bounded():
    batcher = Batcher(_slow_identity, max_batch=8, max_wait_s=0.005)
    results, errors = {}, []

    def client(i, n):
        images = np.full((n, 2, 2, 3), i, np.uint8)
        try:
            results[i] = batcher.submit(images)
        except Exception as e:  # noqa: BLE001 - collected and asserted below
            errors.append(e)

    threads = [threading.Thread(target=client, args=(i, 1 + i % 3)) for i in range(40)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    batcher.close()
    assert not errors
    for i in range(40):
        n = 1 + i % 3
        assert results[i]["echo"].shape == (n, 2, 2, 3) and (results[i]["echo"] == i).all()
        np.testing.assert_array_equal(results[i]["sum"], np.full(n, i * 12))
    assert max(batcher.batch_sizes) <= 8
    assert sum(size * count for size, count in batcher.batch_sizes.items()) == sum(1 + i % 3 for i in range(40))
    assert any(size > 3 for size in batcher.batch_sizes), "concurrent requests shared model calls"


def test_a_lone_request_runs_at_once():
    # A batcher that waited to fill its batch would take the whole hour; the thread gives up
    # after a minute, far longer than any loaded machine needs for one 10 ms call.
    batcher = Batcher(_slow_identity, max_batch=32, max_wait_s=3600.0)
    result = {}
    thread = threading.Thread(target=lambda: result.update(batcher.submit(np.full((1, 2, 2, 3), 7, np.uint8))), daemon=True)
    thread.start()
    thread.join(60)
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
