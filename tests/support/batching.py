"""For the tests that need requests queued in a batcher for sure, without a sleep: a model held at a gate while
they arrive, and a count of the requests that reached the queue."""

import threading

#: How long a step may take on a loaded machine before the test calls it stuck.
DEADLINE_S = 60


class Gate:
    """``model`` behind a gate: every call waits until the test opens it, so requests queue behind a running call."""

    def __init__(self, model):
        self.model = model
        self.entered = threading.Event()
        self.opened = threading.Event()

    def __call__(self, images):
        self.entered.set()
        assert self.opened.wait(DEADLINE_S), "the gate was never opened"
        return self.model(images)


def count_queued(batcher):
    """Wrap the batcher's queue so the test can wait until a number of requests are in it: a semaphore released
    once for each request put in it."""
    queued = threading.Semaphore(0)
    put = batcher._queue.put

    def counting_put(item, *args, **kwargs):
        put(item, *args, **kwargs)
        if item is not None:
            queued.release()

    batcher._queue.put = counting_put
    return queued
