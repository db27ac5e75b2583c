"""How the speech server answers: errors in OpenAI's shape (4xx for the caller's mistakes, a
logged 500 for ours), the guard that gives any escaped exception that shape, the busy answer,
a response for a client that already left, and the streamed response fed by a worker's
AudioChannel."""

from __future__ import annotations

import asyncio
import logging

from ..errors import BackendLost, MossTTSError
from .access import error_body, printable, refuse
from .formats import StreamEncoder
from .request import RequestError
from .worker import AudioChannel

# Retry-After (s) of a 503 for a model whose backend is lost: its host retries within seconds
# at first (hosted.py RESTART_DELAYS)
LOST_RETRY_AFTER = 5

logger = logging.getLogger(__name__)


def first_line(e: BaseException) -> str:
    return str(e).splitlines()[0] if str(e) else type(e).__name__


def error_response(status: int, message: str, **headers):
    from starlette.responses import Response

    if status == 408:   # the late body's rest is never read: the connection ends with this
        headers["Connection"] = "close"
    return Response(error_body(status, message), status_code=status, headers=headers or None,
                    media_type="application/json")


def failure_response(e: BaseException):
    """A job's exception → 4xx for the caller's mistakes, 503 for a model whose backend is
    lost (the same request may succeed once it is back), 500 (logged) for ours."""
    if isinstance(e, RequestError):
        return error_response(e.status, first_line(e))
    if isinstance(e, BackendLost):
        return error_response(503, first_line(e), **{"Retry-After": str(LOST_RETRY_AFTER)})
    if isinstance(e, MossTTSError):
        return error_response(400, first_line(e))
    log_internal("speech request failed", e)
    return error_response(500, f"internal error: {first_line(e)}")


def log_internal(what: str, e: BaseException) -> None:
    """One ERROR line for a failure of ours (the type, message and the innermost frame, what
    came from the request escaped: access.printable); the traceback goes to debug logging
    (`--debug`), so a failing route cannot flood the log."""
    tb = e.__traceback__
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    where = f" at {tb.tb_frame.f_code.co_filename}:{tb.tb_lineno}" if tb is not None else ""
    logger.error("%s: %s: %s%s", printable(what), type(e).__name__, printable(first_line(e)),
                 where)
    logger.debug("%s", what, exc_info=e)


class Guard:
    """ASGI middleware with the last word on an exception a route did not answer: OpenAI's JSON
    500 and one ERROR line (log_internal), where Starlette and uvicorn would answer a plain-text
    500 and log tracebacks; a WebSocket not yet accepted is refused the same way. A client that
    leaves while its request body arrives (Starlette's ClientDisconnect) is an INFO line and
    no answer. create_app puts one inside Starlette (before its ServerErrorMiddleware answers
    in plain text) and one around the access rules."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        from starlette.requests import ClientDisconnect

        if scope["type"] not in ("http", "websocket"):
            return await self.app(scope, receive, send)
        started = received = False

        async def watched_send(message):
            nonlocal started
            started = True
            await send(message)

        async def watched_receive():
            nonlocal received
            received = True
            return await receive()
        try:
            await self.app(scope, watched_receive, watched_send)
        except ClientDisconnect:
            logger.info("a client left while sending %s %s",
                        printable(scope.get("method", "its request")), printable(scope["path"]))
        except Exception as e:  # our bug: the client still gets an answer it can parse
            log_internal(f"{scope.get('method', 'WebSocket')} {scope['path']} failed", e)
            if started:          # once an answer has begun, the server can only end it
                return
            if scope["type"] == "websocket" and received:   # refuse() would wait for a connect
                return await send({"type": "websocket.close", "code": 1011})
            await refuse(scope, receive, send, 500, f"internal error: {first_line(e)}")


def busy_response():
    return error_response(503, "busy: too many requests are waiting", **{"Retry-After": "2"})


async def no_response(scope, receive, send) -> None:
    """For a client that already left: nothing can be delivered."""


async def client_gone(receive) -> None:
    """Returns when the client disconnects (the body has been read: nothing else arrives)."""
    while (await receive())["type"] != "http.disconnect":
        pass


async def unless_client_leaves(receive, awaitable):
    """(True, result) or (False, None) when the client left first."""
    task, gone = asyncio.ensure_future(awaitable), asyncio.ensure_future(client_gone(receive))
    try:
        await asyncio.wait({task, gone}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        gone.cancel()
    if task.done():
        return True, task.result()
    task.cancel()
    return False, None


class AudioStream:
    """A streamed response fed by an AudioChannel. A client that leaves, or that the write
    deadline cuts (connections.py), is dropped and its generation cancelled."""

    def __init__(self, first, channel: AudioChannel, encoder: StreamEncoder):
        self.first, self.channel, self.encoder = first, channel, encoder

    async def __call__(self, scope, receive, send):
        pump = asyncio.ensure_future(self._pump(send))
        gone = asyncio.ensure_future(client_gone(receive))
        try:
            await asyncio.wait({pump, gone}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            self.channel.cancelled.set()      # the worker stops at its next chunk
            # a cancel that arrives as a write completes can be lost (asyncio.wait_for on
            # Python ≤ 3.11 swallowed it; a send layer may too): the pump then waits on the
            # channel, which the stopped worker never feeds again (left behind, it was collected
            # pending: "Task was destroyed but it is pending!"). This item wakes it; the pump
            # is awaited, never left behind.
            self.channel.finish("cancelled")
            pump.cancel()
            gone.cancel()
            await asyncio.gather(pump, gone, return_exceptions=True)

    @staticmethod
    async def _send(send, body: bytes, more: bool) -> None:
        # a client that stops reading is cut at the socket after the write deadline
        # (connections.py), which this response sees as the client leaving
        await send({"type": "http.response.body", "body": body, "more_body": more})

    async def _pump(self, send):
        r = self.encoder.layout
        await send({"type": "http.response.start", "status": 200, "headers": [
            (b"content-type", self.encoder.media_type.encode()), (b"cache-control", b"no-cache"),
            (b"x-audio-sample-rate", str(r.rate).encode()),
            (b"x-audio-channels", str(r.channels).encode())]})
        kind, value = self.first
        while kind in ("audio", "progress"):
            body = self.encoder.chunk(value) if kind == "audio" else self.encoder.progress(*value)
            await self._send(send, body, True)
            kind, value = await self.channel.get()
        if kind == "end":
            await self._send(send, self.encoder.end(), False)
            return
        if kind == "cancelled":     # the client left (or stopped reading): nothing more to say
            return
        logger.error("speech stream failed after it started: %s", printable(first_line(value)),
                     exc_info=value if not isinstance(value, MossTTSError) else None)
        event = self.encoder.error(first_line(value))
        if event is not None:
            await self._send(send, event, False)
        # raw audio: returning unfinished makes the server close the connection mid-body
