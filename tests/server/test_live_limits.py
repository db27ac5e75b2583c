"""WebSocket /v1/audio/live at its limits (issue 23, holes 4, 5 and 6), with the `websockets`
client on loopback and the tiny MOSS-TTS-Realtime model: a long conversation drops its oldest
turns and goes on, a turn too long for the context ends saying so; an idle client is closed
with a reason and its place freed, as /v1/models counts; a client that never reads is cut by
the write deadline.
Each waits on an event (a message, a close frame, a log line) with a generous bound."""

import base64
import json
import os
import socket
import struct
import time

import numpy as np
import pytest
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import connect

from moss_tts.models.realtime_tts import RealtimeTTS
from moss_tts.server import create_app
from moss_tts.server.settings import ServerSettings
from tests.server.helpers import free_places, settings, tiny_realtime_files
from tests.server.test_connections import LogRecords

TEXT = "Hello there, this is a live test. It speaks as the text arrives!"
BOUND = 60     # seconds: only a broken server makes a test wait this long


class LoudSession:
    """A real live session whose audio is repeated LOUDNESS times: the tiny model says a few
    kilobytes a turn, too little to fill a socket's buffers."""

    LOUDNESS = 40

    def __init__(self, session):
        self._session = session

    def __getattr__(self, name):
        return getattr(self._session, name)

    def push_text(self, text):
        return np.tile(self._session.push_text(text), self.LOUDNESS)

    def drain(self):
        return (np.tile(chunk, self.LOUDNESS) for chunk in self._session.drain())


class LoudRealtime(RealtimeTTS):
    def session(self, *args, **kwargs):
        return LoudSession(super().session(*args, **kwargs))


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    return tiny_realtime_files(tmp_path_factory.mktemp("live-limits"))


@pytest.fixture
def serve(tmp_path, files, served):
    loaded = []

    def start(model_class=RealtimeTTS, limits=ServerSettings(), sndbuf=None, **kwargs):
        tts = model_class.load(files[0], codec=files[1], threads=1)
        loaded.append(tts)
        return served(create_app({"moss-tts-realtime": tts}, settings(tmp_path / "voices",
                                 **kwargs)), limits, sndbuf=sndbuf)
    yield start
    served.stop_all()     # before the models close (`served` tears down after this fixture)
    for tts in loaded:
        tts.close()


def ws_url(server):
    return server.url.replace("http://", "ws://") + "/v1/audio/live"


def send(ws, message: dict) -> None:
    ws.send(json.dumps(message))


def next_event(ws) -> tuple[int, dict]:
    """(bytes of audio before it, the next JSON event)."""
    audio = 0
    while isinstance(m := ws.recv(timeout=BOUND), bytes):
        audio += len(m)
    return audio, json.loads(m)


def closed_with(ws) -> tuple[int, str]:
    """The close frame's (code, reason), once the server closes."""
    with pytest.raises(ConnectionClosed) as closed:
        ws.recv(timeout=BOUND)
    return closed.value.rcvd.code, closed.value.rcvd.reason



def test_a_long_conversation_drops_its_oldest_turns_and_goes_on(serve):
    s = serve(live_context=640)       # the system block and about seven turns of TEXT
    trimmed, spoken = [], 0
    with connect(ws_url(s)) as ws:
        send(ws, {"seed": 1})
        _, started = next_event(ws)
        assert started["type"] == "started" and started["context"] == 640
        for turn in range(16):        # more rows in all than the context holds
            if turn:
                send(ws, {"type": "turn", "user_text": "And again?"})
            send(ws, {"type": "text", "text": TEXT})
            send(ws, {"type": "end"})
            audio, event = next_event(ws)
            if event["type"] == "context_trimmed":      # told before the turn's audio
                trimmed.append(event)
                audio, event = next_event(ws)
            assert event["type"] == "turn_done" and not event["interrupted"], event
            assert audio > 0 and "cut" not in event
            spoken += 1
    assert spoken == 16 and trimmed and all(t["turns_dropped"] > 0 for t in trimmed)
    assert all(t["context_left"] >= 640 / 2 for t in trimmed)


def test_a_turn_that_fills_the_context_ends_saying_so(serve):
    s = serve(live_context=320)       # the system block and one turn: nothing to drop
    with connect(ws_url(s)) as ws:
        send(ws, {"seed": 1})
        assert next_event(ws)[1]["context"] == 320
        send(ws, {"type": "text", "text": TEXT})
        send(ws, {"type": "end"})
        audio, done = next_event(ws)
        assert done["type"] == "turn_done" and not done["interrupted"] and audio > 0
        assert 0 < done["context_left"] < 320 / 4
        send(ws, {"type": "turn", "user_text": "Again, longer."})
        send(ws, {"type": "text", "text": TEXT * 3})
        send(ws, {"type": "end"})
        _, cut = next_event(ws)                          # the turn ends, saying why
        assert cut == {"type": "turn_done", "interrupted": True, "context_full": True,
                       "seconds": cut["seconds"], "context_left": cut["context_left"]}
        _, error = next_event(ws)
        assert error["type"] == "error" and "filled its context of 320 rows" in \
            error["message"] and "--live-context" in error["message"]
        code, reason = closed_with(ws)
    assert code == 1008 and "--live-context" in reason
    assert free_places(s, BOUND) == 5                           # its place is back (queue 4 + 1)


def test_a_context_too_small_for_the_system_block_names_the_flag(serve):
    s = serve(live_context=32)                 # the tiny model's system block is longer
    with connect(ws_url(s)) as ws:
        send(ws, {"seed": 1})
        _, error = next_event(ws)
        code, _ = closed_with(ws)
    assert error["type"] == "error" and code == 1008
    assert "--live-context" in error["message"] and "system" in error["message"]


@pytest.mark.filterwarnings("ignore::moss_tts.errors.BudgetWarning")   # the session's own
def test_a_turn_cut_at_its_frame_budget_says_so(serve):
    s = serve()
    for max_frames, cut in ((5, "max_frames"), (None, None)):   # a cap, and the model's end
        with connect(ws_url(s)) as ws:
            send(ws, {"seed": 1} | ({"max_frames": max_frames} if max_frames else {}))
            assert next_event(ws)[1]["type"] == "started"
            send(ws, {"type": "text", "text": TEXT})
            send(ws, {"type": "end"})
            audio, done = next_event(ws)
        assert done["type"] == "turn_done" and not done["interrupted"] and audio > 0
        assert done.get("cut") == cut, done


@pytest.mark.parametrize("configured", [True, False])
def test_an_idle_live_client_is_closed_with_a_reason_and_frees_its_place(serve, configured):
    s = serve(queue_depth=0, live_idle=0.5)              # one place: the idle client's
    with connect(ws_url(s)) as ws:
        if configured:
            send(ws, {"seed": 1})
            assert next_event(ws)[1]["type"] == "started"
            send(ws, {"type": "text", "text": "Hi there, friend."})   # speaks, then is idle
            send(ws, {"type": "end"})
            assert next_event(ws)[1]["type"] == "turn_done"
        _, error = next_event(ws)
        code, reason = closed_with(ws)
    assert error["type"] == "error" and "--live-idle" in error["message"]
    assert code == 1008 and "idle" in reason
    with connect(ws_url(s)) as again:                    # its place is free
        send(again, {"seed": 1})
        assert next_event(again)[1]["type"] == "started"


def test_models_list_says_how_many_places_are_free(serve):
    s = serve(queue_depth=1)
    assert free_places(s, BOUND) == 2
    with connect(ws_url(s)) as ws:
        send(ws, {"seed": 1})
        assert next_event(ws)[1]["type"] == "started"
        assert free_places(s, BOUND) == 1                       # the live connection holds one
    deadline = time.monotonic() + BOUND                  # the server sees it leave
    while free_places(s, BOUND) != 2:
        assert time.monotonic() < deadline, "a closed live connection kept its place"
        time.sleep(0.05)


def raw_live_client(port: int) -> socket.socket:
    """A WebSocket to /v1/audio/live over a bare socket with a small receive buffer, whose
    reading we control (a client library reads ahead into its own memory)."""
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.connect(("127.0.0.1", port))
    key = base64.b64encode(os.urandom(16))
    sock.sendall(b"GET /v1/audio/live HTTP/1.1\r\nHost: 127.0.0.1:%d\r\nUpgrade: websocket\r\n"
                 b"Connection: Upgrade\r\nSec-WebSocket-Key: %s\r\n"
                 b"Sec-WebSocket-Version: 13\r\n\r\n" % (port, key))
    sock.settimeout(BOUND)
    head = b""
    while b"\r\n\r\n" not in head:
        head += sock.recv(1)
    assert head.startswith(b"HTTP/1.1 101"), head
    return sock


def send_raw(sock: socket.socket, message: dict) -> None:
    """One masked text frame, as a client must send it (RFC 6455 §5.3)."""
    payload, mask = json.dumps(message).encode(), os.urandom(4)
    size = bytes([0x80 | len(payload)]) if len(payload) < 126 else \
        bytes([0x80 | 126]) + struct.pack("!H", len(payload))
    sock.sendall(b"\x81" + size + mask + bytes(b ^ mask[i % 4] for i, b in enumerate(payload)))


def recv_raw_text(sock: socket.socket) -> dict:
    """The next frame, a short unmasked text frame from the server."""
    opcode, size = sock.recv(1)[0] & 0x0F, sock.recv(1)[0]
    assert opcode == 1 and size < 126
    data = b""
    while len(data) < size:
        data += sock.recv(size - len(data))
    return json.loads(data)


def test_a_live_client_that_never_reads_is_cut_and_its_place_freed(serve):
    s = serve(LoudRealtime, ServerSettings(write_timeout=1.0), sndbuf=4096, queue_depth=0,
              write_timeout=1.0)
    with LogRecords(watch="stopped reading") as log:
        sock = raw_live_client(s.port)
        try:
            send_raw(sock, {"seed": 1})
            assert recv_raw_text(sock)["type"] == "started"
            send_raw(sock, {"type": "text", "text": TEXT * 6})    # and never reads again
            send_raw(sock, {"type": "end"})
            assert log.seen.wait(BOUND), "a live client that never read was never cut"
            connections = s.server.server_state.connections
            deadline = time.monotonic() + BOUND          # its socket is gone, not left open
            while connections:
                assert time.monotonic() < deadline, "the cut client's socket stayed open"
                time.sleep(0.05)
        finally:
            sock.close()
        with connect(ws_url(s)) as again:                # its place is free
            send(again, {"seed": 1})
            assert next_event(again)[1]["type"] == "started"
    log.assert_no_traceback()
