"""The server's model worker under hostile clients: a full line, slow references, clients that
leave or stop reading, failures inside streams, and the one-model-one-thread rule. A stub
stands in for the model's speed only (endless, slow or failing generation); the queue, the
threads, HTTP and the sockets are real."""

import http.client
import json
import logging
import socket
import threading
import time

import numpy as np
import pytest

from moss_tts.errors import BackendError
from moss_tts.server import create_app
from moss_tts.server_worker import ModelWorker
from tests.server_helpers import SR, Served, StubTTS, call, silent_wav_b64


@pytest.fixture
def serve(tmp_path):
    started = []

    def start(tts, **kwargs):
        s = Served(create_app(tts, voices_root=tmp_path / "voices", **kwargs))
        started.append(s)
        return s
    yield start
    for s in started:
        s.stop()


def in_thread(target, *args):
    out = {}
    t = threading.Thread(target=lambda: out.setdefault("result", target(*args)))
    t.start()
    return t, out


def raw_post(port, body: dict, *, rcvbuf=None) -> socket.socket:
    """A POST sent over a bare socket whose reader we control (or never run)."""
    sock = socket.socket()
    if rcvbuf:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
    sock.connect(("127.0.0.1", port))
    data = json.dumps(body).encode()
    sock.sendall(b"POST /v1/audio/speech HTTP/1.1\r\nHost: 127.0.0.1:%d\r\n"
                 b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n%s"
                 % (port, len(data), data))
    return sock


def test_worker_runs_one_job_at_a_time_and_refuses_past_depth():
    worker, gate = ModelWorker(object(), depth=1), threading.Event()
    try:
        first = worker.submit(lambda model: gate.wait(10) and "first")
        second = worker.submit(lambda model: "second")
        assert first is not None and second is not None
        assert worker.submit(lambda model: "third") is None  # 1 running + 1 waiting
        gate.set()
        assert (first.result(10), second.result(10)) == ("first", "second")
        assert worker.submit(lambda model: "again").result(10) == "again"  # slots came back
    finally:
        worker.close()


@pytest.mark.parametrize("fails", [False, True])
def test_a_jobs_slot_is_free_when_its_outcome_is_seen(fails):
    """A client that has its answer and asks again at once finds the line free. A done-callback
    runs the moment the outcome is set, on the worker's thread: the strictest "at once"."""
    worker = ModelWorker(object(), depth=0)
    gate, asked, again = threading.Event(), threading.Event(), []

    def job(model):
        gate.wait(10)        # the callback below is attached while the job runs
        if fails:
            raise ValueError("the job failed")
        return "first"

    def ask_again(future):
        again.append(worker.submit(lambda model: "again"))
        asked.set()
    try:
        first = worker.submit(job)
        first.add_done_callback(ask_again)
        gate.set()
        assert asked.wait(10)
        assert again[0] is not None, "the line was still full after the first job's outcome"
        assert again[0].result(10) == "again"
    finally:
        worker.close()


def test_the_model_refuses_any_thread_but_its_worker():
    tts = StubTTS()
    worker = ModelWorker(tts, depth=1)
    try:
        with pytest.raises(BackendError, match="moss-tts-model"):
            worker.model.encode_reference(np.zeros((4, 1)), SR)
        assert worker.model.sample_rate == SR   # plain attributes stay readable
        codes = worker.submit(lambda m: m.encode_reference(np.zeros((4, 1)), SR).codes).result(10)
        assert codes.shape == (4, 2) and tts.threads == {"moss-tts-model"}
    finally:
        worker.close()


def test_overload_answers_503_with_retry_after(serve):
    s = serve(StubTTS(), queue_depth=0)
    first, _ = in_thread(call, s.url, "/v1/audio/speech", {"input": "slow"})
    time.sleep(0.3)
    st, h, _ = call(s.url, "/v1/audio/speech", {"input": "b"})
    first.join()
    assert st == 503 and h["retry-after"] == "2"
    assert call(s.url, "/v1/audio/speech", {"input": "c"})[0] == 200  # free again


def test_reference_encode_runs_on_the_worker_and_counts_against_the_line(serve):
    tts = StubTTS(encode_seconds=2.0)
    s = serve(tts, queue_depth=0)
    body = {"input": "hi", "reference_audio": silent_wav_b64(), "response_format": "wav"}
    slow, out = in_thread(call, s.url, "/v1/audio/speech", body)
    time.sleep(0.3)
    t0 = time.monotonic()
    assert call(s.url, "/health")[0] == 200          # the event loop is free meanwhile
    assert call(s.url, "/v1/audio/speech", body)[0] == 503
    assert call(s.url, "/v1/audio/voices", {"name": "v", "audio": silent_wav_b64()})[0] == 503
    assert time.monotonic() - t0 < 1.0
    slow.join()
    assert out["result"][0] == 200 and tts.threads == {"moss-tts-model"}


def test_a_non_streaming_request_is_cancelled_when_its_client_leaves(serve):
    tts = StubTTS()
    s = serve(tts)
    sock = raw_post(s.port, {"input": "endless", "response_format": "pcm"})
    time.sleep(0.5)
    sock.close()
    assert tts.stopped.wait(5), "generation kept running after the client left"
    n = len(tts.produced)
    time.sleep(0.3)
    assert len(tts.produced) == n < 100_000
    assert call(s.url, "/v1/audio/speech", {"input": "x", "response_format": "pcm"})[0] == 200


def test_client_disconnect_stops_its_streamed_generation(serve):
    tts = StubTTS()
    s = serve(tts)
    sock = raw_post(s.port, {"input": "endless", "stream_format": "audio",
                             "response_format": "pcm"})
    assert sock.recv(512)
    sock.close()  # the client goes away mid-stream
    assert tts.stopped.wait(10), "generation kept running after the client left"
    assert len(tts.produced) < 100_000


@pytest.mark.parametrize("stream_format", ["sse", "audio"])
def test_a_client_that_stops_reading_is_dropped_and_frees_the_model(serve, caplog,
                                                                    stream_format):
    tts = StubTTS(chunk_frames=SR * 5)       # big chunks fill the socket buffers quickly
    s = serve(tts, write_timeout=1.0)
    stalled = raw_post(s.port, {"input": "endless", "stream_format": stream_format,
                                "response_format": "pcm"}, rcvbuf=4096)
    try:
        time.sleep(0.5)                      # it is streaming; the client never reads
        t0 = time.monotonic()
        st, _, _ = call(s.url, "/v1/audio/speech", {"input": "x", "response_format": "pcm"},
                        timeout=20)
        assert st == 200 and time.monotonic() - t0 < 6
        assert tts.stopped.is_set()
        assert "stopped reading" in caplog.text
        stalled.settimeout(10)               # the server closed it: reading ends in EOF
        while stalled.recv(1 << 16):
            pass
    finally:
        stalled.close()


def test_a_failure_inside_an_sse_stream_ends_it_with_an_error_event(serve, caplog):
    s = serve(StubTTS())
    st, _, body = call(s.url, "/v1/audio/speech", {"input": "fail-late", "stream_format": "sse"})
    blocks = body.decode().strip().split("\n\n")
    assert st == 200 and blocks[0].startswith("data: ")
    assert blocks[-1].startswith("event: error\n") and "late failure" in blocks[-1]
    assert "late failure" in caplog.text


def test_a_failure_inside_a_raw_audio_stream_cuts_the_connection_and_is_logged(serve, caplog):
    s = serve(StubTTS())
    conn = http.client.HTTPConnection("127.0.0.1", s.port, timeout=20)
    conn.request("POST", "/v1/audio/speech", json.dumps(
        {"input": "fail-late", "stream_format": "audio", "response_format": "pcm"}),
        {"Content-Type": "application/json"})
    r = conn.getresponse()
    assert r.status == 200
    with pytest.raises(http.client.IncompleteRead):   # no clean end: the client can tell
        r.read()
    assert "late failure" in caplog.text


@pytest.mark.parametrize("text,status", [("fail-early", 400), ("bug", 500)])
@pytest.mark.parametrize("stream_format", [None, "sse", "audio"])
def test_failures_before_the_first_audio_are_plain_error_answers(serve, caplog, text, status,
                                                                 stream_format):
    s = serve(StubTTS())
    body = {"input": text, "response_format": "pcm"}
    if stream_format:
        body["stream_format"] = stream_format
    with caplog.at_level(logging.ERROR):
        st, _, raw = call(s.url, "/v1/audio/speech", body)
    assert st == status and json.loads(raw)["error"]["message"]
    assert (status == 500) == ("a bug" in caplog.text)   # our bugs are logged, user errors not


@pytest.mark.parametrize("stream_format", [None, "audio"])
def test_a_request_whose_client_leaves_while_waiting_never_runs(serve, stream_format):
    tts = StubTTS()
    s = serve(tts, queue_depth=1)
    slow, out = in_thread(call, s.url, "/v1/audio/speech", {"input": "slow",
                                                             "response_format": "pcm"})
    time.sleep(0.3)
    body = {"input": "endless", "response_format": "pcm"}
    sock = raw_post(s.port, body | ({"stream_format": stream_format} if stream_format else {}))
    time.sleep(0.3)
    sock.close()                  # leaves while the slow request still runs
    slow.join()
    time.sleep(1.0)
    assert out["result"][0] == 200 and len(tts.produced) == 3   # only the slow one's chunks
