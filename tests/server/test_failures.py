"""What the server answers and logs when things go wrong (issue 23, the server's holes 1 and 7),
on a real uvicorn bound to loopback with a stub model, seen through the clients users use (the
`openai` package, `websockets`, raw sockets). An unexpected failure is OpenAI's JSON 500 and one
ERROR line; a client's own behaviour (leaving mid-upload, dropping a stream, a refused
WebSocket handshake) is an INFO line, never an ERROR record or a traceback.

uvicorn's own logger does not reach pytest's root handler (uvicorn's logging config stops it
from propagating), so `server_log` adds caplog's handler to it."""

import asyncio
import gc
import http.client
import io
import json
import logging
import socket
import threading

import numpy as np
import openai
import pytest
import soundfile as sf
from websockets.exceptions import InvalidStatus
from websockets.sync.client import connect

import moss_tts.server.app as app_module
from moss_tts.server import create_app
from moss_tts.server.formats import StreamEncoder
from moss_tts.server.responses import AudioStream
from moss_tts.server.worker import AudioChannel
from moss_tts.voices import add_voice
from tests.server.helpers import SR, StubTTS, call, settings, silent_wav_b64

GUARD_SECONDS = 20     # how long a test waits for the server's side: only a broken test waits


class Finished:
    """The app, counting the HTTP requests whose handling has returned, so a test can wait
    until the server is done with a client that left."""

    def __init__(self, app):
        self.app, self.count, self.loop = app, threading.Semaphore(0), None

    async def __call__(self, scope, receive, send):
        self.loop = asyncio.get_running_loop()
        try:
            await self.app(scope, receive, send)
        finally:
            if scope["type"] == "http":
                self.count.release()

    def wait(self):
        assert self.count.acquire(timeout=GUARD_SECONDS), "the server never finished the request"

    def pending_package_tasks(self) -> list[str]:
        """The server loop's unfinished tasks that run this package's code."""
        async def listing():
            return [t.get_coro().__qualname__ for t in asyncio.all_tasks()
                    if "moss_tts" in t.get_coro().cr_code.co_filename]
        return asyncio.run_coroutine_threadsafe(listing(), self.loop).result(GUARD_SECONDS)


@pytest.fixture
def serve(tmp_path, served):
    def start(tts=None, wrap=lambda app: app, **kwargs):
        app = Finished(wrap(create_app(tts or StubTTS(), settings(tmp_path / "voices",
                                       **kwargs))))
        s = served(app)
        s.finished = app
        return s
    return start


@pytest.fixture
def server_log(caplog):
    """caplog, also fed by uvicorn's logger, at INFO."""
    uvicorn_log = logging.getLogger("uvicorn.error")
    uvicorn_log.addHandler(caplog.handler)
    caplog.set_level(logging.INFO)
    yield caplog
    uvicorn_log.removeHandler(caplog.handler)


def errors(caplog) -> list[str]:
    """ERROR records and any record carrying a traceback."""
    return [f"{r.name}: {r.getMessage()}" for r in caplog.records
            if r.levelno >= logging.ERROR or r.exc_info]


def client(s) -> openai.OpenAI:
    return openai.OpenAI(base_url=s.url + "/v1", api_key="unused", max_retries=0)


# --- hole 1: speed on very short audio; no plain-text 500 ----------------------------------------


def test_speed_on_audio_shorter_than_a_vocoder_frame_is_stretched(serve):
    """The stub speaks 96 frames (60 ms at its 1600 Hz), less than the phase vocoder's
    256-sample frame: the openai client gets the audio at twice the tempo, not a 500."""
    s = serve()
    r = client(s).audio.speech.create(model="tts-1", voice="alloy", input="Hi.",
                                      response_format="wav", speed=2.0)
    audio, rate = sf.read(io.BytesIO(r.content), dtype="float32")
    assert rate == SR and audio.shape == (3 * 32 // 2, 2)


def test_an_unexpected_failure_in_a_route_is_openais_json_500_and_one_log_line(
        serve, server_log, monkeypatch):
    def broken(*args):
        raise RuntimeError("an unforeseen bug")
    monkeypatch.setattr(app_module, "render_whole", broken)
    s = serve()
    with pytest.raises(openai.InternalServerError) as e:
        client(s).audio.speech.create(model="tts-1", voice="alloy", input="Hi.")
    assert e.value.response.headers["content-type"] == "application/json"
    assert e.value.body == {"message": "internal error: an unforeseen bug",
                            "type": "server_error", "param": None, "code": None}
    assert len(errors(server_log)) == 1 and "an unforeseen bug" in errors(server_log)[0]
    assert "Traceback" not in server_log.text


@pytest.mark.parametrize("method, path, status, says, allow", [
    ("GET", "/v1/nope", 404, "no endpoint GET /v1/nope; this server serves GET /, POST "
     "/v1/audio/speech, GET /v1/models", None),
    ("POST", "/v1/models", 405, "POST is not served at /v1/models; it takes GET", "GET, HEAD"),
    ("DELETE", "/v1/audio/voices", 405, "it takes GET, HEAD, POST", "GET, HEAD, POST"),
    ("GET", "/v1/models/", 404, "the path is /v1/models, without the trailing '/'", None),
    ("POST", "/v1/audio/speech/", 404, "the path is /v1/audio/speech, without", None)])
def test_unknown_paths_and_methods_are_openai_errors_not_plain_text_or_redirects(
        serve, method, path, status, says, allow):
    """Starlette answers these in plain text, and a trailing '/' with a 307 redirect; here each
    is a JSON error in OpenAI's shape saying what is served (a 405's Allow lists every method
    of the path, across its routes)."""
    s = serve()
    conn = http.client.HTTPConnection("127.0.0.1", s.port, timeout=GUARD_SECONDS)
    conn.request(method, path, body=b"{}" if method == "POST" else None,
                 headers={"Content-Type": "application/json"})
    r = conn.getresponse()
    body = r.read()
    conn.close()
    assert (r.status, r.getheader("content-type")) == (status, "application/json"), body
    error = json.loads(body)["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["type"] == "invalid_request_error" and says in error["message"]
    assert r.getheader("allow") == allow


def test_a_voice_the_api_cannot_store_or_use_is_an_answer_naming_the_api(serve, tmp_path):
    """The library's messages for these name the CLI (`voice add ... --force`, `--codec`);
    the server's name its endpoints and the request's field, and never a flag."""
    s, wav = serve(), silent_wav_b64()
    assert call(s.url, "/v1/audio/voices", {"name": "taken", "audio": wav})[0] == 201
    status, _, body = call(s.url, "/v1/audio/voices", {"name": "taken", "audio": wav})
    assert (status, json.loads(body)["error"]["message"]) == (
        409, "voice 'taken' exists; delete it first (DELETE /v1/audio/voices/taken)")
    other_codec = {"variant": "nano", "sample_rate": 48000, "codebook_size": 1024}
    add_voice("foreign", np.zeros((4, 2), np.int32), other_codec, root=tmp_path / "voices")
    (tmp_path / "voices" / "broken.voice.npz").write_bytes(b"not a voice")
    for name, problem in [("foreign", "voice 'foreign' does not fit this model: it was "
                                      "encoded with the nano codec"),
                          ("broken", "voice 'broken' is unreadable")]:
        status, _, body = call(s.url, "/v1/audio/speech", {"input": "hi", "voice": name,
                                                           "response_format": "pcm"})
        message = json.loads(body)["error"]["message"]
        assert status == 400 and "--" not in message, message
        assert message.startswith(f"'voice': {problem}")
        assert message.endswith(f"store it again for this model: DELETE /v1/audio/voices/{name}"
                                ', then POST /v1/audio/voices with "model": "moss-tts-nano"')


def test_a_host_header_with_a_huge_port_is_a_400_not_a_500(serve, server_log):
    """int() refuses more than 4,300 digits: the Host check once raised there."""
    s = serve()
    status, headers, body = call(s.url, "/health", headers={"Host": "127.0.0.1:" + "9" * 5000})
    assert status == 400 and "is not served here" in json.loads(body)["error"]["message"]
    assert not errors(server_log)


# --- hole 7: a client's behaviour is an INFO line ------------------------------------------------


def raw_post(port: int, body: bytes, length: int | None = None) -> socket.socket:
    """A speech POST over a bare socket; `length` may promise more body than is sent."""
    sock = socket.create_connection(("127.0.0.1", port))
    sock.sendall(b"POST /v1/audio/speech HTTP/1.1\r\nHost: 127.0.0.1:%d\r\n"
                 b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n%s"
                 % (port, len(body) if length is None else length, body))
    return sock


def test_a_client_that_leaves_mid_upload_is_an_info_line_not_a_500(serve, server_log):
    s = serve(access_log=True)
    raw_post(s.port, b'{"input": "half a body', length=100_000).close()
    s.finished.wait()
    assert not errors(server_log)
    access = [r.getMessage() for r in server_log.records if r.name == "moss_tts.access"]
    assert len(access) == 1 and '"POST /v1/audio/speech" 0 ' in access[0]   # nothing sent
    assert any("left while sending" in r.getMessage() and r.levelno == logging.INFO
               for r in server_log.records)


async def lossy_wait_for(awaitable, timeout):
    """asyncio.wait_for as Python 3.11 behaves when a cancel lands as the awaited write
    completes: it returns the write's result and the cancel is lost. On loopback that race
    left a dropped stream's pump behind, waiting on a channel no one feeds ("Task was
    destroyed but it is pending!" when it was collected); this loses every such cancel."""
    task = asyncio.ensure_future(awaitable)
    try:
        return await asyncio.shield(task)
    except asyncio.CancelledError:
        return await task


def test_a_stream_whose_write_loses_the_cancel_still_ends_with_no_task_behind(monkeypatch):
    """AudioStream on its own: the client leaves during a write that returns a few loop turns
    after the stream has cancelled its pump (event-loop order, not time)."""
    monkeypatch.setattr(asyncio, "wait_for", lossy_wait_for)

    async def scenario():
        left = asyncio.Event()

        async def receive():
            await left.wait()
            return {"type": "http.disconnect"}

        async def send(message):
            if message["type"] == "http.response.body":
                left.set()                 # the client leaves during this write...
                for _ in range(10):        # ...which returns after the pump's cancel
                    await asyncio.sleep(0)
        channel = AudioChannel(asyncio.get_running_loop(), 4, 60.0)
        stream = AudioStream(("audio", np.zeros((32, 2), np.float32)), channel,
                             StreamEncoder("sse", "pcm", "native", SR, 2))
        done, _ = await asyncio.wait({asyncio.ensure_future(stream({}, receive, send))},
                                     timeout=GUARD_SECONDS)
        assert done, "the stream never ended"
        return [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
    assert asyncio.run(scenario()) == []


class WritesHeldUntilTheClientLeaves:
    """The app, with the first request's body writes held until its client has left and then
    finished a few loop turns later: a client that reads nothing and then leaves, ordered so
    the stream cancels its pump in the middle of a write."""

    def __init__(self, app):
        self.app, self.armed = app, True

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or not self.armed:
            return await self.app(scope, receive, send)
        self.armed, left = False, asyncio.Event()

        async def watched_receive():
            message = await receive()
            if message["type"] == "http.disconnect":
                left.set()
            return message

        async def held_send(message):
            if message["type"] == "http.response.body":
                await left.wait()
                for _ in range(10):
                    await asyncio.sleep(0)
            await send(message)
        await self.app(scope, watched_receive, held_send)


def test_a_dropped_stream_logs_no_error(serve, server_log, monkeypatch):
    """The same through uvicorn: the client reads the status line of an SSE stream and
    leaves. A task left behind is logged by asyncio when it is collected, which may be long
    after (while anything still reaches it): the test looks for the task itself."""
    stub = StubTTS()
    s = serve(stub, wrap=WritesHeldUntilTheClientLeaves)
    with monkeypatch.context() as patched:
        patched.setattr(asyncio, "wait_for", lossy_wait_for)
        sock = raw_post(s.port, json.dumps({"input": "endless", "stream_format": "sse"}).encode())
        assert sock.recv(12) == b"HTTP/1.1 200"
        sock.close()                           # the client drops the stream
        s.finished.wait()
        assert stub.stopped.wait(GUARD_SECONDS)
    assert s.finished.pending_package_tasks() == []   # nothing left to be collected pending
    gc.collect()
    assert not errors(server_log)


def test_refused_websocket_handshakes_are_info_lines(serve, server_log):
    s = serve(api_key="sk-test")
    url = s.url.replace("http://", "ws://") + "/v1/audio/live"
    for query, status, kwargs in (("", 401, {}), ("?api_key=wrong", 401, {}),
                                  ("?api_key=sk-test", 403, {"origin": "http://evil.example"})):
        with pytest.raises(InvalidStatus) as refused:
            connect(url + query, **kwargs).close()
        assert refused.value.response.status_code == status
    assert not errors(server_log)
    refusals = [r for r in server_log.records if "refused a WebSocket handshake" in
                r.getMessage()]
    assert [r.levelno for r in refusals] == [logging.INFO] * 3
