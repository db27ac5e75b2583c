"""The server's model worker under hostile clients: a full line, slow references, clients that
leave or stop reading, failures inside streams, and the one-model-one-thread rule. A stub
stands in for the model (endless, held or failing generation); the queue, the threads, HTTP
and the sockets are real. The tests wait on events (the stub's, or the app's through
`Watched`), never for time to pass, so a busy machine only makes them slower."""

import contextlib
import http.client
import json
import logging
import threading

import numpy as np
import pytest

from moss_tts.errors import BackendError
from moss_tts.server import create_app
from moss_tts.server.worker import ModelWorker
from tests.server.helpers import SR, StubTTS, call, raw_post, settings, silent_wav_b64

GUARD = 60      # seconds: only a broken worker makes a test wait this long


class Watched:
    """The app, counting where its HTTP requests stand so that a test can wait for a state:
    `waiting`, requests that read their body and now listen for their client to leave (the
    server listens so only once the work is in the worker's line), and `finished`, requests
    whose handler has returned."""

    def __init__(self, app):
        self.app, self.changed = app, threading.Condition()
        self.waiting = self.finished = 0

    def _count(self, name):
        with self.changed:
            setattr(self, name, getattr(self, name) + 1)
            self.changed.notify_all()

    def wait_until(self, name, n):
        with self.changed:
            assert self.changed.wait_for(lambda: getattr(self, name) >= n, 20), \
                f"{name} stayed at {getattr(self, name)}, expected {n}"

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        body_read, counted = False, False

        async def watched_receive():
            nonlocal body_read, counted
            if body_read and not counted:
                counted = True
                self._count("waiting")
            message = await receive()
            body_read = body_read or (message["type"] == "http.request"
                                      and not message.get("more_body", False))
            return message
        try:
            await self.app(scope, watched_receive, send)
        finally:
            self._count("finished")


@pytest.fixture
def serve(tmp_path, served):
    def start(tts, **kwargs):
        given = settings(tmp_path / "voices", **kwargs)
        app = Watched(create_app(tts, given))
        s = served(app, given)
        s.watched = app
        return s
    return start


def in_thread(target, *args):
    out = {}
    t = threading.Thread(target=lambda: out.setdefault("result", target(*args)))
    t.start()
    return t, out


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


class DecodesTogether:
    """A model with `decoding_together`, which does nothing here: the worker's loop for
    max_streams > 1 with jobs that only log what ran."""

    @contextlib.contextmanager
    def decoding_together(self, n):
        yield


def flood_beside_a_request(max_streams: int, *, one_at_a_time: bool) -> list[str]:
    """What the worker ran, in order, when a live session's lane floods it with 10 jobs beside
    a 5-chunk speech request: "session" per session job, "pull" per chunk of the request. The
    session's first job holds the worker while the request and the flood are submitted (all
    at once, or with `one_at_a_time` each job submitting the next, as a live connection
    does), so the order is the worker's choice alone."""
    worker = ModelWorker(DecodesTogether(), depth=4, max_streams=max_streams)
    ran, holding, gate, flooded = [], threading.Event(), threading.Event(), threading.Event()

    def session_job(left):       # `left` jobs of the flood after this one
        def job(model):
            ran.append("session")
            if left == 0:
                flooded.set()
            elif one_at_a_time:
                lane.submit(session_job(left - 1))
        return job

    def hold(model):
        holding.set()
        assert gate.wait(GUARD), "the test never released the worker"
        session_job(9)(model)

    def request(model):
        for _ in range(5):
            ran.append("pull")
            yield None
        return "spoken"
    try:
        lane = worker.open_lane()
        lane.submit(hold)                # places the session (max_streams > 1)
        assert holding.wait(GUARD)
        spoken = worker.submit(request, stream=True)
        for left in reversed(range(0 if one_at_a_time else 9)):
            lane.submit(session_job(left))
        gate.set()
        assert spoken.result(GUARD) == "spoken" and flooded.wait(GUARD)
        return ran
    finally:
        gate.set()
        lane.release()
        worker.close()


def test_a_flooding_live_session_runs_one_job_between_two_pulls_of_a_request():
    """max_streams > 1: a placed session's jobs go ahead of the line, but one a round: the
    request beside it gets a pull between each two (issue 31, finding 3), not after them."""
    ran = flood_beside_a_request(2, one_at_a_time=False)
    assert ran[:10] == ["session", "pull"] * 5
    assert ran.count("session") == 10


def test_a_flooding_live_session_and_a_request_take_turns_with_one_stream():
    """max_streams 1: jobs run in arrival order, a request through; a session that submits its
    next job as the last ends (as a live connection does) lets a request that came meanwhile
    run next, not after its flood."""
    ran = flood_beside_a_request(1, one_at_a_time=True)
    assert ran[:6] == ["session"] + ["pull"] * 5
    assert ran.count("session") == 10


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
    tts = StubTTS()
    s = serve(tts, queue_depth=0)
    first, out = in_thread(call, s.url, "/v1/audio/speech", {"input": "held"})
    assert tts.started.wait(20)                      # the one slot is taken
    st, h, _ = call(s.url, "/v1/audio/speech", {"input": "b"})
    tts.release.set()
    first.join()
    assert st == 503 and h["retry-after"] == "2"
    assert out["result"][0] == 200
    assert call(s.url, "/v1/audio/speech", {"input": "c"})[0] == 200  # free again
    assert tts.texts == ["held", "c"]


def test_reference_encode_runs_on_the_worker_and_counts_against_the_line(serve):
    tts = StubTTS(hold_encode=True)
    s = serve(tts, queue_depth=0)
    body = {"input": "hi", "reference_audio": silent_wav_b64(), "response_format": "wav"}
    slow, out = in_thread(call, s.url, "/v1/audio/speech", body)
    assert tts.encoding.wait(20)
    # the encode is held until released below: these answer while it still runs (a server
    # that waited for it would hang them into their timeout)
    try:
        assert call(s.url, "/health", timeout=20)[0] == 200   # the event loop is free
        assert call(s.url, "/v1/audio/speech", body, timeout=20)[0] == 503
        assert call(s.url, "/v1/audio/voices", {"name": "v", "audio": silent_wav_b64()},
                    timeout=20)[0] == 503
        assert not tts.texts                          # the speech waits for its encode
    finally:
        tts.release.set()
    slow.join()
    assert out["result"][0] == 200 and tts.threads == {"moss-tts-model"}


def test_a_non_streaming_request_is_cancelled_when_its_client_leaves(serve):
    tts = StubTTS()
    s = serve(tts)
    sock = raw_post(s.port, {"input": "endless", "response_format": "pcm"})
    assert tts.started.wait(20)
    sock.close()
    assert tts.stopped.wait(20), "generation kept running after the client left"
    assert len(tts.produced) < 100_000
    # one worker thread: this runs only once the endless job has returned
    assert call(s.url, "/v1/audio/speech", {"input": "x", "response_format": "pcm"})[0] == 200
    assert tts.texts == ["endless", "x"]


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
        assert tts.started.wait(20)          # it is streaming; the client never reads
        # "x" waits in line behind the stalled stream: it is answered only if the stall is
        # detected (after write_timeout) and frees the worker, long before the endless stub
        # would end by itself (minutes) or this call's timeout
        st, _, _ = call(s.url, "/v1/audio/speech", {"input": "x", "response_format": "pcm"},
                        timeout=60)
        assert st == 200 and tts.stopped.is_set() and tts.texts == ["endless", "x"]
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
    held, out = in_thread(call, s.url, "/v1/audio/speech", {"input": "held",
                                                             "response_format": "pcm"})
    assert tts.started.wait(20)
    body = {"input": "endless", "response_format": "pcm"}
    sock = raw_post(s.port, body | ({"stream_format": stream_format} if stream_format else {}))
    s.watched.wait_until("waiting", 2)     # the held request, and this one in line behind it
    sock.close()                           # leaves while the held request still runs
    s.watched.wait_until("finished", 1)    # the server has seen it leave
    tts.release.set()
    held.join()
    # one worker thread, first in first out: "x" runs after the line's endless job is done
    assert call(s.url, "/v1/audio/speech", {"input": "x", "response_format": "pcm"})[0] == 200
    assert out["result"][0] == 200 and tts.texts == ["held", "x"]
