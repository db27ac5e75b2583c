"""Who may talk to the speech server: ASGI middleware for the Host allow-list (DNS rebinding),
foreign Origins (cross-site writes), the optional API key, CORS, and the access log.
"""

from __future__ import annotations

import contextvars
import hmac
import json
import logging
import time

logger = logging.getLogger(__name__)
access_logger = logging.getLogger("moss_tts.access")

# the loopback addresses: the Host names they answer to (host_name) are always served, and
# binding one needs no API key (serve warns of any other without one)
LOOPBACK = ("127.0.0.1", "localhost", "::1")
OPEN_PATHS = ("/health", "/")   # the page is static HTML; its requests carry the key themselves


# what `printable` writes for the characters that would change a log line's fields
LOG_QUOTED = {"\\": "\\\\", '"': '\\"'}


def printable(text: str) -> str:
    """`text` as one log line may hold it: control and other non-printing characters (CR, LF,
    ESC, U+2028, ...) as Python escapes, and backslash and '"' escaped, so a request (a
    percent-encoded CR LF in its path) can neither forge a line nor split a quoted field."""
    return "".join(LOG_QUOTED.get(c) or (c if c.isprintable()
                                         else c.encode("unicode_escape").decode("ascii"))
                   for c in text)


def error_body(status: int, message: str, code: str | None = None) -> bytes:
    """OpenAI's error shape."""
    kind = "invalid_request_error" if status < 500 else "server_error"
    return json.dumps({"error": {"message": message, "type": kind, "param": None,
                                 "code": code}}).encode()


async def send_error(send, status: int, message: str, code: str | None = None,
                     headers: tuple = ()) -> None:
    body = error_body(status, message, code)
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"),
                            (b"content-length", str(len(body)).encode()), *headers]})
    await send({"type": "http.response.body", "body": body})


def host_name(bind_host: str) -> str:
    """How a bind address appears in a Host header (IPv6 in brackets)."""
    return f"[{bind_host}]" if ":" in bind_host and not bind_host.startswith("[") else bind_host


def served_hosts(bind_host: str, allowed_hosts) -> set[str]:
    """The Host names (lower case) a server bound to `bind_host` answers to: the loopback
    names, its own, and the `allowed_hosts` extras ('*': any)."""
    return {h.lower() for h in (*map(host_name, LOOPBACK), host_name(bind_host), *allowed_hosts)}


def split_host(value: str) -> tuple[str, int | None]:
    """'name:port' / '[v6]:port' / 'name' → (lower-case name, port or None)."""
    name, sep, port = value.rpartition(":")
    if not sep or name.endswith(":") or (value.startswith("[") and not name.endswith("]")):
        return value.lower(), None          # no port (or a bare IPv6 literal)
    # a port's five digits at most: int() of 4,300 digits raises (a plain-text 500 once)
    return name.lower(), int(port) if port.isdigit() and len(port) <= 5 else -1


class Gate:
    """Refuses, before any work: a Host outside the allow-list (400), a foreign Origin or more
    than one Origin header (403: of two, the last one won, so a foreign one could hide behind
    the page's own), and — with an API key — a request without `Authorization: Bearer KEY`
    (401) on every path but /health and the page. WebSocket handshakes pass the same checks
    (the key may also come as `?api_key=`). CORS preflights are answered by the inner CORS
    layer, which sits between the origin check and the key check."""

    def __init__(self, app, *, hosts: set[str], origins: set[str], api_key: str | None):
        from starlette.middleware.cors import CORSMiddleware

        self.hosts, self.origins, self.api_key = hosts, origins, api_key
        self.inner = CORSMiddleware(self._authorized(app), allow_origins=sorted(origins),
                                    allow_methods=["GET", "POST", "DELETE"],
                                    allow_headers=["Authorization", "Content-Type"],
                                    expose_headers=["X-Audio-Sample-Rate", "X-Audio-Channels"])

    async def __call__(self, scope, receive, send):
        if scope["type"] not in ("http", "websocket"):
            return await self.inner(scope, receive, send)
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        host = headers.get("host", "")
        name, port = split_host(host)
        secure = scope.get("scheme") in ("https", "wss")
        server_port = (scope.get("server") or (None, None))[1]
        if "*" not in self.hosts and (name not in self.hosts or (
                server_port is not None and (port or (443 if secure else 80)) != server_port)):
            return await refuse(scope, receive, send, 400, f"Host {host!r} is not served here; "
                                "start the server with --allowed-host NAME to add a name")
        origins = [v.decode("latin-1") for k, v in scope["headers"] if k.lower() == b"origin"]
        if len(origins) > 1:
            return await refuse(scope, receive, send, 403, f"{len(origins)} Origin headers: a "
                                "request comes from one origin; send one Origin header")
        origin = origins[0] if origins else None
        if origin is not None and origin not in self.origins \
                and origin != f"{'https' if secure else 'http'}://{host}":
            return await refuse(scope, receive, send, 403, f"cross-origin requests from "
                                f"{origin!r} are refused; start the server with --cors-origin "
                                f"{origin} to allow them")
        await self.inner(scope, receive, send)

    def _authorized(self, app):
        async def check_key(scope, receive, send):
            if self.api_key is None or scope["type"] not in ("http", "websocket") \
                    or scope["path"] in OPEN_PATHS:
                return await app(scope, receive, send)
            if not hmac.compare_digest(given_key(scope).encode(), self.api_key.encode()):
                return await refuse(scope, receive, send, 401, "missing or wrong API key: send "
                                    "'Authorization: Bearer KEY' (a browser's WebSocket: "
                                    "?api_key=KEY)", "invalid_api_key",
                                    ((b"www-authenticate", b"Bearer"),))
            await app(scope, receive, send)
        return check_key


def given_key(scope) -> str:
    """The request's API key: `Authorization: Bearer KEY`, or for a WebSocket (a browser cannot
    set its headers) the `api_key` query parameter."""
    from urllib.parse import parse_qs

    given = dict(scope["headers"]).get(b"authorization", b"").decode("latin-1")
    scheme, _, token = given.partition(" ")
    if scheme.lower() == "bearer":
        return token.strip()
    if scope["type"] == "websocket":
        query = parse_qs(scope.get("query_string", b"").decode("latin-1"))
        return query.get("api_key", [""])[0]
    return ""


async def refuse(scope, receive, send, status: int, message: str, code: str | None = None,
                 headers: tuple = ()) -> None:
    """An HTTP error answer; for a WebSocket handshake the same answer when the server can send
    one (ASGI's denial-response extension), else a close before accept (the client sees 403).
    A refused handshake is one INFO line, as the access log is for HTTP."""
    if scope["type"] == "http":
        return await send_error(send, status, message, code, headers)
    client = scope.get("client") or ("-", 0)
    logger.info("refused a WebSocket handshake from %s: %d %s", printable(str(client[0])), status,
                printable(message))
    DENIED.set(True)    # this connection's task: see DenialNoise
    await receive()   # websocket.connect
    if "websocket.http.response" not in scope.get("extensions", {}):
        return await send({"type": "websocket.close", "code": 1008, "reason": message[:120]})
    body = error_body(status, message, code)
    await send({"type": "websocket.http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"),
                            (b"content-length", str(len(body)).encode()), *headers]})
    await send({"type": "websocket.http.response.body", "body": body})


DENIED = contextvars.ContextVar("moss_tts_handshake_denied", default=False)
UVICORN_DENIAL_NOISE = "ASGI callable returned without completing handshake."


class DenialNoise(logging.Filter):
    """uvicorn's websockets-sansio protocol (0.54; Kludex/uvicorn#3138, open) logs
    UVICORN_DENIAL_NOISE at ERROR after every denial response, though the client got the
    answer. uvicorn logs it in the connection's task right after the app returns, where
    refuse() has set DENIED: only that record is dropped, any other stays."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not (DENIED.get() and record.getMessage() == UVICORN_DENIAL_NOISE)


DENIAL_NOISE = DenialNoise()


def quiet_uvicorn_denials() -> None:
    """Installs DenialNoise on uvicorn's error logger (once: addFilter skips a filter it has)."""
    logging.getLogger("uvicorn.error").addFilter(DENIAL_NOISE)


class AccessLog:
    """One line per request: client, method, path, status, body bytes, milliseconds. Written as
    the last body part goes out (or when a response ends unfinished: status 0 if never begun)."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        start, seen = time.perf_counter(), {"status": 0, "bytes": 0, "logged": False}

        def log():
            seen["logged"] = True
            client = scope.get("client") or ("-", 0)
            access_logger.info('%s "%s %s" %d %d %.0f ms', printable(str(client[0])),
                               printable(scope["method"]), printable(scope["path"]),
                               seen["status"], seen["bytes"], 1e3 * (time.perf_counter() - start))

        async def counting_send(message):
            if message["type"] == "http.response.start":
                seen["status"] = message["status"]
            elif message["type"] == "http.response.body":
                seen["bytes"] += len(message.get("body", b""))
                if not message.get("more_body", False):
                    log()
            await send(message)
        try:
            await self.app(scope, receive, counting_send)
        finally:
            if not seen["logged"]:
                log()
