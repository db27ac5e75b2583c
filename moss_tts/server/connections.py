"""How the speech server holds its connections: uvicorn's h11 and WebSocket protocols with the
limits a server facing hostile clients needs (three of its settings, settings.py), and the
uvicorn.Config that `serve` and the tests run (issue 23, holes 3 and 6).

- A connection cap (`max_connections`): past it a new connection gets a 503 at once and is
  closed, so held sockets cannot reach the process's file limit. (uvicorn's own
  `limit_concurrency` keeps the sockets open and only answers their requests 503.)
- A header deadline (`header_timeout`): a connection must complete a request's headers this
  long after it opens or after its last response, else it is closed (a slowloris, or a socket
  opened and left). uvicorn's keep-alive timer starts only after a response and stops at the
  first byte, so it bounds neither. h11 bounds the headers' size (16 KiB).
- One write deadline (`write_timeout`) for every response, whole, streamed or live: while a
  client's socket is full, it must take some bytes every `write_timeout` seconds, else it is
  cut (`transport.abort`: a polite close would wait on the same full buffer). The app then
  sees the client leave, so its work stops and its place in the line is freed.

Each such event is logged as one line at most every LOG_EVERY seconds, with a count, never
with a traceback: a client's behaviour is not the server's error.

These subclass uvicorn's protocol classes (uvicorn ≥ 0.30 names them as below); their own
behaviour is unchanged but for the three limits.
"""

from __future__ import annotations

import logging
import math
import time

from .access import error_body
from .settings import ServerSettings

logger = logging.getLogger(__name__)

LOG_EVERY = 60.0          # seconds between two log lines about one kind of client behaviour
#                           (Throttled's line says 'a minute')


class Throttled:
    """A log line for a kind of event, at most once every `every` seconds; each line says how
    many such events came since the last one."""

    def __init__(self, message: str, level: int = logging.WARNING, every: float = LOG_EVERY):
        self.message, self.level, self.every = message, level, every
        self.count, self.last = 0, -math.inf

    def __call__(self, *args) -> None:
        self.count += 1
        now = time.monotonic()
        if now - self.last >= self.every:
            tail = f" (more are counted, one line every {self.every:g} s)" if self.last == -math.inf \
                else f" ({self.count} since the last such line)"
            logger.log(self.level, self.message + tail, *args)
            self.count, self.last = 0, now


class Events:
    """A server's throttled log lines, one per kind of client behaviour."""

    def __init__(self):
        self.full = Throttled("refused a connection: %d are open (serve --max-connections)")
        self.slow_headers = Throttled("closed a connection that sent no request headers within "
                                      "%g s (serve --header-timeout)", logging.INFO)
        self.stalled = Throttled("cut a client that stopped reading: its socket took no bytes "
                                 "for %g s (serve --write-timeout)")


class WriteDeadline:
    """Mixin for a uvicorn protocol: while the transport is paused (its buffer over the high
    mark), every `write_timeout` s its buffer must have shrunk, else the client is cut."""

    settings: ServerSettings
    events: Events
    _write_check = None

    def pause_writing(self) -> None:
        super().pause_writing()
        if self._write_check is None:
            self._arm_write_check(self.transport.get_write_buffer_size())

    def resume_writing(self) -> None:
        super().resume_writing()
        self._disarm_write_check()

    def connection_lost(self, exc) -> None:
        self._disarm_write_check()
        super().connection_lost(exc)

    def _arm_write_check(self, size: int) -> None:
        self._write_check = self.loop.call_later(self.settings.write_timeout,
                                                 self._check_progress, size)

    def _disarm_write_check(self) -> None:
        if self._write_check is not None:
            self._write_check.cancel()
            self._write_check = None

    def _check_progress(self, size: int) -> None:
        now = self.transport.get_write_buffer_size()
        if now < size:       # it reads, slowly: give it another period
            self._arm_write_check(now)
            return
        self._write_check = None
        self.events.stalled(self.settings.write_timeout)
        self.transport.abort()


def protocols(settings: ServerSettings):
    """(http, ws) protocol classes for uvicorn.Config enforcing the three limits of
    `settings`."""
    from uvicorn.protocols.websockets.websockets_sansio_impl import WebSocketsSansIOProtocol

    class LiveProtocol(WriteDeadline, WebSocketsSansIOProtocol):
        pass

    http = http_protocol(settings)
    LiveProtocol.settings, LiveProtocol.events = settings, http.events
    return http, LiveProtocol


def http_protocol(settings: ServerSettings):
    """uvicorn's h11 protocol with the connection cap, the header deadline and the write
    deadline."""
    from uvicorn.protocols.http.h11_impl import H11Protocol

    class HTTPProtocol(WriteDeadline, H11Protocol):
        # the header deadline runs while the connection waits for a request: from its opening
        # and after each response, until a request cycle other than the last one begins
        _header_check = _waited_cycle = None

        def connection_made(self, transport) -> None:
            if len(self.connections) >= settings.max_connections:
                self.events.full(len(self.connections))
                transport.write(busy_answer())
                transport.close()
                return
            super().connection_made(transport)
            self._await_headers()

        def connection_lost(self, exc) -> None:
            self._stop_header_check()
            if self.transport is not None:     # None: refused in connection_made
                super().connection_lost(exc)

        def data_received(self, data: bytes) -> None:
            super().data_received(data)
            if self.cycle is not self._waited_cycle:    # a request's headers arrived
                self._stop_header_check()

        def handle_websocket_upgrade(self, event) -> None:
            self._stop_header_check()
            super().handle_websocket_upgrade(event)

        def on_response_complete(self) -> None:
            done = self.cycle
            super().on_response_complete()     # may start a pipelined request's cycle
            if self.cycle is done and not self.transport.is_closing():
                self._await_headers()

        def _await_headers(self) -> None:
            self._stop_header_check()
            self._waited_cycle = self.cycle
            self._header_check = self.loop.call_later(settings.header_timeout, self._no_headers)

        def _stop_header_check(self) -> None:
            if self._header_check is not None:
                self._header_check.cancel()
                self._header_check = None

        def _no_headers(self) -> None:
            self._header_check = None
            if self.cycle is self._waited_cycle and not self.transport.is_closing():
                self.events.slow_headers(settings.header_timeout)
                self.transport.close()

    HTTPProtocol.settings, HTTPProtocol.events = settings, Events()
    return HTTPProtocol


def busy_answer() -> bytes:
    """A whole HTTP 503 in OpenAI's error shape, written before any request is read."""
    body = error_body(503, "busy: too many connections are open; retry shortly")
    return (b"HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\n"
            b"retry-after: 2\r\nconnection: close\r\ncontent-length: %d\r\n\r\n%s"
            % (len(body), body))


def uvicorn_config(app, settings: ServerSettings = ServerSettings(), **config):
    """uvicorn.Config for `app` with the connection limits of `settings` (other keywords pass
    through)."""
    import uvicorn

    http, ws = protocols(settings)
    return uvicorn.Config(app, http=http, ws=ws, **{"log_level": "warning"} | config)
