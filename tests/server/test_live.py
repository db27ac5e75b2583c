"""WebSocket /v1/audio/live with a real client (the `websockets` package) on loopback and the tiny
MOSS-TTS-Realtime model: the audio is the LiveSession's for the same seed, turns keep going, a
client that leaves mid-stream gets its session closed and its slot freed, the line's limit
holds, bad input ends in one error event, and the access rules of the HTTP endpoints apply."""

import json
import time

import numpy as np
import pytest
from websockets.exceptions import ConnectionClosed, InvalidStatus
from websockets.sync.client import connect

from moss_tts.errors import InputError
from moss_tts.models.nano_tts import NanoTTS
from moss_tts.models.realtime_tts import SESSION_ROWS, RealtimeTTS
from moss_tts.sampling import RealtimeSamplingOptions
from moss_tts.server import create_app
from moss_tts.server.formats import pcm_bytes
from tests.server.helpers import call, settings, tiny_model_files, tiny_realtime_files

TEXT = "Hello there, this is a live test. It speaks as the text arrives!"
DELTAS = ["Hel", "lo there, th", "is is a live", " test. It speaks as the text arrives!"]


class RecordingRealtime(RealtimeTTS):
    """The real model; the sessions it opens are kept so a test can see they were closed."""

    def session(self, *args, **kwargs):
        s = super().session(*args, **kwargs)
        self.opened.append(s)
        return s


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    d = tmp_path_factory.mktemp("live")
    realtime, codec = tiny_realtime_files(d)
    nano, nano_codec = tiny_model_files(d)
    rt = RecordingRealtime.load(realtime, codec=codec, threads=1)
    rt.opened = []
    nano_tts = NanoTTS.load(nano, codec=nano_codec, threads=1)
    yield {"moss-tts-realtime": rt, "moss-tts-nano": nano_tts}
    rt.close()
    nano_tts.close()


@pytest.fixture
def serve(tmp_path, models, served):
    return lambda **kwargs: served(create_app(models, settings(tmp_path / "voices",
                                              **kwargs)))


def ws_url(server, query=""):
    return server.url.replace("http://", "ws://") + "/v1/audio/live" + query


def send(ws, message: dict) -> None:
    ws.send(json.dumps(message))


def until_event(ws, kind: str) -> tuple[bytes, dict]:
    """(the audio received before it, the event `kind`); any other event fails the test."""
    audio = b""
    while True:
        m = ws.recv(timeout=60)
        if isinstance(m, bytes):
            audio += m
            continue
        event = json.loads(m)
        assert event["type"] == kind, event
        return audio, event


def speak_turn(ws, deltas) -> tuple[bytes, dict]:
    for delta in deltas:
        send(ws, {"type": "text", "text": delta})
    send(ws, {"type": "end"})
    return until_event(ws, "turn_done")


def session_pcm(tts, turns, seed) -> list[bytes]:
    """What a LiveSession says, turn by turn: [(user text or None, deltas)] → s16le per turn;
    the text is pushed a character at a time, as upstream's demo feeds an LLM's stream."""
    s = tts.session(options=RealtimeSamplingOptions(), seed=seed)
    out = []
    try:
        for i, (user_text, deltas) in enumerate(turns):
            if i:
                s.new_turn(user_text)
            parts = [s.push_text(ch) for ch in "".join(deltas)]
            s.end_text()
            parts += list(s.drain())
            out.append(pcm_bytes(np.concatenate(parts)[:, None]))
    finally:
        s.close()
    return out


def error_event(ws) -> str:
    """The error event's message, after which the server closes the socket (policy, 1008).
    Audio or the end of a turn may come first: the session and the reader run side by side."""
    while isinstance(m := ws.recv(timeout=60), bytes) or json.loads(m)["type"] == "turn_done":
        pass
    event = json.loads(m)
    assert event["type"] == "error", event
    with pytest.raises(ConnectionClosed) as closed:
        ws.recv(timeout=10)
    assert closed.value.rcvd.code == 1008
    return event["message"]


def test_live_audio_is_the_sessions_audio_turn_after_turn(serve, models):
    s = serve()
    turns = [(None, DELTAS), ("And now?", ["Second turn, ", "same cache."])]
    with connect(ws_url(s)) as ws:
        send(ws, {"model": "moss-tts-realtime", "seed": 5})
        _, started = until_event(ws, "started")
        assert started == {"type": "started", "model": "moss-tts-realtime", "sample_rate": 3200,
                           "channels": 1, "format": "pcm_s16le", "context": SESSION_ROWS}
        first, done = speak_turn(ws, DELTAS)
        assert done["interrupted"] is False
        send(ws, {"type": "turn", "user_text": "And now?"})
        second, _ = speak_turn(ws, turns[1][1])
    want = session_pcm(models["moss-tts-realtime"], turns, seed=5)
    assert len(first) > 0 and first == want[0]
    # a frame a push, as the session pushes (whole audio pushes 8: chunk_ladder.py)
    offline, _ = models["moss-tts-realtime"].synthesize(TEXT, seed=5, chunk_frames=1)
    assert first == pcm_bytes(offline)           # and the first turn is offline generation
    assert len(second) > 0 and second == want[1]
    assert done["seconds"] == pytest.approx(len(first) / 2 / 3200, abs=1e-3)
    # the seed reaches the session: another seed says something else
    assert session_pcm(models["moss-tts-realtime"], turns[:1], seed=6)[0] != first


def test_a_user_turn_first_opens_the_conversation_without_a_turn_done(serve, models):
    s = serve()
    with connect(ws_url(s)) as ws:
        send(ws, {"model": "moss-tts-realtime", "seed": 3})
        until_event(ws, "started")
        send(ws, {"type": "turn", "user_text": "Say hello."})
        audio, done = speak_turn(ws, DELTAS)        # the first turn_done is this answer's
    assert done["interrupted"] is False and len(audio) > 0
    with models["moss-tts-realtime"].session(seed=3) as want:
        want.new_turn("Say hello.")
        parts = [want.push_text(ch) for ch in TEXT]
        want.end_text()
        parts += list(want.drain())
    assert audio == pcm_bytes(np.concatenate(parts)[:, None])


def test_a_turn_sent_while_one_speaks_cuts_it_short(serve, models):
    long_text = TEXT * 4
    full, _ = models["moss-tts-realtime"].synthesize(long_text, seed=2)
    s = serve()
    with connect(ws_url(s)) as ws:
        send(ws, {"model": "moss-tts-realtime", "seed": 2})
        until_event(ws, "started")
        send(ws, {"type": "text", "text": long_text})          # no 'end': still speaking
        while not isinstance(ws.recv(timeout=60), bytes):
            pass
        send(ws, {"type": "turn", "user_text": "Wait, stop."})  # barge-in
        _, cut = until_event(ws, "turn_done")
        second, done = speak_turn(ws, ["Sure, stopping."])
    assert cut["interrupted"] is True and 0 < cut["seconds"] < len(full) / 3200
    assert done["interrupted"] is False and len(second) > 0


def test_a_client_that_leaves_mid_stream_closes_its_session_and_frees_the_line(serve, models):
    rt = models["moss-tts-realtime"]
    s = serve(queue_depth=0)             # one slot: a leftover lane would refuse the next client
    with connect(ws_url(s)) as ws:
        send(ws, {"model": "moss-tts-realtime", "seed": 1})
        until_event(ws, "started")
        with connect(ws_url(s)) as second:   # the line is full while the first is connected
            send(second, {"model": "moss-tts-realtime"})
            assert error_event(second).startswith("busy")
        session = rt.opened[-1]
        send(ws, {"type": "text", "text": TEXT * 3})
        while not isinstance(ws.recv(timeout=60), bytes):   # audio is flowing
            pass
    # gone mid-turn, without 'end'. Only its worker may touch the session (a push from here
    # would race the worker's own step), so this only reads whether it was closed
    deadline = time.time() + 20
    while not session.closed and time.time() < deadline:
        time.sleep(0.05)
    assert session.closed, "the session of a client that left stays open"
    with pytest.raises(InputError, match="closed"):
        session.push_text("x")
    with connect(ws_url(s)) as again:    # its slot is free again
        send(again, {"model": "moss-tts-realtime"})
        until_event(again, "started")
        audio, _ = speak_turn(again, ["Hi there, friend."])
        assert len(audio) > 0
    status, _, _ = call(s.url, "/v1/models")
    assert status == 200


@pytest.mark.parametrize("config, problem", [
    ({"model": "nope"}, "unknown model 'nope'"),
    ({"model": "moss-tts-nano"}, "has no live mode"),
    ({"model": "moss-tts-realtime", "format": "mp3"}, "'format' must be one of pcm"),
    ({"model": "moss-tts-realtime", "speed": 2}, "unknown field 'speed'"),
    ({"model": "moss-tts-realtime", "seed": "one"}, "'seed' must be an integer"),
    ({"model": "moss-tts-realtime", "top_p": 2}, "'top_p' must be in"),
    ({"model": "moss-tts-realtime", "reference_audio": "!!"}, "not valid base64"),
    ({"type": "text", "text": "Hi."}, "the first message is the config"),
])
def test_a_bad_config_is_one_error_event(serve, config, problem):
    s = serve()
    with connect(ws_url(s)) as ws:
        send(ws, config)
        message = error_event(ws)
    assert problem in message, message
    if config.get("model") == "moss-tts-nano":
        assert "moss-tts-realtime" in message          # it names the model to use instead


@pytest.mark.parametrize("messages, problem", [
    ([{"type": "text", "text": "Hi."}, {"type": "end"}, "TURN_DONE",
      {"type": "text", "text": "more"}], "text after 'end'"),
    ([{"type": "end"}, {"type": "end"}], "'end' twice"),
    ([{"type": "speak"}], "'type' must be one of text, end, turn"),
    ([{"type": "text"}], "needs a non-empty 'text'"),
    ([{"type": "end", "text": "x"}], "'end' messages carry no 'text'"),
    (["not json"], "not valid JSON"),
    ([b"\x00\x01"], "binary messages are not accepted"),
])
def test_bad_messages_are_one_error_event(serve, messages, problem):
    s = serve()
    with connect(ws_url(s)) as ws:
        send(ws, {"model": "moss-tts-realtime"})
        until_event(ws, "started")
        for m in messages:
            if m == "TURN_DONE":
                until_event(ws, "turn_done")
            else:
                ws.send(m if isinstance(m, (str, bytes)) else json.dumps(m))
        message = error_event(ws)
    assert problem in message, message


def test_the_live_endpoint_follows_the_access_rules(serve):
    s = serve(api_key="sk-live", cors_origins=["http://app.example"])
    config = {"model": "moss-tts-realtime"}

    def refused(url, **kwargs) -> int:
        with pytest.raises(InvalidStatus) as e:
            connect(url, **kwargs).close()
        return e.value.response.status_code

    assert refused(ws_url(s)) == 401
    assert refused(ws_url(s, "?api_key=wrong")) == 401
    assert refused(ws_url(s), additional_headers={"Authorization": "Bearer nope"}) == 401
    assert refused(ws_url(s, "?api_key=sk-live"), origin="http://evil.example") == 403
    assert refused(ws_url(s, "?api_key=sk-live"),
                   additional_headers={"Host": "evil.example"}) == 400
    for kwargs in ({"additional_headers": {"Authorization": "Bearer sk-live"}},
                   {"origin": "http://app.example", "additional_headers": {
                       "Authorization": "Bearer sk-live"}},
                   {"origin": s.url}):                 # the page's own origin
        query = "?api_key=sk-live" if "additional_headers" not in kwargs else ""
        with connect(ws_url(s, query), **kwargs) as ws:
            send(ws, config)
            until_event(ws, "started")


def test_models_list_says_which_model_is_live(serve):
    s = serve()
    status, _, body = call(s.url, "/v1/models")
    assert status == 200
    assert {m["id"]: m["live"] for m in json.loads(body)["data"]} == {
        "moss-tts-realtime": True, "moss-tts-nano": False}
