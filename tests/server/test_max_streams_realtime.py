"""serve --max-streams with the real tiny MOSS-TTS-Realtime model (issue 25): a live WebSocket
session holds one stream place and its jobs run between the batched pulls of the speech
requests decoded beside it (worker.py `_together`, RealtimeTTS.decoding_together), while the
session decodes on its own cache. A live turn spoken while a speech request runs equals the
same turn served alone by a --max-streams 1 server (same text, same seed), and the request's
audio equals it served alone. Both orders are forced, never timed: a whole request (the stock
`openai` client) runs inside an open turn, and a turn runs inside a request whose client
reads only a little at a time (its stream outlasts the buffers between the worker and it, so
it cannot end before the test reads it out)."""

import contextlib
import http.client
import json

import pytest
from websockets.sync.client import connect

from moss_tts.models.batching import MAX_STREAMS
from moss_tts.models.realtime_tts import RealtimeTTS
from moss_tts.server import create_app
from moss_tts.server.settings import ServerSettings
from tests.server.helpers import (Served, call, client_of, free_places, raw_post, settings,
                                  sse_audio, tiny_realtime_files)

MODEL = "moss-tts-realtime"
DEPTH = 2
LIVE_SEED = 5
LIVE_FIRST = ["Hello there, th", "is is a live test. "]      # the lead's 12 tokens and more
LIVE_REST = ["It speaks as ", "the text arrives, ", "beside a request ", "that runs", "."]
# a whole request: one frame per token, then EOS (the steered model), seeded sampling
WHOLE = dict(input="A request spoken while the live turn is open.", extra_body={
    "seed": 7, "max_new_frames": 200, "pcm_layout": "native"})
# a streamed request of ~340 frames, SSE events of ~1.3 KB (a frame as OpenAI's 24 kHz pcm),
# ~450 KB: far more than the channel's 32 chunks, the transport's 64 KiB, 4 KiB socket
# buffers and the reads beside the live turn hold
LONG = "Hello there, this is a longer text to speak for a while. "
# seed 4: a stream that speaks its whole text (a sampled draw may end the tiny model's speech
# early: seed 3 did once decode steps took their products through the same kernel whatever
# the row count, issue 31), long enough for a live turn to happen inside it
STREAMED = {"model": MODEL, "input": LONG * 10, "seed": 4, "max_new_frames": 1000,
            "stream_format": "sse", "response_format": "pcm"}
READ_BESIDE = 2048      # bytes of the stream read after each live delta: it goes on meanwhile
WRITE_TIMEOUT = 600.0   # past any wait here: the slow reader is never cut
GUARD = 60              # seconds a waited-for message may take: only a broken test gets there


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("max_streams_realtime")
    return d, tiny_realtime_files(d)


@pytest.fixture(scope="module")
def expected(files):
    """What a --max-streams 1 server says: the live turn, the whole request and the streamed
    request's SSE body, each served alone."""
    d, (model, codec) = files
    tts = RealtimeTTS.load(model, codec=codec, threads=1)
    server = Served(create_app({MODEL: tts}, settings(d / "alone", max_streams=1)))
    try:
        with live_session(server) as ws:
            live = speak_turn(ws, LIVE_FIRST + LIVE_REST)
        status, _, streamed = call(server.url, "/v1/audio/speech", STREAMED)
        assert status == 200 and len(live) > 0 and len(streamed) > 300_000
        whole = speak(client_of(server), WHOLE)
        assert len(whole) > 0
        yield {"live": live, "whole": whole, "streamed": streamed}
    finally:
        server.stop()
        tts.close()


@pytest.fixture(params=[2, None], ids=["max_streams_2", "auto"])
def together(request, files, served, tmp_path):
    """(server, its stream places): --max-streams 2, or auto (None: MAX_STREAMS, Realtime has
    a batched decoder), over its own load of the model; sockets it accepts send through 4 KiB
    buffers."""
    _, (model, codec) = files
    tts = RealtimeTTS.load(model, codec=codec, threads=1)
    app = create_app({MODEL: tts}, settings(tmp_path / "voices", queue_depth=DEPTH,
                     max_streams=request.param, write_timeout=WRITE_TIMEOUT))
    yield served(app, ServerSettings(write_timeout=WRITE_TIMEOUT), sndbuf=4096), \
        request.param or MAX_STREAMS
    served.stop_all()
    tts.close()



def speak(client, r) -> bytes:
    return client.audio.speech.create(model=MODEL, voice="alloy", response_format="pcm",
                                      input=r["input"], extra_body=r["extra_body"]).content



@contextlib.contextmanager
def live_session(server):
    """A started live session (seed LIVE_SEED), closed on leaving."""
    with connect(server.url.replace("http://", "ws://") + "/v1/audio/live") as ws:
        ws.send(json.dumps({"model": MODEL, "seed": LIVE_SEED}))
        assert json.loads(ws.recv(timeout=GUARD))["type"] == "started"
        yield ws


def send_text(ws, delta: str) -> None:
    ws.send(json.dumps({"type": "text", "text": delta}))


def first_audio(ws) -> bytes:
    """The first binary message: the session is speaking."""
    m = ws.recv(timeout=GUARD)
    assert isinstance(m, bytes), m
    return m


def speak_turn(ws, deltas, between=lambda: None) -> bytes:
    """The turn's audio up to its turn_done: `deltas` sent (`between()` after each), then
    'end'."""
    for delta in deltas:
        send_text(ws, delta)
        between()
    ws.send(json.dumps({"type": "end"}))
    audio = b""
    while isinstance(m := ws.recv(timeout=GUARD), bytes):
        audio += m
    assert json.loads(m)["type"] == "turn_done", m
    return audio


def test_a_whole_request_served_inside_an_open_live_turn_equals_each_alone(together, expected):
    server, places = together
    assert free_places(server) == DEPTH + places
    with live_session(server) as ws:
        for delta in LIVE_FIRST:
            send_text(ws, delta)
        live = first_audio(ws)       # speaking; its turn stays open while the request runs
        assert speak(client_of(server), WHOLE) == expected["whole"]
        live += speak_turn(ws, LIVE_REST)
    assert live == expected["live"]


def test_a_live_turn_spoken_while_a_streamed_request_runs_equals_each_alone(together,
                                                                            expected):
    server, places = together
    with live_session(server) as ws, \
            contextlib.closing(raw_post(server.port, STREAMED, rcvbuf=4096)) as sock:
        for delta in LIVE_FIRST:
            send_text(ws, delta)
        live = first_audio(ws)
        stream = http.client.HTTPResponse(sock)
        stream.begin()               # its headers follow its first audio: it runs
        assert stream.status == 200
        body = [stream.read(READ_BESIDE)]
        live += speak_turn(ws, LIVE_REST, between=lambda: body.append(stream.read(READ_BESIDE)))
        # the request still holds its place (as the session its own): it ran all along
        assert free_places(server) == DEPTH + places - 2
        body.append(stream.read())
    assert live == expected["live"]
    # the same audio; its SSE events may cut it elsewhere (the chunk ladder follows the clock)
    assert sse_audio(b"".join(body)) == sse_audio(expected["streamed"])
