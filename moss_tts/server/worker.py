"""The speech server's model worker: the one thread that uses the model, fed by a bounded line of
jobs, and the bounded hand-off of streamed audio from that thread to the event loop.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections import deque
from concurrent.futures import Future

from ..errors import BackendError

POLL_SECONDS = 0.05      # how often a worker waiting for buffer room looks for a cancel
EMPTY = object()         # _next_job: nothing may be taken now


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
    pulled, a finished one leaves, and a short job (a voice upload) runs between two pulls.

    Live sessions (`open_lane`) with max_streams > 1 take a stream place each: a session's
    first job waits in the line like a speech request until a place is free, and from then
    until `Lane.release` the session holds that place, so open sessions and running speech
    jobs together never number more than max_streams, and speech requests wait in the line
    while sessions hold every place. A placed session's jobs go ahead of the line and run
    between two pulls, free place or not. With max_streams 1 a lane holds only its slot in
    the line and its jobs queue with the others' (the session and the requests take turns)."""

    def __init__(self, model, depth: int, name: str = "moss-tts-model", max_streams: int = 1):
        places = depth + max_streams
        self._slots = threading.BoundedSemaphore(places)
        self._free, self._count = places, threading.Lock()   # what the semaphore holds
        self._line = threading.Condition()      # guards the three below
        self._jobs: deque = deque()             # waiting, in arrival order (None: stop)
        self._urgent: deque = deque()           # jobs of live sessions that hold a place
        self._placed = 0                        # live sessions holding a stream place
        self._closing = False
        self.max_streams = max_streams
        self._thread = threading.Thread(target=self._run if max_streams == 1 else self._together,
                                        name=name, daemon=True)
        self.model = OwnedModel(model, self._thread)
        self._thread.start()

    def submit(self, job, *, stream: bool = False) -> Future | None:
        """A future of job(model), or None when the line is full (the server answers 503).
        `stream`: job(model) is a generator that yields after each chunk it makes and returns
        the result; alone it is run through, with max_streams > 1 beside the others. It yields
        None after a chunk, or an object with `wait_for_room(seconds)` (an AudioChannel) when
        it cannot go on until its client reads: the worker pulls the others meanwhile, or
        waits a while when no job can go on."""
        if not self._take_slot():
            return None
        return self._put(job, frees_slot=True, stream=stream)

    def open_lane(self) -> Lane | None:
        """A slot held for a long-lived client (a live connection), or None when the line is
        full: the client counts as one request in the line until `Lane.release` (and, with
        max_streams > 1, as one running stream from its first job on: see the class)."""
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

    def _put(self, job, *, frees_slot: bool, stream: bool = False, lane: Lane | None = None):
        future: Future = Future()
        with self._line:
            placed = lane is not None and lane.placed
            (self._urgent if placed else self._jobs).append((job, future, frees_slot, stream,
                                                             lane))
            self._line.notify()
        return future

    def _next_job(self, room, block: bool, served=()):
        """The next job to start: a placed session's first (of a session not in `served`),
        then the line's oldest while `room()` says a stream place is free (the stop mark
        always) → the item, None to stop, or EMPTY when nothing may be taken now (`block`
        False, or only jobs of sessions `served` wait). Taking a lane's job places its
        session (max_streams > 1)."""
        with self._line:
            while True:
                urgent = next((item for item in self._urgent if item[4] not in served), None)
                if urgent is not None:
                    self._urgent.remove(urgent)
                    return urgent
                if self._jobs and (self._jobs[0] is None or room()):
                    item = self._jobs.popleft()
                    if item is not None and item[4] is not None and self.max_streams > 1:
                        item[4].place()
                    return item
                if not block or self._urgent:
                    return EMPTY
                self._line.wait()

    def _run(self) -> None:
        while (item := self._next_job(lambda: True, block=True)) is not None:
            job, future, frees_slot, stream, _ = item
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
        """The loop of max_streams > 1: run placed sessions' jobs and take new jobs while a
        stream place is free (waiting only when nothing runs), then pull one chunk of each
        running speech job in turn; when none of them can go on (their clients' buffers
        full), wait up to POLL_SECONDS for new work before the next round. A session runs at
        most one job a round: one that keeps submitting (a text flood) gets its turn between
        two pulls, as each running request does, and cannot starve them."""
        running: list = []      # [generator, future, frees_slot]
        served: set = set()     # the lanes whose job ran this round

        def room() -> bool:     # a closing server drains its line whatever sessions hold
            return len(running) + (0 if self._closing else self._placed) < self.max_streams

        with self.model.decoding_together(self.max_streams):
            while True:
                while (item := self._next_job(room, not running, served)) is not EMPTY:
                    if item is None:
                        return self._stop(running)
                    if item[4] is not None:
                        served.add(item[4])
                    self._start(item, running)
                if running and not self._pull(running):
                    with self._line:
                        if not self._urgent:
                            self._line.wait(POLL_SECONDS)
                served.clear()

    def _start(self, item, running: list) -> None:
        job, future, frees_slot, stream, _ = item
        if not future.set_running_or_notify_cancel():
            if frees_slot:
                self._free_slot()
        elif stream:
            running.append([job(self.model), future, frees_slot])
        else:
            self._finish((None, future, frees_slot), self._call(job))

    def _pull(self, running: list) -> bool:
        """One chunk of each running job in turn → whether any of them went on (made a chunk
        or ended) rather than wait for its client."""
        moved = False
        for entry in list(running):
            try:
                waiting = next(entry[0])
            except StopIteration as end:
                running.remove(entry)
                self._finish(entry, (end.value, None))
            except BaseException as e:   # this request's failure, not the others'
                running.remove(entry)
                self._finish(entry, (None, e))
            else:
                moved = moved or waiting is None
                continue
            moved = True
        return moved

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
        with self._line:
            self._closing = True
            self._jobs.append(None)
            self._line.notify()
        self._thread.join()


def run_through(steps):
    """A stream job run to its end alone: its return value (waiting for room when it asks)."""
    while True:
        try:
            waiting = next(steps)
        except StopIteration as end:
            return end.value
        if waiting is not None:
            waiting.wait_for_room(POLL_SECONDS)


def settle(future: Future, result, error) -> None:
    if error is not None:
        future.set_exception(error)
    else:
        future.set_result(result)


class Lane:
    """One held slot of a worker's line: its jobs join the line like any request's, but never
    find it full (the slot is already taken), so a live session can always be fed and closed.
    With max_streams > 1 it also holds a stream place once its first job is taken (`placed`),
    and its jobs then go ahead of the line."""

    def __init__(self, worker: ModelWorker):
        self._worker, self._held, self.placed = worker, True, False

    def submit(self, job) -> Future:
        return self._worker._put(job, frees_slot=False, lane=self)

    def place(self) -> None:
        """Worker side, under the line's lock: the session takes a stream place (unless it was
        released while its job waited)."""
        if self._held and not self.placed:
            self.placed = True
            self._worker._placed += 1

    def release(self) -> None:
        worker = self._worker
        with worker._line:
            if not self._held:
                return
            self._held = False
            if self.placed:         # its place is free for the line's next job
                self.placed = False
                worker._placed -= 1
                worker._line.notify()
        worker._free_slot()


class AudioChannel:
    """Audio chunks from the worker to one streamed response through a buffer of `size` chunks.
    A client that stops reading fills it; the worker never waits on it (`offer`), and after
    `timeout` s without room gives up, so a stalled reader never holds the model, nor the
    other streams decoded beside it."""

    def __init__(self, loop: asyncio.AbstractEventLoop, size: int, timeout: float):
        self._loop, self._timeout = loop, timeout
        self._items: asyncio.Queue = asyncio.Queue()
        self._room = threading.Semaphore(size)
        self._full_since: float | None = None
        self.cancelled = threading.Event()   # set by either side: stop generating
        self.stalled = False                 # the worker gave up for lack of room

    def offer(self, chunk) -> bool | None:
        """Worker side, never waiting: True once the chunk is handed over; None while the
        buffer is full (offer it again later; `wait_for_room`); False once the response is
        gone, or stalled: full for `timeout` s in a row."""
        if self.cancelled.is_set():
            return False
        if not self._room.acquire(blocking=False):
            now = time.monotonic()
            if self._full_since is None:
                self._full_since = now
            elif now - self._full_since > self._timeout:
                self.stalled = True
                self.cancelled.set()
                return False
            return None
        self._full_since = None
        self._deliver(("audio", chunk))
        return True

    def wait_for_room(self, seconds: float) -> None:
        """Worker side: returns once the buffer has room, or after `seconds`."""
        if self._room.acquire(timeout=seconds):
            self._room.release()

    def progress(self, done: int, total: int) -> None:
        """Worker side: how far the work before the audio is (a sampler's steps); needs no
        room: at most one per step, and the steps are bounded by the family's budget."""
        if not self.cancelled.is_set():
            self._deliver(("progress", (done, total)))

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
