"""The server's connections under clients that hold them (issue 23, holes 3 and 6), over raw
loopback sockets: held sockets are bounded by --max-connections and --header-timeout while
/health still answers, and a client that never reads a whole (non-streamed) response is cut
by the write deadline. Each waits on an event (a socket's end, a log line), with generous
bounds, never for time to pass."""

import json
import logging
import socket
import threading
import time

import pytest

from moss_tts.server import create_app
from moss_tts.server.settings import ServerSettings
from tests.server.helpers import BOUND, SR, StubTTS, call, read_to_end, settings, until



class LogRecords(logging.Handler):
    """Every record of the server's loggers (uvicorn's do not propagate to the root), and an
    event set when a message holds `watch`."""

    LOGGERS = ("", "uvicorn", "uvicorn.access")   # the others propagate to one of these

    def __init__(self, watch: str = "\0"):
        super().__init__(logging.DEBUG)
        self.records, self.watch, self.seen = [], watch, threading.Event()

    def emit(self, record):
        self.records.append(record)
        if self.watch in record.getMessage():
            self.seen.set()

    def __enter__(self):
        for name in self.LOGGERS:
            log = logging.getLogger(name)
            log.addHandler(self)
        moss = logging.getLogger("moss_tts")
        self.levels = moss.level
        moss.setLevel(logging.INFO)      # the throttled lines about clients are INFO or more
        return self

    def __exit__(self, *exc):
        for name in self.LOGGERS:
            logging.getLogger(name).removeHandler(self)
        logging.getLogger("moss_tts").setLevel(self.levels)

    def lines(self, text: str) -> list[str]:
        return [r.getMessage() for r in self.records if text in r.getMessage()]

    def assert_no_traceback(self):
        bad = [r.getMessage() for r in self.records
               if r.exc_info or r.levelno >= logging.ERROR]
        assert not bad, bad




@pytest.fixture
def serve(tmp_path, served):
    return lambda tts, limits, **kwargs: served(
        create_app(tts, settings(tmp_path / "voices", **kwargs)), limits, sndbuf=4096)


def test_held_connections_are_bounded_and_health_still_answers(serve):
    with LogRecords() as log:
        s = serve(StubTTS(), ServerSettings(max_connections=8, header_timeout=1.0))
        held = []
        for _ in range(12):      # each sends half a request's headers, then nothing
            sock = socket.create_connection(("127.0.0.1", s.port))
            sock.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n")
            held.append(sock)
        st, _, body = call(s.url, "/health", timeout=BOUND)   # at the limit: a clean 503
        assert st == 200 or (st == 503 and "busy" in json.loads(body)["error"]["message"])
        answers = [read_to_end(sock) for sock in held]      # the server ends every one
        for sock in held:
            sock.close()
        # past the limit: a 503 at once; within it: closed when the header deadline passed
        refused = [a for a in answers if a.startswith(b"HTTP/1.1 503")]
        assert len(refused) == 4 and answers.count(b"") == 8, answers
        assert b'"error"' in refused[0] and b"retry-after: 2" in refused[0].lower()
        assert call(s.url, "/health", timeout=BOUND)[0] == 200
    log.assert_no_traceback()
    assert len(log.lines("refused a connection")) == 1        # once, not per connection
    assert len(log.lines("sent no request headers")) == 1


def test_a_connection_that_keeps_alive_but_never_finishes_its_next_headers_is_closed(serve):
    s = serve(StubTTS(), ServerSettings(header_timeout=1.0))
    sock = socket.create_connection(("127.0.0.1", s.port))
    host = b"Host: 127.0.0.1:%d\r\n" % s.port
    sock.sendall(b"GET /health HTTP/1.1\r\n" + host + b"\r\n")
    first = b""
    sock.settimeout(BOUND)
    while not first.endswith(b"}"):          # the whole first answer (a JSON body)
        first += sock.recv(1 << 16)
    # then a second request, unfinished: its first bytes stop uvicorn's keep-alive timer
    sock.sendall(b"GET /health HTTP/1.1\r\n" + host)
    answer = first + read_to_end(sock)
    sock.close()
    assert answer.startswith(b"HTTP/1.1 200") and answer.count(b"HTTP/1.1") == 1


def test_a_client_that_never_reads_a_whole_response_is_cut(serve):
    tts = StubTTS(chunk_frames=SR * 100)      # 3 chunks: 2.9 MB of native s16 stereo
    with LogRecords(watch="stopped reading") as log:
        s = serve(tts, ServerSettings(write_timeout=1.0), write_timeout=1.0)
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        sock.connect(("127.0.0.1", s.port))
        data = json.dumps({"input": "x", "response_format": "pcm",
                           "pcm_layout": "native"}).encode()
        sock.sendall(b"POST /v1/audio/speech HTTP/1.1\r\nHost: 127.0.0.1:%d\r\nContent-Type: "
                     b"application/json\r\nContent-Length: %d\r\n\r\n%s"
                     % (s.port, len(data), data))
        assert log.seen.wait(BOUND), "a client that never read was never cut"
        got = read_to_end(sock)                 # what the kernel held, then the cut
        sock.close()
        head, _, body = got.partition(b"\r\n\r\n")
        length = int(next(line.split(b":")[1] for line in head.split(b"\r\n")
                          if line.lower().startswith(b"content-length")))
        assert len(body) < length               # cut mid-body, its memory freed
        assert call(s.url, "/v1/audio/speech", {"input": "y", "response_format": "pcm"},
                    timeout=BOUND)[0] == 200
        # the server drops a closed connection on its own loop turn, after the answer: wait
        # for that state (bounded), never assume it has happened
        assert until(lambda: not s.server.server_state.connections), "a connection stayed"
    log.assert_no_traceback()
