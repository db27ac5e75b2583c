"""Faults a client injects into the speech server (issue 31), on a real uvicorn bound to
loopback with a stub model, over raw sockets and the stock `openai` client: a streamed request
gives its place back before its last bytes go out. Each waits on the server's side (a
socket's end, a state), with generous safety bounds, never for time to pass and never
asserting a time."""

import asyncio
import contextlib
import threading
import time

import pytest

from moss_tts.server import create_app
from moss_tts.server.connections import Limits
from moss_tts.server.worker import AudioChannel
from tests.server.helpers import StubTTS, client_of, free_places, raw_post

BOUND = 60           # seconds: only a broken server makes a test wait this long


def until(condition, bound: float = BOUND) -> bool:
    """Whether `condition()` came true within `bound` seconds (checked every 10 ms)."""
    deadline = time.monotonic() + bound
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


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
                                 voices_root=tmp_path / "voices", queue_depth=0,
                                 max_streams=streams, write_timeout=BOUND * 10))
    finish = AudioChannel.finish

    def paused_finish(channel, kind, value=None):
        finish(channel, kind, value)
        if kind == "end":
            assert watch.sent.wait(BOUND), "the stream's last bytes never went out"
            watch.sent.clear()
    monkeypatch.setattr(AudioChannel, "finish", paused_finish)
    s = served(watch, Limits(write_timeout=BOUND * 10))
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
