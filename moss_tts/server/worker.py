"""The speech server's model worker: the one thread that uses the model, fed by a bounded line of
jobs, and the bounded hand-off of streamed audio from that thread to the event loop.
"""

from __future__ import annotations

import asyncio
import queue
import threading
import time
from concurrent.futures import Future

from ..errors import BackendError

POLL_SECONDS = 0.05      # how often a worker waiting for buffer room looks for a cancel


class OwnedModel:
    """The model, callable only from the thread that owns it: ggml graphs, caches and the
    codec's encoder runner are per instance, so a second thread raises instead of racing."""

    def __init__(self, model, owner: threading.Thread):
        self._model, self._owner = model, owner

    def __getattr__(self, name: str):
        value = getattr(self._model, name)
        if not callable(value):
            return value

        def owned(*args, **kwargs):
            here = threading.current_thread()
            if here is not self._owner:
                raise BackendError(f"model.{name}() called from thread {here.name!r}; the model "
                                   f"belongs to {self._owner.name!r}: submit the work to it")
            return value(*args, **kwargs)
        return owned


class ModelWorker:
    """Runs `job(model)` one at a time on its own thread; at most `depth` jobs wait behind the
    running ones (speech, reference encodes and voice uploads alike). With `max_streams` > 1
    (a model with `decoding_together`, serve's --max-streams) up to that many speech jobs run
    together, their frames made in one batched decode: a new one joins at the next chunk
    pulled, a finished one leaves, and a short job (a voice upload) runs between two pulls."""

    def __init__(self, model, depth: int, name: str = "moss-tts-model", max_streams: int = 1):
        places = depth + max_streams
        self._slots = threading.BoundedSemaphore(places)
        self._free, self._count = places, threading.Lock()   # what the semaphore holds
        self._jobs: queue.SimpleQueue = queue.SimpleQueue()
        self.max_streams = max_streams
        self._thread = threading.Thread(target=self._run if max_streams == 1 else self._together,
                                        name=name, daemon=True)
        self.model = OwnedModel(model, self._thread)
        self._thread.start()

    def submit(self, job, *, stream: bool = False) -> Future | None:
        """A future of job(model), or None when the line is full (the server answers 503).
        `stream`: job(model) is a generator that yields after each chunk it makes and returns
        the result; alone it is run through, with max_streams > 1 beside the others."""
        if not self._take_slot():
            return None
        return self._put(job, frees_slot=True, stream=stream)

    def open_lane(self) -> Lane | None:
        """A slot held for a long-lived client (a live connection), or None when the line is
        full: the client counts as one request in the line until `Lane.release`."""
        return Lane(self) if self._take_slot() else None

    @property
    def free_places(self) -> int:
        """Places in the line free now (the running jobs' included): what /v1/models says."""
        return self._free

    def _take_slot(self) -> bool:
        with self._count:
            taken = self._slots.acquire(blocking=False)
            self._free -= taken
            return taken

    def _free_slot(self) -> None:
        with self._count:
            self._slots.release()
            self._free += 1

    def _put(self, job, *, frees_slot: bool, stream: bool = False) -> Future:
        future: Future = Future()
        self._jobs.put((job, future, frees_slot, stream))
        return future

    def _run(self) -> None:
        while (item := self._jobs.get()) is not None:
            job, future, frees_slot, stream = item
            ran, result, error = False, None, None
            try:
                if future.set_running_or_notify_cancel():   # False: cancelled while waiting
                    ran = True
                    try:
                        result = run_through(job(self.model)) if stream else job(self.model)
                    except BaseException as e:  # delivered to the awaiting request
                        error = e
            finally:
                if frees_slot:      # before the result is seen, as in _finish
                    self._free_slot()
            if ran:
                settle(future, result, error)

    def _together(self) -> None:
        """The loop of max_streams > 1: take jobs while a stream place is free (waiting only
        when nothing runs), then pull one chunk of each running speech job in turn."""
        running: list = []      # [generator, future, frees_slot]
        with self.model.decoding_together(self.max_streams):
            while True:
                while len(running) < self.max_streams:
                    try:
                        item = self._jobs.get(block=not running)
                    except queue.Empty:
                        break
                    if item is None:
                        return self._stop(running)
                    job, future, frees_slot, stream = item
                    if not future.set_running_or_notify_cancel():
                        if frees_slot:
                            self._free_slot()
                    elif stream:
                        running.append([job(self.model), future, frees_slot])
                    else:
                        self._finish((None, future, frees_slot), self._call(job))
                for entry in list(running):
                    try:
                        next(entry[0])
                    except StopIteration as end:
                        running.remove(entry)
                        self._finish(entry, (end.value, None))
                    except BaseException as e:   # this request's failure, not the others'
                        running.remove(entry)
                        self._finish(entry, (None, e))

    def _call(self, job):
        try:
            return job(self.model), None
        except BaseException as e:
            return None, e

    def _finish(self, entry, outcome) -> None:
        # the slot comes back before the result is seen: a client that has its answer and
        # asks again at once finds the line as free as it left it
        _, future, frees_slot = entry
        if frees_slot:
            self._free_slot()
        settle(future, *outcome)

    def _stop(self, running) -> None:
        for entry in running:
            entry[0].close()
            self._finish(entry, (None, BackendError("the server is shutting down")))

    def close(self) -> None:
        self._jobs.put(None)
        self._thread.join()


def run_through(steps):
    """A stream job run to its end alone: its return value."""
    while True:
        try:
            next(steps)
        except StopIteration as end:
            return end.value


def settle(future: Future, result, error) -> None:
    if error is not None:
        future.set_exception(error)
    else:
        future.set_result(result)


class Lane:
    """One held slot of a worker's line: its jobs join the line like any request's, but never
    find it full (the slot is already taken), so a live session can always be fed and closed."""

    def __init__(self, worker: ModelWorker):
        self._worker, self._held = worker, True

    def submit(self, job) -> Future:
        return self._worker._put(job, frees_slot=False)

    def release(self) -> None:
        if self._held:
            self._held = False
            self._worker._free_slot()


class AudioChannel:
    """Audio chunks from the worker to one streamed response through a buffer of `size` chunks.
    A client that stops reading fills it; after `timeout` s without room the worker gives up
    (`put` returns False), so a stalled reader never holds the model."""

    def __init__(self, loop: asyncio.AbstractEventLoop, size: int, timeout: float):
        self._loop, self._timeout = loop, timeout
        self._items: asyncio.Queue = asyncio.Queue()
        self._room = threading.Semaphore(size)
        self.cancelled = threading.Event()   # set by either side: stop generating
        self.stalled = False                 # the worker gave up for lack of room

    def put(self, chunk) -> bool:
        """Worker side: hand over one chunk; False once the response is gone or stalled."""
        deadline = time.monotonic() + self._timeout
        while not self._room.acquire(timeout=POLL_SECONDS):
            if self.cancelled.is_set():
                return False
            if time.monotonic() > deadline:
                self.stalled = True
                self.cancelled.set()
                return False
        if self.cancelled.is_set():
            return False
        self._deliver(("audio", chunk))
        return True

    def finish(self, kind: str, value=None) -> None:
        """Worker side: the last item, ("end", None) or ("error", exception); needs no room."""
        self._deliver((kind, value))

    def _deliver(self, item) -> None:
        try:
            self._loop.call_soon_threadsafe(self._items.put_nowait, item)
        except RuntimeError:     # the event loop is closed: the server is shutting down
            self.cancelled.set()

    async def get(self):
        """Event-loop side: the next (kind, value)."""
        kind, value = await self._items.get()
        if kind == "audio":
            self._room.release()
        return kind, value
