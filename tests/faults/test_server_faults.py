"""Faults a client injects into the speech server (issue 31, findings 5 and 6), on a real uvicorn
bound to loopback with a stub model, over raw sockets and the stock `openai` client: a request
body that stalls or trickles is answered 408 and frees its connection; headers that trickle are
cut by the header deadline; a streamed request gives its place back before its last bytes go
out. Each waits on the server's side (a socket's end, a state), with generous safety bounds,
never for time to pass and never asserting a time."""

import asyncio
import contextlib
import json
import socket
import threading
import time

import pytest

from moss_tts.server import create_app
from moss_tts.server.worker import AudioChannel
from moss_tts.server.settings import ServerSettings
from tests.server.helpers import (BOUND, StubTTS, call, client_of, free_places, raw_post,
                                  read_to_end, settings, until)

DEADLINE = 1.0       # the body (or header) deadline the servers here run with, in seconds
FOREVER = 10**6      # a Content-Length no trickle here ever completes




class Trickle:
    """Sends `data` to `sock` one byte every `every` s from a thread, until the server ends the
    connection (or `stop`)."""

    def __init__(self, sock: socket.socket, data: bytes, every: float = 0.05):
        self.stop = threading.Event()

        def run():
            for i in range(len(data)):
                if self.stop.wait(every):
                    return
                try:
                    sock.send(data[i:i + 1])
                except OSError:          # the server closed it: what the test waits for
                    return
        self.thread = threading.Thread(target=run, daemon=True)
        self.thread.start()

    def end(self):
        self.stop.set()
        self.thread.join(BOUND)


def body_head(port: int, length: int = FOREVER) -> bytes:
    """A speech POST's complete headers and the first byte of a body of `length` bytes."""
    return (b"POST /v1/audio/speech HTTP/1.1\r\nHost: 127.0.0.1:%d\r\nContent-Type: "
            b"application/json\r\nContent-Length: %d\r\n\r\n{" % (port, length))


def answer_of(raw: bytes) -> tuple[int, dict, dict]:
    """(status, lower-case headers, JSON body) of one raw HTTP answer."""
    head, _, body = raw.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = dict(line.lower().split(": ", 1) for line in lines[1:])
    return int(lines[0].split()[1]), headers, json.loads(body)


# --- finding 5: a request body that stalls or trickles ------------------------------------------


def test_stalled_and_trickling_bodies_get_408_and_free_every_connection(served, tmp_path):
    """--max-connections clients send their headers and one byte of a body, then nothing (two
    of them) or a byte every 50 ms (two): each is answered 408 in OpenAI's shape (a trickler
    may instead see its socket reset: the server closes with its bytes unread), every
    connection is freed, and /health and speech answer again."""
    app = create_app(StubTTS(), settings(tmp_path / "voices", body_timeout=DEADLINE))
    s = served(app, ServerSettings(max_connections=4))
    socks = [socket.create_connection(("127.0.0.1", s.port)) for _ in range(4)]
    for sock in socks:
        sock.sendall(body_head(s.port))
    trickles = [Trickle(sock, b" " * FOREVER) for sock in socks[2:]]
    answers = [read_to_end(sock) for sock in socks]
    for t in trickles:
        t.end()
    for sock in socks:
        sock.close()
    for i, raw in enumerate(answers):
        if i >= 2 and not raw:
            continue                       # reset before the answer could be read
        status, headers, body = answer_of(raw)
        assert status == 408 and headers["connection"] == "close", raw
        assert body["error"]["type"] == "invalid_request_error"
        assert "--body-timeout" in body["error"]["message"]
    assert answers[0] and answers[1]        # the stalled ones read their whole answer
    assert until(lambda: not s.server.server_state.connections), "a connection stayed"
    assert call(s.url, "/health", timeout=BOUND)[0] == 200
    assert call(s.url, "/v1/audio/speech", {"input": "y", "response_format": "pcm"},
                timeout=BOUND)[0] == 200


def test_a_body_on_time_is_read_whole(served, tmp_path):
    """The deadline refuses only late bodies: one sent at once is served."""
    app = create_app(StubTTS(), settings(tmp_path / "voices", body_timeout=DEADLINE))
    s = served(app)
    body = json.dumps({"input": "on time", "response_format": "pcm"}).encode()
    sock = socket.create_connection(("127.0.0.1", s.port))
    sock.sendall(body_head(s.port, len(body))[:-1] + body)
    sock.settimeout(BOUND)
    assert sock.recv(1 << 16).startswith(b"HTTP/1.1 200")
    sock.close()


def test_trickling_headers_are_cut_by_the_header_deadline(served, tmp_path):
    """The header phase's bound (connections.py): a client that sends a header byte every
    50 ms, never finishing, is closed once --header-timeout has passed since it connected —
    its bytes do not move the deadline (uvicorn's keep-alive timer would stop at the first)."""
    s = served(create_app(StubTTS(), settings(tmp_path / "voices")),
               ServerSettings(header_timeout=DEADLINE))
    sock = socket.create_connection(("127.0.0.1", s.port))
    trickle = Trickle(sock, b"GET /health HTTP/1.1\r\nX-Pad: " + b"a" * FOREVER)
    answer = read_to_end(sock)
    trickle.end()
    sock.close()
    assert answer == b""                   # closed with no answer: no request had begun
    assert until(lambda: not s.server.server_state.connections), "a connection stayed"


# --- finding 6: a streamed request's place is free before its last bytes go out -----------------


class BatchedStub(StubTTS):
    """The stub as a family with a batched decoder, so its worker runs as serve's
    --max-streams N > 1 does (worker.py `_together`)."""

    BATCHED = True

    @contextlib.contextmanager
    def decoding_together(self, streams: int):
        yield


class LastBytes:
    """The app, which holds each speech answer's last bytes until it has asked /v1/models
    (over HTTP, from a thread) for the model's free places, and records (status, free)."""

    def __init__(self, app):
        self.app, self.seen, self.sent = app, [], threading.Event()
        self.server = None

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or scope["path"] != "/v1/audio/speech":
            return await self.app(scope, receive, send)
        status = None

        async def watched(message):
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            elif not message.get("more_body", False):
                free = await asyncio.to_thread(free_places, self.server, BOUND)
                self.seen.append((status, free))
                self.sent.set()
            await send(message)
        await self.app(scope, receive, watched)


@pytest.mark.parametrize("streams", [1, 4])
def test_a_streamed_requests_place_is_free_before_its_last_bytes(served, tmp_path, monkeypatch,
                                                                 streams):
    """An exactly full server (--queue 0: `streams` places, all but one held by endless streams
    whose clients read nothing) and one client that streams a request and asks again the
    moment it has the end, ten times: each answer is 200, and as each answer's last bytes go
    out its place is already free. The worker is made to pause right after it hands over a
    stream's end (as a busy machine may deschedule it), until those bytes went out: a place
    given back only after the end was handed over is then still taken, every time."""
    watch = LastBytes(create_app((BatchedStub if streams > 1 else StubTTS)(),
                                 settings(tmp_path / "voices", queue_depth=0,
                                 max_streams=streams, write_timeout=BOUND * 10)))
    finish = AudioChannel.finish

    def paused_finish(channel, kind, value=None):
        finish(channel, kind, value)
        if kind == "end":
            assert watch.sent.wait(BOUND), "the stream's last bytes never went out"
            watch.sent.clear()
    monkeypatch.setattr(AudioChannel, "finish", paused_finish)
    s = served(watch, ServerSettings(write_timeout=BOUND * 10))
    watch.server = s
    endless = [raw_post(s.port, {"input": "endless", "stream_format": "audio",
                                 "response_format": "pcm"}, rcvbuf=4096)
               for _ in range(streams - 1)]
    assert until(lambda: free_places(s) == 1), "the endless streams never took their places"
    client = client_of(s, BOUND)
    for _ in range(10):
        with client.audio.speech.with_streaming_response.create(
                model="tts-1", voice="alloy", input="again", response_format="pcm",
                extra_body={"stream_format": "audio"}) as response:
            assert response.status_code == 200
            assert len(response.read()) > 0
    for sock in endless:
        sock.close()
    assert watch.seen == [(200, 1)] * 10
