"""A served model that lives in a child process, so that losing its backend loses only the child
(design §6 Faults; docs/server.md "A backend that fails"). ggml ends the whole process when a
remote or device backend fails mid-call (a lost RPC server: GGML_ABORT in ggml-rpc.cpp, and
nothing returns to the caller: ggml/log.py), so no thread of the server can survive it; a child
can. The server's worker thread uses a `HostedModel` as it uses a loaded TTS: each call,
attribute read and step of a stream goes to the child over a pipe; data (text, numbers, numpy
arrays, References) crosses by value, everything else (a stream, a live session, the codec)
stays in the child behind a handle. When the child dies, the request in flight and every later
one get `BackendLost` (503) until a new child has loaded the model again (reconnecting to the
backend and uploading the weights), which the host retries in the background.
"""

from __future__ import annotations

import dataclasses
import logging
import multiprocessing
import os
import threading
import time
import warnings
from collections import deque
from dataclasses import dataclass

import numpy as np

from ..errors import BackendLost, InputError, MossTTSError
from ..lifetime import end_with_parent

logger = logging.getLogger(__name__)

# seconds between attempts to bring a lost model back: soon at first, then every half minute
RESTART_DELAYS = (1.0, 2.0, 5.0, 10.0, 30.0)
LOAD_TIMEOUT = 900.0     # a child that has not loaded its model by then is taken as failed
STOP_TIMEOUT = 10.0      # a child's time to free its model when the server stops


@dataclass(frozen=True)
class HostSpec:
    """What a child loads: `load_tts(model, codec=codec, backend=backend, threads=threads)`."""

    model: str
    codec: str | None
    backend: str
    threads: int | None = None


@dataclass(frozen=True)
class ModelInfo:
    """What the server knows of a model without calling it (served.py)."""

    family: str                 # its registry kind
    name: str                   # the name people know
    batched: bool               # several streams per decode step (models/batching.py)
    live: bool                  # a live session (`session`)
    sample_rate: int
    channels: int
    codec: dict | None          # reference.codec_info of its codec


def describe(tts) -> ModelInfo:
    """A served TTS's ModelInfo (a HostedModel has its child's). What a family does not
    declare it lacks: the batched decoder (BATCHED), the live mode (LIVE), a codec."""
    if isinstance(tts, HostedModel):
        return tts.info
    from ..reference import codec_info

    cls, codec = type(tts), getattr(tts, "codec", None)
    return ModelInfo(cls.FAMILY, getattr(cls, "NAME", "") or cls.__name__,
                     cls.BATCHED is not None, cls.LIVE, tts.sample_rate, tts.channels,
                     None if codec is None else codec_info(codec))


# -- the child ---------------------------------------------------------------------------------
def _is_data(value) -> bool:
    """Whether `value` crosses the pipe by value (what a model takes and returns as data)."""
    if value is None or isinstance(value, (bool, int, float, str, bytes, np.ndarray,
                                           np.generic)):
        return True
    if isinstance(value, (tuple, list)):
        return all(_is_data(v) for v in value)
    if isinstance(value, dict):
        return all(isinstance(k, str) and _is_data(v) for k, v in value.items())
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return all(_is_data(getattr(value, f.name)) for f in dataclasses.fields(value))
    return False


class _Objects:
    """The child's table of what it lent the parent by handle (handle 0: the model). What a
    call made (a stream, a live session) is the parent's to close; what an attribute read lent
    (the model's codec) belongs to its owner, and is never closed for the parent."""

    def __init__(self, tts):
        self.table, self.next, self.attrs = {0: tts}, 1, {}

    def pack(self, value):
        if _is_data(value):
            return ("value", value)
        handle, self.next = self.next, self.next + 1
        self.table[handle] = value
        return ("handle", handle, hasattr(value, "__next__"))

    def attribute(self, handle: int, name: str):
        obj = self.table[handle]
        value = getattr(obj, name)
        if callable(value) and not isinstance(value, type):
            return ("method",)
        if (handle, name) not in self.attrs:        # one handle per attribute, not per read
            self.attrs[handle, name] = self.pack(value)
        return self.attrs[handle, name]

    def close(self, handle: int) -> None:
        if handle == 0 or handle in {reply[1] for reply in self.attrs.values()
                                     if reply[0] == "handle"}:
            return                  # the model, or a part of it lent by an attribute read
        obj = self.table.pop(handle, None)
        close = getattr(obj, "close", None)
        if close is not None:
            close()


def _exception(e: BaseException) -> BaseException:
    """An exception as it can cross the pipe (one that does not pickle becomes a MossTTSError
    of the same message, so the parent still answers with the right class of error)."""
    import pickle

    try:
        pickle.loads(pickle.dumps(e))
        return e
    except Exception:
        if isinstance(e, Warning):
            return UserWarning(str(e))
        kind = InputError if isinstance(e, InputError) else MossTTSError
        return kind(str(e)) if isinstance(e, MossTTSError) else RuntimeError(
            f"{type(e).__name__}: {e}")


def _serve(conn, objects: _Objects) -> None:
    together = None
    while True:
        message = conn.recv()
        op, args = message[0], message[1:]
        if op == "stop":
            break
        with warnings.catch_warnings(record=True) as heard:
            warnings.simplefilter("always")
            try:
                if op == "together":          # enter / leave decoding_together(n)
                    if together is not None:
                        together.__exit__(None, None, None)
                        together = None
                    if args[0] is not None:
                        together = objects.table[0].decoding_together(args[0])
                        together.__enter__()
                    reply = ("value", None)
                elif op == "getattr":
                    reply = objects.attribute(*args)
                elif op == "call":
                    handle, name, a, kw = args
                    target = objects.table[handle]
                    reply = objects.pack(getattr(target, name)(*a, **kw) if name else target(*a, **kw))
                elif op == "next":
                    try:
                        reply = objects.pack(next(objects.table[args[0]]))
                    except StopIteration as end:
                        objects.table.pop(args[0], None)
                        reply = ("stop", end.value if _is_data(end.value) else None)
                elif op == "close":
                    for handle in args[0]:
                        objects.close(handle)
                    reply = ("value", None)
                else:
                    raise RuntimeError(f"unknown request {op!r}")
            except BaseException as e:   # the caller's error, raised again in the parent
                reply = ("error", _exception(e))
        conn.send((reply, [_exception(w.message) if isinstance(w.message, Warning)
                           else UserWarning(str(w.message)) for w in heard]))
    if together is not None:
        together.__exit__(None, None, None)


def _host_main(conn, spec: HostSpec) -> None:
    """The child: load the model, say it is ready (with its ModelInfo), serve requests until
    told to stop or the parent is gone. A ggml abort (the backend lost) is sent to the parent
    as one message before the child ends."""
    import signal

    from ..ggml.log import on_abort

    signal.signal(signal.SIGINT, signal.SIG_IGN)     # the server stops its children itself
    end_with_parent()

    def lost(message: str) -> None:
        try:
            conn.send(("lost", message))
        finally:
            os._exit(1)

    on_abort(lost)
    try:
        from .. import load_tts

        tts = load_tts(spec.model, codec=spec.codec, backend=spec.backend, threads=spec.threads)
    except BaseException as e:
        conn.send(("failed", str(e).splitlines()[0] if str(e) else type(e).__name__))
        return
    try:
        conn.send(("ready", describe(tts)))
        _serve(conn, _Objects(tts))
    except (EOFError, OSError):    # the parent is gone
        pass
    finally:
        tts.close()


# -- the parent --------------------------------------------------------------------------------
class _Handle:
    """Something the child lent by handle: its attributes and methods are the child's."""

    def __init__(self, host: "HostedModel", handle: int, generation: int):
        object.__setattr__(self, "_host", host)
        object.__setattr__(self, "_handle", handle)
        object.__setattr__(self, "_generation", generation)

    def __getattr__(self, name: str):
        if name.startswith("__"):
            raise AttributeError(name)
        got = self._host._request(self._generation, "getattr", self._handle, name)
        if got is _METHOD:
            return lambda *a, **kw: self._host._request(self._generation, "call", self._handle,
                                                        name, a, kw)
        return got

    def __call__(self, *a, **kw):
        return self._host._request(self._generation, "call", self._handle, None, a, kw)

    def __del__(self):       # as a dropped object closes in-process, a little later
        host = self.__dict__.get("_host")
        if host is not None and self._handle:
            host._closing.append((self._generation, self._handle))


class _Stream(_Handle):
    """A generator the child lent: `next` steps it there; closing closes it there."""

    def __iter__(self):
        return self

    def __next__(self):
        return self._host._request(self._generation, "next", self._handle)

    def close(self):
        self._host._request(self._generation, "close", [self._handle])
        object.__setattr__(self, "_handle", 0)


_METHOD = object()


class HostedModel:
    """A TTS served from a child process (see the module docstring). Used from one thread at
    a time (the model's worker), but `available` / `problem` may be read from any."""

    def __init__(self, spec: HostSpec, name: str):
        self.spec, self.name = spec, name
        self._ctx = multiprocessing.get_context("spawn")  # fork would copy the server's threads
        self._lock = threading.RLock()
        self._closing: deque = deque()     # handles dropped in the parent, to close in the child
        self._process = self._conn = None
        self._generation = 0
        self._together = None
        self._stopped = threading.Event()
        self.problem: str | None = None
        self.retry_at: float | None = None
        self.info = self._start()          # a model that cannot load at all is the server's error

    # -- state -------------------------------------------------------------------------------
    @property
    def available(self) -> bool:
        return self._conn is not None

    def status(self) -> dict:
        """For /health and /v1/models: available, and while not, why and when it retries."""
        if self.available:
            return {"available": True}
        wait = None if self.retry_at is None else max(0.0, self.retry_at - time.monotonic())
        return {"available": False, "problem": self.problem, "retry_in": wait}

    def _start(self) -> ModelInfo:
        parent, child = self._ctx.Pipe()
        process = self._ctx.Process(target=_host_main, args=(child, self.spec),
                                    name=f"moss-tts-host-{self.name}", daemon=True)
        process.start()
        child.close()
        try:
            if not parent.poll(LOAD_TIMEOUT):
                raise BackendLost(f"model {self.name}: its process did not load it within "
                                  f"{LOAD_TIMEOUT:.0f} s")
            kind, value = parent.recv()
        except (EOFError, OSError):
            kind, value = "failed", f"its process ended with status {process.exitcode}"
        except BaseException:
            process.kill()
            raise
        if kind != "ready":
            parent.close()
            process.kill()
            process.join()
            raise BackendLost(f"model {self.name} on {self.spec.backend}: {value}")
        self._process, self._conn = process, parent
        if self._together is not None:
            self._send("together", self._together)
        return value

    # -- requests ----------------------------------------------------------------------------
    def __getattr__(self, name: str):
        if name.startswith("_"):
            raise AttributeError(name)
        return _Handle(self, 0, self._generation).__getattr__(name)

    def decoding_together(self, max_streams: int):
        """The child decodes several streams per step from now on (and again after a
        restart), until the context is left."""
        return _Together(self, max_streams)

    def _request(self, generation: int, op: str, *args):
        with self._lock:
            if generation != self._generation or self._conn is None:
                raise BackendLost(self.unavailable())
            return self._send(op, *args)

    def _send(self, op: str, *args):
        dropped = [h for g, h in self._drain_closing() if g == self._generation]
        try:
            if dropped:
                self._exchange(("close", dropped))
            reply = self._exchange((op, *args))
        except (EOFError, OSError, _Lost) as e:
            self._lose(e.message if isinstance(e, _Lost) else
                       f"its process ended ({type(e).__name__})")
            raise BackendLost(self.unavailable()) from None
        kind = reply[0]
        if kind == "error":
            raise reply[1]
        if kind == "stop":
            raise StopIteration(reply[1])
        if kind == "method":
            return _METHOD
        if kind == "handle":
            cls = _Stream if reply[2] else _Handle
            return cls(self, reply[1], self._generation)
        return reply[1]

    def _exchange(self, message):
        self._conn.send(message)
        got = self._conn.recv()
        if got[0] == "lost":
            raise _Lost(got[1])
        reply, heard = got
        for warning in heard:               # what the child's call warned, heard here
            warnings.warn(warning, stacklevel=4)
        return reply

    def _drain_closing(self):
        while self._closing:
            yield self._closing.popleft()

    def unavailable(self) -> str:
        """Why requests to it fail now, and when it is tried again."""
        why = self.problem or "it is not running"
        wait = self.status().get("retry_in")
        again = f"; retrying in {wait:.0f} s" if wait is not None else ""
        return f"model {self.name} is unavailable: {why}{again}"

    def _lose(self, message: str) -> None:
        from ..ggml.log import abort_cause

        self.problem = f"{abort_cause(message)} on {self.spec.backend}"
        logger.error("model %s: %s; its requests fail with 503 until it is back",
                     self.name, self.problem)
        self._generation += 1
        conn, process, self._conn, self._process = self._conn, self._process, None, None
        conn.close()
        process.kill()
        process.join()
        threading.Thread(target=self._restart, name=f"moss-tts-restart-{self.name}",
                         daemon=True).start()

    def _restart(self) -> None:
        for attempt in range(10**9):
            delay = RESTART_DELAYS[min(attempt, len(RESTART_DELAYS) - 1)]
            self.retry_at = time.monotonic() + delay
            if self._stopped.wait(delay):
                return
            try:
                with self._lock:
                    if self._stopped.is_set():
                        return
                    self._start()
                    self.problem = self.retry_at = None
                logger.warning("model %s is back on %s", self.name, self.spec.backend)
                return
            except BackendLost as e:
                self.problem = str(e)

    def close(self) -> None:
        self._stopped.set()
        with self._lock:
            conn, process, self._conn, self._process = self._conn, self._process, None, None
            if conn is not None:
                try:
                    conn.send(("stop",))
                except OSError:
                    pass
                process.join(STOP_TIMEOUT)
                conn.close()
            if process is not None and process.is_alive():
                process.kill()
                process.join()


class _Lost(Exception):
    def __init__(self, message: str):
        self.message = message


class _Together:
    def __init__(self, host: HostedModel, n: int):
        self.host, self.n = host, n

    def __enter__(self):
        with self.host._lock:
            self.host._together = self.n
            if self.host.available:
                self.host._request(self.host._generation, "together", self.n)
        return self

    def __exit__(self, *exc):
        with self.host._lock:
            self.host._together = None
            if self.host.available:
                self.host._request(self.host._generation, "together", None)
