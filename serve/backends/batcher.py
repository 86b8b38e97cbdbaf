"""Micro-batching: concurrent requests share one model call.

One thread owns the model. It takes whatever requests are already queued, up to
``max_batch`` images, and runs them together. No model call ever holds more than ``max_batch``
images: a request larger than that is split into parts of at most ``max_batch``, queued one
after another, and its answers are joined in order. When the server is idle a request is
dispatched at once; only while the previous batch was bigger than the queue now holds
(the server is busy and more requests are surely on their way) does it wait up to
``max_wait_s`` to fill the batch.

When nothing is queued and no batch is running, a request runs the model in its own thread
instead: handing it to the batcher thread and back costs two thread switches, a noticeable
share of a single-image call. A lock keeps one model call at a time either way, so requests
that arrive meanwhile queue up and run together in the next batch.

Each request waits for its answer until its deadline (``time.monotonic()``; the core's, which is the caller's
capped by ``SERVE_PREDICT_TIMEOUT_S``), then gives up with ``TimeoutError``; a request whose deadline passed
while it queued is dropped from its batch, never run: under more load than the model can answer, the
work done is work someone still waits for. How many images a worker holds at once is the core's to bound
(``SERVE_MAX_QUEUE``, :mod:`serve.core.service`).

With traces on (:mod:`serve.telemetry.tracing`) each model call is a ``serve.model`` span: in the request's
thread a child of its span; on the batcher's thread a child of the first request's, linked to the
others'. A request that queued has a ``serve.batch_wait`` span for the time it waited.
"""

import collections
import queue
import threading
import time

import numpy as np

from serve.telemetry import tracing


class _Item:
    __slots__ = ("images", "deadline", "done", "result", "error", "context")

    def __init__(self, images, deadline):
        self.images = images
        self.deadline = deadline
        self.done = threading.Event()
        self.result = None
        self.error = None
        self.context = tracing.current()  # the request's trace context, for the batch's span


class Batcher:
    """Run ``fn(uint8 [N, ...]) -> {name: array [N, ...]}`` on batches gathered from many threads.

    A request without a deadline waits at most ``timeout_s`` (None: as long as it takes).
    """

    def __init__(self, fn, max_batch=32, max_wait_s=0.002, on_batch=None, timeout_s=None):
        self._fn = fn
        self.max_batch = max(1, int(max_batch))
        self.max_wait_s = max(0.0, float(max_wait_s))
        self.timeout_s = timeout_s
        self._on_batch = on_batch
        self._queued = 0  # images handed to the batcher thread and not yet run
        self._counting = threading.Lock()
        self._queue = queue.Queue()
        self._running = threading.Lock()  # held during every model call, inline or batched
        #: How many batches of each size ran (tests and /metrics read it).
        self.batch_sizes = collections.Counter()
        self._thread = threading.Thread(target=self._loop, name="batcher", daemon=True)
        self._thread.start()

    def submit(self, images, deadline=None):
        """Run ``images`` (uint8 ``[n, ...]``) in the next batch; block until its outputs are ready, or ``deadline``."""
        if deadline is None and self.timeout_s is not None:
            deadline = _now() + self.timeout_s
        if len(images) > self.max_batch:
            return self._submit_parts(images, deadline)
        if self._queue.empty() and self._running.acquire(blocking=False):
            try:
                if self._queue.empty():  # still idle now that the model is ours
                    with tracing.span("serve.model", {"serve.batch.images": len(images), "serve.batch.requests": 1}):
                        outputs = self._fn(images)
                    self._count(len(images))
                    return outputs
            finally:
                self._running.release()
        item = _Item(images, deadline)
        with tracing.span("serve.batch_wait", {"serve.images": len(images)}):
            self._enqueue(item)
            _wait(item)
        if item.error is not None:
            raise item.error
        return item.result

    def _submit_parts(self, images, deadline):
        """Queue ``images`` as parts of at most ``max_batch``; their outputs joined in order."""
        items = [_Item(images[start : start + self.max_batch], deadline) for start in range(0, len(images), self.max_batch)]
        with tracing.span("serve.batch_wait", {"serve.images": len(images), "serve.parts": len(items)}):
            for item in items:
                self._enqueue(item)
            for item in items:
                _wait(item)
        errors = [item.error for item in items if item.error is not None]
        if errors:
            raise errors[0]
        return {name: np.concatenate([item.result[name] for item in items]) for name in items[0].result}

    def _enqueue(self, item):
        with self._counting:
            self._queued += len(item.images)
        self._queue.put(item)

    @property
    def queued(self):
        """Images handed to the batcher thread and not yet run (waiting for a model call another request holds)."""
        return self._queued

    def close(self):
        self._queue.put(None)
        self._thread.join(timeout=5)

    def _loop(self):
        carry = None  # an item that did not fit in the previous batch
        last_size = 0
        while True:
            first = carry if carry is not None else self._queue.get()
            carry = None
            if first is None:
                return
            # The batch is gathered once the model is free, so every request that queued while it ran joins it.
            with self._running:
                batch = [first]
                # Take what is already waiting, never blocking.
                size, carry, stop = self._gather(batch, len(first.images), deadline=None)
                # Busy: the last batch was bigger than this one, so wait briefly for the rest.
                if not stop and carry is None and size < self.max_batch and self.max_wait_s and last_size > size:
                    size, carry, stop = self._gather(batch, size, deadline=_now() + self.max_wait_s)
                self._run(batch, size)
            last_size = size
            if stop:
                return

    def _gather(self, batch, size, deadline):
        """Append queued items to ``batch`` until it is full, waiting until ``deadline`` (None: not at all).

        Returns ``(size, carry, stop)``: the batch's image count, an item that did not fit
        (it starts the next batch), and whether ``close()`` was called.
        """
        while size < self.max_batch:
            try:
                if deadline is None:
                    item = self._queue.get_nowait()
                else:
                    remaining = deadline - _now()
                    if remaining <= 0:
                        break
                    item = self._queue.get(timeout=remaining)
            except queue.Empty:
                break
            if item is None:
                return size, None, True
            if size + len(item.images) > self.max_batch:
                return size, item, False
            batch.append(item)
            size += len(item.images)
        return size, None, False

    def _run(self, batch, size):
        now = _now()
        late = [item for item in batch if item.deadline is not None and item.deadline <= now]
        if late:  # their callers have given up: no model time for them
            self._dequeued(late)
            for item in late:
                item.error = TimeoutError("the request's deadline passed while it waited for the model")
                item.done.set()
            batch = [item for item in batch if item not in late]
            size = sum(len(item.images) for item in batch)
            if not batch:
                return
        self._dequeued(batch)
        self._run_locked(batch, size)

    def _dequeued(self, items):
        with self._counting:
            self._queued -= sum(len(item.images) for item in items)

    def _run_locked(self, batch, size):
        try:
            images = batch[0].images if len(batch) == 1 else np.concatenate([item.images for item in batch])
            with tracing.span_for("serve.model", [item.context for item in batch],
                                  {"serve.batch.images": size, "serve.batch.requests": len(batch)}):
                outputs = self._fn(images)
            start = 0
            for item in batch:
                end = start + len(item.images)
                item.result = {name: value[start:end] for name, value in outputs.items()}
                start = end
        except Exception as e:  # handed to every waiting request; the thread carries on
            for item in batch:
                item.error = e
        self._count(size)
        for item in batch:
            item.done.set()

    def _count(self, size):
        self.batch_sizes[size] += 1
        if self._on_batch is not None:
            try:
                self._on_batch(size)
            except Exception:  # nosec B110  # a failing metrics hook must never fail the batch's requests
                pass


def _wait(item):
    """Wait for ``item``'s outputs until its deadline; ``TimeoutError`` past it."""
    timeout = None if item.deadline is None else max(0.0, item.deadline - _now())
    if not item.done.wait(timeout):
        raise TimeoutError("the model did not answer by the request's deadline")


def _now():
    return time.monotonic()
