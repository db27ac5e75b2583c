"""serve --max-streams with live WebSocket sessions (issue 25): an open session holds one of the
N stream places (worker.py's ModelWorker), so sessions and running speech requests never number
more than N, a request waits in the line while sessions hold every place, and a session's work
runs between the batched pulls without changing anyone's audio. Real clients (`websockets`,
stock `openai`) and the real tiny Nano model; the tests wait on states, never assert a time."""

import contextlib
import json
import threading
import time

import numpy as np
import pytest
from websockets.sync.client import connect

from moss_tts.models.nano_tts import NanoTTS
from moss_tts.server import create_app
from tests.server.helpers import (call, client_of, free_places, settings, silent_wav_b64,
                                  tiny_model_files)

N, DEPTH = 2, 2
PLACES = N + DEPTH         # the line's places, running jobs' included (/v1/models)
R1 = dict(input="A first request, long enough to run for a while.", extra_body={
    "seed": 5, "max_new_frames": 40})
R2 = dict(input="The second one.", extra_body={"seed": 7, "max_new_frames": 20})
LIVE_TEXT = "Spoken live."
LIVE_KNOBS = {"seed": 3, "max_new_frames": 24}
GUARD = 60                 # seconds a waited-for state may take: only a broken test gets there


class LiveNano(NanoTTS):
    """The real tiny Nano given a live mode made of its own `stream`, so that the streams
    open at once can be counted (the real live mode, MOSS-TTS-Realtime's, beside batched
    requests: test_max_streams_realtime.py). A turn's text is spoken at its end, as
    `stream(text, **the session's keywords)`, so the turn's audio is the speech request's
    with the same text and knobs. `most` records the most streams open at once, by kind
    ("speech", "live", "all"); a voice upload holds the worker (`holding` set) until the test
    sets `release`."""

    LIVE = True

    def reset(self):
        self.open = {"speech": 0, "live": 0}
        self.most = {"speech": 0, "live": 0, "all": 0}
        self.holding, self.release = threading.Event(), threading.Event()

    def stream(self, text=None, **kwargs):
        return self.counted(super().stream(text, **kwargs), "speech")

    def counted(self, chunks, kind):
        self.open[kind] += 1
        self.most[kind] = max(self.most[kind], self.open[kind])
        self.most["all"] = max(self.most["all"], sum(self.open.values()))
        try:
            yield from chunks
        finally:
            self.open[kind] -= 1

    def encode_reference(self, *args, **kwargs):
        self.holding.set()
        assert self.release.wait(GUARD), "the test never released the held upload"
        return super().encode_reference(*args, **kwargs)

    def session(self, voice=None, **words):
        return SpokenAtTheEnd(self, words)


class SpokenAtTheEnd:
    """A LiveNano session: the LiveSession surface the live endpoint uses."""

    def __init__(self, tts: LiveNano, words: dict):
        self.tts, self.words, self.text, self.chunks = tts, words, "", None
        self.turns_dropped, self.budget_cut, self.rows = 0, False, (0, 1000)
        self.max_turn_chars = 32_000      # what the endpoint reads when the session opens

    def push_text(self, ch: str) -> np.ndarray:
        self.text += ch
        return np.zeros(0, np.float32)

    def end_text(self) -> None:
        pass

    def drain(self):
        text, self.text = self.text, ""
        self.chunks = self.tts.counted(NanoTTS.stream(self.tts, text, **self.words), "live")
        return self.chunks

    def new_turn(self, user_text) -> None:
        self.text = ""

    def close(self) -> None:
        if self.chunks is not None:
            self.chunks.close()


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("max_streams_live")
    return d, tiny_model_files(d)


@pytest.fixture(scope="module")
def expected(files):
    """Each request's audio (pcm) from a default server: one request at a time, no batch."""
    from tests.server.helpers import Served

    d, (model, codec) = files
    tts = NanoTTS.load(model, codec=codec, threads=1)
    server = Served(create_app(tts, settings(d / "alone")))
    try:
        client = client_of(server)
        live = dict(input=LIVE_TEXT, extra_body=LIVE_KNOBS)
        yield {name: speak(client, r) for name, r in (("r1", R1), ("r2", R2), ("live", live))}
    finally:
        server.stop()
        tts.close()


@pytest.fixture
def together(files, served, tmp_path):
    """(server, model): a --max-streams 2 --queue 2 server over a LiveNano."""
    _, (model, codec) = files
    tts = LiveNano.load(model, codec=codec, threads=1)
    tts.reset()
    yield served(create_app(tts, settings(tmp_path / "voices", queue_depth=DEPTH,
                            max_streams=N))), tts
    served.stop_all()
    tts.close()



def speak(client, r) -> bytes:
    """The request's audio as the live endpoint sends it: s16le at the model's own layout."""
    return client.audio.speech.create(model="tts-1", voice="alloy", response_format="pcm",
                                      input=r["input"],
                                      extra_body=r["extra_body"] | {"pcm_layout": "native"}
                                      ).content


def in_thread(target, *args) -> tuple[threading.Thread, dict]:
    out = {}

    def run():
        try:
            out["result"] = target(*args)
        except Exception as e:  # noqa: BLE001 - seen by the test
            out["error"] = e
    t = threading.Thread(target=run)
    t.start()
    return t, out


def result(t: threading.Thread, out: dict):
    t.join(GUARD)
    assert not t.is_alive(), "the request never ended"
    if "error" in out:
        raise out["error"]
    return out["result"]



def wait_free(server, n: int) -> None:
    """Until /v1/models says `n` places are free (requests reached the line or left it)."""
    deadline = time.monotonic() + GUARD
    while (free := free_places(server)) != n:
        assert time.monotonic() < deadline, f"free places stayed {free}, expected {n}"
        time.sleep(0.01)


def live_session(server, stack: contextlib.ExitStack):
    """A started live session, closed by `stack` at the latest."""
    ws = stack.enter_context(connect(server.url.replace("http://", "ws://") + "/v1/audio/live"))
    ws.send(json.dumps(LIVE_KNOBS))
    assert json.loads(ws.recv(timeout=GUARD))["type"] == "started"
    return ws


def finish_turn(ws) -> bytes:
    """The turn's audio, up to its turn_done."""
    ws.send(json.dumps({"type": "end"}))
    audio = b""
    while isinstance(m := ws.recv(timeout=GUARD), bytes):
        audio += m
    assert json.loads(m)["type"] == "turn_done", m
    return audio


def held_upload(server, tts: LiveNano, name: str = "held"):
    """A voice upload holding the worker until `tts.release` is set (a plain job); each under
    a new `name` (a taken one is refused before any work)."""
    tts.holding.clear()
    upload = in_thread(call, server.url, "/v1/audio/voices",
                       {"name": name, "audio": silent_wav_b64(0.5)})
    assert tts.holding.wait(GUARD)
    return upload


def test_a_live_session_holds_a_stream_place_and_closing_it_frees_the_place(together,
                                                                             expected):
    server, tts = together
    client = client_of(server)
    with contextlib.ExitStack() as stack:
        ws = live_session(server, stack)
        upload = held_upload(server, tts)
        ws.send(json.dumps({"type": "text", "text": LIVE_TEXT}))   # its jobs wait behind the hold
        requests = [in_thread(speak, client, r) for r in (R1, R2)]
        wait_free(server, 0)              # the session, the upload and both requests hold a place
        tts.release.set()
        live = finish_turn(ws)
        got = [result(*r) for r in requests]
        assert result(*upload)[0] == 201
        # one request ran beside the session, the other waited for it: never 3 streams
        assert tts.most["speech"] == 1 and tts.most["all"] <= N
        assert got == [expected["r1"], expected["r2"]]
        assert live == expected["live"]
        ws.close()                        # its place comes back: the next two run together
        wait_free(server, PLACES)
        tts.reset()
        upload = held_upload(server, tts, "held-again")
        requests = [in_thread(speak, client, r) for r in (R1, R2)]
        wait_free(server, 1)
        tts.release.set()
        assert [result(*r) for r in requests] == [expected["r1"], expected["r2"]]
        assert tts.most["speech"] == N
        assert result(*upload)[0] == 201


def test_a_request_waits_while_live_sessions_hold_every_place(together, expected):
    server, tts = together
    with contextlib.ExitStack() as stack:
        first, second = live_session(server, stack), live_session(server, stack)
        request = in_thread(speak, client_of(server), R2)
        wait_free(server, PLACES - 3)     # both sessions and the request are in the line
        first.send(json.dumps({"type": "text", "text": LIVE_TEXT}))
        assert finish_turn(first) == expected["live"]   # the worker ran a whole turn...
        assert tts.most["speech"] == 0 and request[0].is_alive()   # ...the request waited
        second.close()
        assert result(*request) == expected["r2"]


def test_a_session_waits_for_a_place_like_a_request(together, expected):
    """A third session's first job waits in the line while two hold both places; it starts
    when one of them leaves."""
    server, tts = together
    with contextlib.ExitStack() as stack:
        first, second = live_session(server, stack), live_session(server, stack)
        third = in_thread(live_session, server, stack)
        wait_free(server, PLACES - 3)
        first.send(json.dumps({"type": "text", "text": LIVE_TEXT}))
        assert finish_turn(first) == expected["live"]
        assert third[0].is_alive()        # not started: no place was free
        second.close()
        ws = result(*third)
        ws.send(json.dumps({"type": "text", "text": LIVE_TEXT}))
        assert finish_turn(ws) == expected["live"]
