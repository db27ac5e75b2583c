"""The speech server on a real uvicorn bound to loopback, with the tiny Nano model."""

import base64
import io
import json
import socket
import threading
import time
import urllib.error
import urllib.request

import numpy as np
import pytest
import soundfile as sf

from converters.codec import convert as convert_codec
from converters.nano import convert as convert_nano
from fixtures.make_codec import make_tiny_nano_checkpoint
from fixtures.make_nano import make_tiny_nano_tts_checkpoint
from fixtures.make_spm import make_tiny_spm
from moss_tts.models.nano_tts import NanoTTS
from moss_tts.server import SynthesisQueue, create_app

SR = 1600


class Served:
    """uvicorn in a thread on an ephemeral loopback port; stopped at teardown."""

    def __init__(self, app):
        import uvicorn
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self.server = uvicorn.Server(uvicorn.Config(app, log_level="warning"))
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.sock]},
                                       daemon=True)
        self.thread.start()
        deadline = time.time() + 10
        while not self.server.started:
            assert time.time() < deadline, "server did not start"
            time.sleep(0.02)

    def stop(self):
        self.server.should_exit = True
        self.thread.join(10)


def call(url, path, body=None, method=None):
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url + path, data=data, method=method,
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status, dict(r.headers), r.read()
    except urllib.error.HTTPError as e:
        return e.code, dict(e.headers), e.read()


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    d = tmp_path_factory.mktemp("srv")
    tts_dir = make_tiny_nano_tts_checkpoint(d / "tts", seed=0, tokenizer_model_bytes=make_tiny_spm(),
                                            audio_tokenizer_sample_rate=SR, stop_bias=-50)
    tts = NanoTTS.load(convert_nano(tts_dir, d / "nano.gguf"),
                       codec=convert_codec(make_tiny_nano_checkpoint(d / "codec", seed=1),
                                           d / "codec.gguf"), threads=1)
    s = Served(create_app(tts, voices_root=d / "voices"))
    yield s
    s.stop()
    tts.close()


SPEECH = {"model": "tts-1", "input": "Hello there.", "seed": 5, "max_new_frames": 12}


def test_speech_wav_flac_and_pcm_agree(server):
    st, h, wav = call(server.url, "/v1/audio/speech", SPEECH)
    assert st == 200 and h["content-type"] == "audio/wav", wav[:200]
    audio, sr = sf.read(io.BytesIO(wav), dtype="float32")
    assert sr == SR and audio.shape == (12 * 32, 2)
    st, h, pcm = call(server.url, "/v1/audio/speech", SPEECH | {"response_format": "pcm"})
    assert st == 200 and h["x-audio-sample-rate"] == str(SR) and h["x-audio-channels"] == "2"
    got = np.frombuffer(pcm, "<i2").reshape(-1, 2).astype(int)
    assert np.abs(got - np.round(np.clip(audio, -1, 1) * 32767)).max() <= 1


def test_sse_stream_has_ordered_deltas_then_done_and_equals_offline(server):
    st, h, body = call(server.url, "/v1/audio/speech", SPEECH | {"stream_format": "sse"})
    assert st == 200 and h["content-type"].startswith("text/event-stream")
    events = [json.loads(block[len("data: "):]) for block in body.decode().split("\n\n") if block]
    assert [e["type"] for e in events] == ["speech.audio.delta"] * (len(events) - 1) + ["speech.audio.done"]
    streamed = np.concatenate([np.frombuffer(base64.b64decode(e["audio"]), "<i2")
                               for e in events[:-1]]).reshape(-1, 2)
    pcm = call(server.url, "/v1/audio/speech", SPEECH | {"response_format": "pcm"})[2]
    assert np.array_equal(streamed, np.frombuffer(pcm, "<i2").reshape(-1, 2))


def test_models_health_and_voices_round_trip(server):
    assert json.loads(call(server.url, "/v1/models")[2])["data"][0]["id"]
    assert json.loads(call(server.url, "/health")[2])["sample_rate"] == SR
    t = np.arange(SR) / SR
    buf = io.BytesIO()
    sf.write(buf, np.stack([0.3 * np.sin(2 * np.pi * 150 * t)] * 2, 1).astype(np.float32), SR,
             format="WAV")
    st, _, body = call(server.url, "/v1/audio/voices",
                       {"name": "bob", "audio": base64.b64encode(buf.getvalue()).decode()})
    assert st == 201, body
    assert "bob" in [v["name"] for v in json.loads(call(server.url, "/v1/audio/voices")[2])["voices"]]
    with_voice = call(server.url, "/v1/audio/speech", SPEECH | {"voice": "bob"})[2]
    without = call(server.url, "/v1/audio/speech", SPEECH)[2]
    assert with_voice != without  # the stored reference changes the prompt
    assert call(server.url, "/v1/audio/voices/bob", method="DELETE")[0] == 200
    assert call(server.url, "/v1/audio/voices/bob", method="DELETE")[0] == 404


@pytest.mark.parametrize("body,status", [
    ({"input": ""}, 400), ({"input": "x" * 5000}, 413), ({"input": "hi", "response_format": "mp3"}, 400),
    ({"input": "hi", "top_k": 2.5}, 400), ({"input": "hi", "reference_audio": "!!"}, 400),
    ({"input": "hi", "stream_format": "chunks"}, 400)])
def test_bad_requests_are_4xx_with_a_message(server, body, status):
    st, _, raw = call(server.url, "/v1/audio/speech", body)
    assert st == status and json.loads(raw)["error"]["message"]


def test_voice_names_cannot_escape_the_voices_directory(server):
    st, _, raw = call(server.url, "/v1/audio/voices", {"name": "../evil", "audio": ""})
    assert st == 400


def test_queue_admits_one_running_and_depth_waiting():
    q = SynthesisQueue(depth=1)
    assert q.try_enter() and q.try_enter()
    assert not q.try_enter()  # full: the server answers 503 with Retry-After
    q.leave()
    assert q.try_enter()


def test_overload_answers_503_with_retry_after(tmp_path):
    class SlowTTS:  # stands in for synthesis time only; the queue and HTTP path are real
        sample_rate = SR

        def synthesize(self, text, **kwargs):
            time.sleep(1.0)
            return np.zeros((32, 2), np.float32), SR

    s = Served(create_app(SlowTTS(), queue_depth=0, voices_root=tmp_path))
    try:
        first = threading.Thread(target=call, args=(s.url, "/v1/audio/speech", {"input": "a"}))
        first.start()
        time.sleep(0.3)
        st, h, _ = call(s.url, "/v1/audio/speech", {"input": "b"})
        first.join()
        assert st == 503 and h["retry-after"] == "2"
        assert call(s.url, "/v1/audio/speech", {"input": "c"})[0] == 200  # free again
    finally:
        s.stop()


def test_concurrent_clients_each_get_their_own_audio(server):
    results = {}

    def ask(seed):
        results[seed] = call(server.url, "/v1/audio/speech", SPEECH | {"seed": seed,
                                                                       "response_format": "pcm"})
    threads = [threading.Thread(target=ask, args=(seed,)) for seed in (1, 2, 3, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert all(st == 200 for st, _, _ in results.values())
    alone = {seed: call(server.url, "/v1/audio/speech", SPEECH | {"seed": seed,
                                                                 "response_format": "pcm"})[2]
             for seed in (1, 2, 3)}
    # serialized synthesis leaks no state between requests: each equals its solo run
    assert all(results[seed][2] == alone[seed] for seed in (1, 2, 3))
    assert alone[1] != alone[2]


def test_client_disconnect_stops_its_generation(tmp_path):
    produced, stopped = [], threading.Event()

    class EndlessTTS:  # stands in for generation speed only; streaming and cancel are real
        sample_rate = SR

        def stream(self, text, **kwargs):
            try:
                for i in range(10_000):
                    produced.append(i)
                    time.sleep(0.01)
                    yield np.zeros((32, 2), np.float32)
            finally:
                stopped.set()

    s = Served(create_app(EndlessTTS(), voices_root=tmp_path))
    try:
        req = urllib.request.Request(s.url + "/v1/audio/speech", method="POST",
                                     data=json.dumps({"input": "x", "stream_format": "audio"}).encode(),
                                     headers={"Content-Type": "application/json"})
        r = urllib.request.urlopen(req, timeout=30)
        r.read(512)
        r.close()  # the client goes away mid-stream
        assert stopped.wait(10), "generation kept running after the client left"
        assert len(produced) < 10_000
    finally:
        s.stop()


def test_speed_changes_duration_and_openai_pcm_is_24k_mono(server):
    base = call(server.url, "/v1/audio/speech", SPEECH)[2]
    n = sf.info(io.BytesIO(base)).frames
    fast = call(server.url, "/v1/audio/speech", SPEECH | {"speed": 2.0})
    assert fast[0] == 200
    assert abs(sf.info(io.BytesIO(fast[2])).frames - n / 2) <= 64
    st, h, pcm = call(server.url, "/v1/audio/speech",
                      SPEECH | {"response_format": "pcm", "pcm_layout": "openai"})
    assert st == 200 and h["x-audio-sample-rate"] == "24000" and h["x-audio-channels"] == "1"
    assert abs(len(pcm) // 2 - n * 24000 // SR) <= 2
    assert call(server.url, "/v1/audio/speech", SPEECH | {"speed": 9})[0] == 400
    assert call(server.url, "/v1/audio/speech", SPEECH | {"speed": 2, "stream_format": "sse"})[0] == 400
