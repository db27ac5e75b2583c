"""serve --max-streams (issue 25): concurrent speech requests to one Nano model decoded together
in one batched decode (worker.py's `_together`, NanoTTS.decoding_together). Each request's audio
must equal the same request served alone by the one-request-at-a-time server (the batched
decoder makes the codes a stream makes alone, models/nano_decode.py, after upstream's
per-utterance sampling loop in MOSS-TTS-Nano's inference), a bad request fails alone, a client
that stops reading holds up no other stream, and a model without a batched decoder refuses the
flag. No timing is asserted."""

import base64
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import openai
import pytest

from moss_tts.errors import InputError
from moss_tts.models.nano_tts import NanoTTS
from moss_tts.server import create_app
from moss_tts.server.worker import ModelWorker
from moss_tts.server.settings import ServerSettings
from tests.server.helpers import (StubTTS, client_of, free_places, raw_post, settings,
                                  tiny_model_files)

# four different requests: texts, seeds, budgets, whole and streamed, two formats
REQUESTS = [
    dict(input="Hello there.", fmt="wav", streamed=False, extra={"seed": 5, "max_new_frames": 12}),
    dict(input="A second, longer sentence to say.", fmt="pcm", streamed=True,
         extra={"seed": 7, "max_new_frames": 20}),
    dict(input="Third one. It has two sentences.", fmt="wav", streamed=True,
         extra={"seed": 11, "max_new_frames": 9, "max_text_tokens": 4}),
    dict(input="Four.", fmt="pcm", streamed=False, extra={"seed": 3, "max_new_frames": 15}),
]
NOT_AUDIO = base64.b64encode(b"this is not a wav file").decode()


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("max_streams")
    return d, tiny_model_files(d)


@pytest.fixture
def clients(files, served):
    """(alone, together): openai clients of a default server and of a --max-streams 4 one,
    each over its own load of the tiny Nano model."""
    d, (model, codec) = files
    loaded = [NanoTTS.load(model, codec=codec, threads=1) for _ in range(2)]
    apps = [create_app(loaded[0], settings(d / "voices")),
            create_app(loaded[1], settings(d / "voices", max_streams=4))]
    yield [openai.OpenAI(base_url=served(app).url + "/v1", api_key="unused", max_retries=0)
           for app in apps]
    served.stop_all()
    for tts in loaded:
        tts.close()


def speak(client, r) -> bytes:
    args = dict(model="tts-1", voice="alloy", input=r["input"], response_format=r["fmt"],
                extra_body=r["extra"])
    if not r["streamed"]:
        return client.audio.speech.create(**args).content
    with client.audio.speech.with_streaming_response.create(**args) as response:
        return b"".join(response.iter_bytes(chunk_size=64))


def test_concurrent_requests_equal_each_served_alone_and_a_bad_one_fails_alone(clients):
    alone, together = clients
    expected = [speak(alone, r) for r in REQUESTS]
    assert len({len(e) for e in expected}) > 1     # the requests differ, so mixing them shows
    bad = dict(input="Hello there.", fmt="wav", streamed=True,
               extra={"seed": 1, "reference_audio": NOT_AUDIO})
    with ThreadPoolExecutor(len(REQUESTS) + 1) as pool:
        futures = [pool.submit(speak, together, r) for r in [*REQUESTS[:2], bad, *REQUESTS[2:]]]
        with pytest.raises(openai.APIStatusError) as failed:
            futures[2].result()
        got = [f.result() for i, f in enumerate(futures) if i != 2]
    assert failed.value.status_code in (400, 422)
    assert "reference_audio" in failed.value.message
    for g, e in zip(got, expected):
        assert g == e
    # and the batched server serves the same requests one by one alike
    assert [speak(together, r) for r in REQUESTS[:2]] == expected[:2]


def test_the_worker_runs_stream_jobs_together(files):
    """Held behind a plain job, four stream jobs all start before any ends, their chunks are
    pulled in turn, and each one's audio equals its `synthesize` outside any batch."""
    _, (model, codec) = files
    tts = NanoTTS.load(model, codec=codec, threads=1)
    try:
        texts = [("Hello there.", 5), ("Another sentence here.", 6), ("Short.", 7),
                 ("The last of the four.", 8)]
        expected = [tts.synthesize(t, seed=s, max_frames=10)[0] for t, s in texts]
        worker = ModelWorker(tts, depth=2, max_streams=4)
        events, gate = [], threading.Event()
        held = worker.submit(lambda model: gate.wait(60))

        def job(k, text, seed):
            def run(model):
                parts = []
                for part in model.stream(text, seed=seed, max_frames=10):
                    events.append(k)
                    parts.append(part)
                    yield
                events.append(("end", k))
                return np.concatenate(parts)
            return run

        futures = [worker.submit(job(k, t, s), stream=True) for k, (t, s) in enumerate(texts)]
        last = worker.submit(lambda model: "last")          # the held one, 4 streams, this:
        assert worker.submit(lambda model: None) is None    # 2 + 4 places, all taken
        gate.set()
        assert held.result(60)
        assert last.result(60) == "last"
        got = [f.result(60) for f in futures]
        worker.close()
    finally:
        tts.close()
    for g, e in zip(got, expected):
        assert np.array_equal(g, e)
    first_end = min(i for i, e in enumerate(events) if isinstance(e, tuple))
    assert set(events[:first_end]) == {0, 1, 2, 3}
    assert events[:4] == [0, 1, 2, 3]          # one chunk of each in turn


LONG = "Hello there, this is a longer text to speak for a while."
# a stream that outlasts the buffers between the worker and a client that reads nothing (the
# channel's 32 chunks, the transport's 64 KiB, 4 KiB socket buffers): hundreds of 1280-byte
# SSE chunks; and one beside it that outlasts those buffers' worth of chunks too
STALLED = {"input": " ".join([LONG] * 3), "seed": 3, "max_new_frames": 1000,
           "stream_format": "sse", "response_format": "pcm"}
BESIDE = dict(input=LONG, fmt="pcm", streamed=True, extra={"seed": 2, "max_new_frames": 1000})
CUT_AFTER = {"long": 600.0, "short": 1.0}   # --write-timeout: past any wait here, or soon


@pytest.mark.parametrize("write_timeout", ["long", "short"])
def test_a_client_that_stops_reading_does_not_hold_up_the_streams_beside_it(
        files, served, caplog, write_timeout):
    """A streamed request whose client reads nothing fills its buffers; the request decoded
    beside it still streams to its end, while the stalled one holds its place (a long
    --write-timeout: until its client leaves; a short one: until the server drops it)."""
    d, (model, codec) = files
    loaded = [NanoTTS.load(model, codec=codec, threads=1) for _ in range(2)]
    try:
        alone = served(create_app(loaded[0], settings(d / "voices")))
        expected = speak(client_of(alone), BESIDE)
        timeout = CUT_AFTER[write_timeout]
        together = served(create_app(loaded[1], settings(d / "voices", queue_depth=1,
                                     max_streams=2, write_timeout=timeout)),
                          ServerSettings(write_timeout=timeout), sndbuf=4096)
        stalled = raw_post(together.port, STALLED, rcvbuf=4096)
        try:
            assert stalled.recv(64).startswith(b"HTTP/1.1 200")   # it streams; then no reads
            assert speak(client_of(together), BESIDE) == expected
            if write_timeout == "long":
                # 3 places: the one beside it frees its own as its job returns, just after
                # its client has read the end; the stalled one keeps its place
                wait_until(lambda: free_places(together) == 2)
                stalled.close()
            wait_until(lambda: free_places(together) == 3)   # its place came back
            if write_timeout == "short":
                assert "stopped reading" in caplog.text
        finally:
            stalled.close()
    finally:
        served.stop_all()      # before the models close
        for tts in loaded:
            tts.close()




def wait_until(condition, guard: float = 60) -> None:
    """Until `condition()` holds (a state the server reaches); `guard` s is a broken test."""
    deadline = time.monotonic() + guard
    while not condition():
        assert time.monotonic() < deadline, "the server never got there"
        time.sleep(0.01)


def test_a_model_without_a_batched_decoder_refuses_more_streams(tmp_path):
    with pytest.raises(InputError, match="^--max-streams 2: .*--max-streams 1") as e:
        create_app(StubTTS(), settings(tmp_path / "voices", max_streams=2))
    assert "\n" not in str(e.value)


def test_auto_gives_a_batched_family_its_stream_places_and_another_one(files):
    """serve's default (--max-streams auto, None here): MAX_STREAMS places for a family with a
    batched decoder, one for a family without (no error: auto never asks what cannot be)."""
    from moss_tts.models.batching import MAX_STREAMS
    from moss_tts.server.served import ServedModels, streams_of

    d, (model, codec) = files
    with NanoTTS.load(model, codec=codec, threads=1) as nano:
        assert streams_of(nano, None) == MAX_STREAMS > 1
        assert streams_of(nano, 3) == 3
        served = ServedModels({"nano": nano}, settings(d / "voices", queue_depth=2,
                                                       write_timeout=3.0, live_idle=5.0,
                                                       max_streams=None))
        try:
            assert served.default.worker.max_streams == MAX_STREAMS
        finally:
            served.close()
    assert streams_of(StubTTS(), None) == 1 and streams_of(StubTTS(), 1) == 1
