"""Fault injection: a live client that floods MOSS-TTS-Realtime with text (issue 31, finding 3).
Text with no space or punctuation costs the segmenter the same per character however long it
runs and is cut into bounded segments; a turn's text past its bound is refused on every surface
that feeds a live session (the Python API, `tts --live`, the WebSocket endpoint) with one line
naming the bound; a session flooding the model's worker leaves a speech request beside it its
turns. Each asserts a count (characters handed to the segmenting regex, segment lengths,
characters a session was handed between two chunks of a request), never a time; the tiny
Realtime model runs in-process, served by uvicorn on loopback (tests/server/helpers.py)."""

import json
import subprocess
import sys
import threading
import warnings

import pytest
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import connect

from moss_tts.errors import BudgetWarning, InputError
from moss_tts.models import realtime_live
from moss_tts.models.realtime_live import MAX_BUFFER, SESSION_ROWS, TextSegmenter
from moss_tts.models.realtime_tts import RealtimeTTS
from moss_tts.server import create_app
from moss_tts.server.live import SLICE_CHARS
from tests.server.helpers import Served, client_of, settings, tiny_realtime_files

MODEL = "moss-tts-realtime"
GUARD = 60            # seconds a waited-for message may take: only a broken server gets there
ROWS = 32768          # a session's most rows (the budget's limit): room for a flood's tokens
NO_PUNCTUATION = "没有标点也没有空格的中文"       # CJK without a space or a mark
HOP = 64              # samples per frame of the tiny v1 codec
SPOKEN = "Hello there, this is a live test. It speaks as the text arrives! "   # its first audio
# a whole request: one frame per token, then EOS (the steered model), seeded sampling
REQUEST = dict(input="A request spoken while a live session floods the model.",
               extra_body={"seed": 7, "max_new_frames": 200, "pcm_layout": "native"})


class CountingPattern:
    """A compiled pattern that counts the characters each of its searches is handed."""

    def __init__(self, pattern):
        self.pattern, self.chars = pattern, 0

    def __getattr__(self, name):
        search = getattr(self.pattern, name)

        def counted(string, *args, **kwargs):
            self.chars += len(string)
            return search(string, *args, **kwargs)
        return counted


@pytest.fixture
def scanned(monkeypatch):
    """The characters the segmenter hands SEGMENT_END, counted from here on."""
    counter = CountingPattern(realtime_live.SEGMENT_END)
    monkeypatch.setattr(realtime_live, "SEGMENT_END", counter)
    return counter


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    return tiny_realtime_files(tmp_path_factory.mktemp("live_flood"))


@pytest.fixture(scope="module")
def tts(files):
    with RealtimeTTS.load(files[0], codec=files[1], threads=1) as loaded:
        yield loaded


def test_a_no_space_flood_costs_the_segmenter_the_same_per_character(scanned):
    def examined(n: int) -> int:
        before, segmenter = scanned.chars, TextSegmenter()
        for ch in "y" * n:
            segmenter.push(ch)
        return scanned.chars - before

    small, large = examined(10_000), examined(100_000)
    assert small >= 10_000 and 9.5 <= large / small <= 10.5     # not ~100: no rescans


def test_a_no_space_flood_pushed_into_a_session_costs_the_same_per_character(tts, scanned):
    """Through the session as every surface feeds it; max_frames 1 ends the turn's frames at
    once, so the flood's tokens only wait (no backbone work hides the segmenter's)."""
    def examined(n: int) -> int:
        before = scanned.chars
        with tts.session(max_frames=1, max_rows=ROWS) as s:
            s.push_text("y" * n)
        return scanned.chars - before

    small, large = examined(3_000), examined(30_000)
    assert small >= 3_000 and 9 <= large / small <= 11


@pytest.mark.parametrize("text", ["y" * 3000, NO_PUNCTUATION * 200], ids=["one_letter", "cjk"])
def test_a_flood_without_spaces_is_cut_in_bounded_segments_and_its_turn_ends(tts, monkeypatch,
                                                                              text):
    with tts.session(max_frames=20, max_rows=ROWS) as s:
        handed, encode = [], tts.tokenizer.encode
        monkeypatch.setattr(tts.tokenizer, "encode",
                            lambda segment: handed.append(segment) or encode(segment))
        for i in range(0, len(text), 4000):       # as the server's messages would bring it
            s.push_text(text[i:i + 4000])
        with pytest.warns(BudgetWarning):         # its 20 frames were spoken: the turn ends
            list(s.drain())
        assert len(s.frames) == 20 and s.budget_cut
    assert "".join(handed) == text
    assert max(map(len, handed)) == MAX_BUFFER and len(handed) == -(-len(text) // MAX_BUFFER)


def test_text_past_a_turns_bound_is_refused_by_the_api(tts):
    """max_rows 320: a turn takes 320 text tokens (the tiny tokenizer: one per 'y'); the text
    before the refused one stays in the turn. max_frames 1 keeps the tokens waiting, so the
    context does not fill first."""
    bound = "^a live turn takes at most 320 text tokens, the rows of its conversation's context"
    with tts.session(max_frames=1, max_rows=320) as s:
        assert s.max_turn_tokens == s.rows[1] == 320
        s.push_text("y" * 320)                    # ten segments: 320 tokens
        with pytest.raises(InputError, match=bound) as refused:
            s.push_text("y" * 40)                 # the eleventh segment would make 352
        assert "\n" not in str(refused.value)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", BudgetWarning)
            list(s.drain())                       # what came before is spoken
        assert len(s.text_ids) == 12 and len(s.frames) == 1

        s.new_turn()
        ids = tts.tokenizer.encode("y")
        s.push_tokens(ids * 320)
        with pytest.raises(InputError, match=bound):
            s.push_tokens(ids)

        s.new_turn()
        s.push_text("y" * 321)                    # 320 tokens and 1 character buffered
        with pytest.raises(InputError, match=bound):
            s.end_text()


def test_tts_live_refuses_text_past_a_turns_bound_in_one_line(files, tmp_path):
    out = tmp_path / "live.wav"
    r = subprocess.run([sys.executable, "-m", "moss_tts", "tts", "--live", "--model", files[0],
                        "--codec", files[1], "--max-frames", "1", "--threads", "1", "-o", out],
                       input=b"y" * (SESSION_ROWS + 2 * MAX_BUFFER), capture_output=True)
    assert r.returncode == 1 and not out.exists()
    assert r.stderr.decode().splitlines() == [
        f"error: a live turn takes at most {SESSION_ROWS} text tokens, the rows of its "
        "conversation's context (each token it speaks takes one), and this turn's text goes "
        "past them: end the turn sooner and send the rest in the next"]


def ws_url(server) -> str:
    return server.url.replace("http://", "ws://") + "/v1/audio/live"


def started(ws, config: dict) -> dict:
    ws.send(json.dumps(config))
    event = json.loads(ws.recv(timeout=GUARD))
    assert event["type"] == "started", event
    return event


def send_text(ws, text: str) -> None:
    ws.send(json.dumps({"type": "text", "text": text}))


def next_event(ws) -> dict:
    """The next JSON event, the audio before it skipped."""
    while isinstance(m := ws.recv(timeout=GUARD), bytes):
        pass
    return json.loads(m)


def refused(ws, bound: str) -> None:
    """The error event naming `bound`, then the close (1008)."""
    event = next_event(ws)
    assert event["type"] == "error" and event["message"].startswith(bound), event
    with pytest.raises(ConnectionClosed) as closed:
        ws.recv(timeout=GUARD)
    assert closed.value.rcvd.code == 1008


@pytest.fixture
def serve(tmp_path, files):
    """`serve(model_class, **settings)` → a running server over its own load of the
    tiny model; stopped (before the model closes) at teardown."""
    running = []

    def start(model_class=RealtimeTTS, **kwargs):
        model = model_class.load(files[0], codec=files[1], threads=1)
        server = Served(create_app({MODEL: model}, settings(tmp_path / "voices", **kwargs)))
        running.append((server, model))
        return server, model
    yield start
    for server, model in running:
        server.stop()
        model.close()


def test_the_live_endpoint_refuses_a_turns_tokens_past_its_bound(serve):
    server, _ = serve(live_context=320)
    with connect(ws_url(server)) as ws:
        assert started(ws, {"seed": 1, "max_frames": 1})["context"] == 320
        send_text(ws, "y" * 400)
        refused(ws, "a live turn takes at most 320 text tokens")


class HeldSession:
    """A live session whose first push waits until the test releases it: the server reads the
    client's messages meanwhile, its session taking none of them."""

    def __init__(self, session, release: threading.Event):
        self._session, self._release = session, release

    def __getattr__(self, name):
        return getattr(self._session, name)

    def push_text(self, text):
        assert self._release.wait(GUARD), "the test never released the session"
        return self._session.push_text(text)


class HeldRealtime(RealtimeTTS):
    release = threading.Event()

    def session(self, *args, **kwargs):
        return HeldSession(super().session(*args, **kwargs), self.release)


def test_the_live_endpoint_refuses_a_turns_characters_as_they_arrive(serve):
    """The text a client sends faster than its session speaks it does not pile up: past the
    turn's characters (32 a token of its 320), the next message is refused as it comes."""
    server, model = serve(HeldRealtime, live_context=320)
    try:
        with connect(ws_url(server)) as ws:
            started(ws, {"seed": 1})
            for _ in range(3):                    # 12,000 characters; the bound is 10,240
                send_text(ws, "y" * 4000)
            refused(ws, f"a live turn takes at most {MAX_BUFFER * 320} characters of text")
    finally:
        model.release.set()


class LoggedRealtime(RealtimeTTS):
    """The real model, logging its work in the order the worker does it: "pull" for each chunk
    of a speech request, "text" for each character pushed into a live session. A request's
    chunks are one frame each: the chunk ladder would otherwise group frames when the machine
    is slow (it follows the clock), and the test counts what happens between two frames."""

    log: list

    def stream(self, *args, **kwargs):
        for chunk in super().stream(*args, **kwargs | {"chunk_frames": 1}):
            self.log.append("pull")
            yield chunk

    def session(self, *args, **kwargs):
        return LoggedSession(super().session(*args, **kwargs), self.log)


class LoggedSession:
    def __init__(self, session, log: list):
        self._session, self._log = session, log

    def __getattr__(self, name):
        return getattr(self._session, name)

    def push_text(self, text):
        self._log.extend(["text"] * len(text))
        return self._session.push_text(text)


def speak(server) -> bytes:
    return client_of(server).audio.speech.create(
        model=MODEL, voice="alloy", response_format="pcm", input=REQUEST["input"],
        extra_body=REQUEST["extra_body"]).content


@pytest.mark.parametrize("max_streams", [2, 1])
def test_a_request_beside_a_live_flood_goes_on_and_equals_its_audio_alone(serve, max_streams):
    """A live session floods the model with text (no space, more than its turn takes) while a
    speech request runs on the same model: the request completes with the audio it has alone;
    with --max-streams 2 the session is handed at most one slice of text (one job) between two
    chunks of the request, with 1 the request runs through once taken; the flood ends with the
    turn's bound."""
    server, model = serve(LoggedRealtime, max_streams=max_streams)
    model.log = []
    alone = speak(server)
    with connect(ws_url(server)) as ws:
        started(ws, {"seed": 1})
        send_text(ws, SPOKEN)
        for _ in range(4):                        # 16,000 'y': past the turn's 2048 tokens
            send_text(ws, "y" * 4000)
        assert isinstance(ws.recv(timeout=GUARD), bytes)       # the session speaks
        model.log.clear()
        assert speak(server) == alone
        refused(ws, f"a live turn takes at most {SESSION_ROWS} text tokens")
    log = model.log
    pulls = [i for i, work in enumerate(log) if work == "pull"]
    between = [log[a + 1:b].count("text") for a, b in zip(pulls, pulls[1:])]
    assert len(pulls) == len(alone) // (2 * HOP)    # a pull per frame of the request's audio
    if max_streams > 1:         # the flood went on beside the request, a slice a chunk
        assert 0 < sum(between) and max(between) <= SLICE_CHARS
    else:                       # one stream: the request, once taken, runs through
        assert sum(between) == 0
