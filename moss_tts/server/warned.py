"""What a model warns while it serves a request (a frame budget that cut the audio) goes to the
server's log as one line naming the request, never to stderr as Python prints a warning: the
worker thread marks whose chunk it is pulling (`pulled_for`), and one hook (`route_warnings`,
installed by create_app) sends what is warned on a marked thread to the log. Warnings of
unmarked threads go on to the hook that was there before."""

from __future__ import annotations

import contextlib
import logging
import threading
import warnings

from ..knobs import advice

logger = logging.getLogger(__name__)
_serving = threading.local()      # .request: the request the thread's current pull serves
_END = object()


def route_warnings() -> None:
    """Install the hook (once; a hook installed since, e.g. by a test, is wrapped again)."""
    before = warnings.showwarning
    if getattr(before, "routes_to_log", False):
        return

    def show(message, category, filename, lineno, file=None, line=None):
        request = getattr(_serving, "request", None)
        if request is None:
            return before(message, category, filename, lineno, file, line)
        text = " ".join(advice(message, "request").split())    # one line, fields as sent
        logger.warning("%s: %s", request, text)

    show.routes_to_log = True
    warnings.showwarning = show


@contextlib.contextmanager
def serving(request: str):
    """Inside it, what this thread warns is logged as `request`'s (a worker's job, or one pull
    of a request's stream)."""
    before = getattr(_serving, "request", None)
    _serving.request = request
    try:
        yield
    finally:
        _serving.request = before


def pulled_for(request: str, chunks):
    """`chunks` (a model's stream), each one pulled `serving(request)`; the stream is closed
    when this generator is."""
    chunks = iter(chunks)
    try:
        while True:
            with serving(request):
                chunk = next(chunks, _END)
            if chunk is _END:
                return
            yield chunk
    finally:
        close = getattr(chunks, "close", None)
        if close is not None:
            close()


def request_name(request, model_name: str) -> str:
    """How the log names a speech request: its client and model."""
    client = request.client
    where = f"{client.host}:{client.port}" if client else "a client"
    return f"speech for {where} (model {model_name})"
