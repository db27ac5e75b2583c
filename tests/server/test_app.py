"""The speech server on a real uvicorn bound to loopback, with the tiny Nano model: formats,
streams, voices, and what every field accepts."""

import base64
import http.client
import io
import json
import struct
import threading

import numpy as np
import pytest
import soundfile as sf
from scipy.signal import resample_poly

from moss_tts.models.nano_tts import NanoTTS
from moss_tts.server import create_app
from moss_tts.voices import load_voice
from tests.server.helpers import SR, Served, call, settings, tiny_model_files


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    return tiny_model_files(tmp_path_factory.mktemp("srv"))


@pytest.fixture(scope="module")
def server(files, tmp_path_factory):
    tts = NanoTTS.load(files[0], codec=files[1], threads=1)
    root = tmp_path_factory.mktemp("voices")
    s = Served(create_app(tts, settings(root)))
    s.voices_root = root
    yield s
    s.stop()
    tts.close()


SPEECH = {"model": "tts-1", "input": "Hello there.", "seed": 5, "max_new_frames": 12}
NATIVE_PCM = {"response_format": "pcm", "pcm_layout": "native"}


def wav_b64(seconds=1.0, freq=150):
    t = np.arange(int(SR * seconds)) / SR
    buf = io.BytesIO()
    sf.write(buf, np.stack([0.3 * np.sin(2 * np.pi * freq * t)] * 2, 1).astype(np.float32), SR,
             format="WAV")
    return base64.b64encode(buf.getvalue()).decode()


def s16(raw, channels):
    return np.frombuffer(raw, "<i2").reshape(-1, channels).astype(int)


def test_speech_wav_flac_and_native_pcm_agree(server):
    st, h, wav = call(server.url, "/v1/audio/speech", SPEECH | {"response_format": "wav"})
    assert st == 200 and h["content-type"] == "audio/wav", wav[:200]
    audio, sr = sf.read(io.BytesIO(wav), dtype="float32")
    assert sr == SR and audio.shape == (12 * 32, 2)
    st, h, flac = call(server.url, "/v1/audio/speech", SPEECH | {"response_format": "flac"})
    assert st == 200 and h["content-type"] == "audio/flac"
    # FLAC is 24-bit integer PCM: full scale clips (the tiny random model exceeds it)
    flac_audio = sf.read(io.BytesIO(flac), dtype="float32")[0]
    assert np.abs(flac_audio - np.clip(audio, -1, 1)).max() < 2**-22
    st, h, pcm = call(server.url, "/v1/audio/speech", SPEECH | NATIVE_PCM)
    assert st == 200 and h["content-type"] == "audio/pcm"
    assert h["x-audio-sample-rate"] == str(SR) and h["x-audio-channels"] == "2"
    assert np.abs(s16(pcm, 2) - np.round(np.clip(audio, -1, 1) * 32767)).max() <= 1


def test_pcm_defaults_to_openai_24k_mono_s16le(server):
    audio, _ = sf.read(io.BytesIO(call(server.url, "/v1/audio/speech",
                                       SPEECH | {"response_format": "wav"})[2]), dtype="float32")
    st, h, pcm = call(server.url, "/v1/audio/speech", SPEECH | {"response_format": "pcm"})
    assert st == 200 and h["x-audio-sample-rate"] == "24000" and h["x-audio-channels"] == "1"
    # independent reference: channel mean, scipy's polyphase resampler, s16 rounding
    want = np.round(np.clip(resample_poly(audio.mean(axis=1), 15, 1), -1, 1) * 32767)
    got = s16(pcm, 1)[:, 0]
    assert got.shape == want.shape and np.abs(got - want).max() <= 1
    assert np.abs(got).max() > 100   # not silence


def test_default_format_is_mp3_as_openai_documents(server):
    st, h, body = call(server.url, "/v1/audio/speech", SPEECH)
    assert st == 200 and h["content-type"] == "audio/mpeg"
    info = sf.info(io.BytesIO(body))
    assert info.format == "MP3" and info.samplerate == 8000  # 1.6 kHz is below MPEG's rates


@pytest.mark.parametrize("fmt,container", [("opus", "OGG"), ("mp3", "MP3")])
def test_opus_and_mp3_decode_to_the_speech(server, fmt, container):
    st, h, body = call(server.url, "/v1/audio/speech", SPEECH | {"response_format": fmt})
    assert st == 200 and h["content-type"] == {"opus": "audio/ogg", "mp3": "audio/mpeg"}[fmt]
    audio, rate = sf.read(io.BytesIO(body), dtype="float32")
    assert sf.info(io.BytesIO(body)).format == container
    assert abs(len(audio) / rate - 12 * 32 / SR) < 0.1 and np.abs(audio).max() > 0.01


def test_sse_stream_has_ordered_deltas_then_done_and_equals_offline(server):
    st, h, body = call(server.url, "/v1/audio/speech", SPEECH | {"stream_format": "sse"})
    assert st == 200 and h["content-type"].startswith("text/event-stream")
    events = [json.loads(block[len("data: "):]) for block in body.decode().split("\n\n") if block]
    kinds = [e["type"] for e in events]
    assert kinds == ["speech.audio.delta"] * (len(events) - 1) + ["speech.audio.done"]
    assert h["x-audio-sample-rate"] == "24000" and h["x-audio-channels"] == "1"
    streamed = b"".join(base64.b64decode(e["audio"]) for e in events[:-1])
    # the streaming resampler equals the whole-signal one exactly
    assert streamed == call(server.url, "/v1/audio/speech", SPEECH | {"response_format": "pcm"})[2]


@pytest.mark.parametrize("layout", ["openai", "native"])
def test_streamed_pcm_equals_whole_pcm(server, layout):
    body = SPEECH | {"response_format": "pcm", "pcm_layout": layout}
    st, h, streamed = call(server.url, "/v1/audio/speech", body | {"stream_format": "audio"})
    assert st == 200 and h["content-type"] == "audio/pcm"
    assert streamed == call(server.url, "/v1/audio/speech", body)[2]


def test_streamed_wav_is_a_streamable_wav_header_then_native_pcm(server):
    st, h, body = call(server.url, "/v1/audio/speech",
                       SPEECH | {"response_format": "wav", "stream_format": "audio"})
    assert st == 200 and h["content-type"] == "audio/wav"
    riff, size, wave, fmt_id, fmt_size, tag, channels, rate, byte_rate, block, bits, data_id, \
        data_size = struct.unpack("<4sI4s4sIHHIIHH4sI", body[:44])
    assert (riff, wave, fmt_id, data_id) == (b"RIFF", b"WAVE", b"fmt ", b"data")
    assert size == 0xFFFFFFFF and data_size == 0xFFFFFFFF   # length unknown while streaming
    assert (tag, channels, rate, bits, block, byte_rate) == (1, 2, SR, 16, 4, SR * 4)
    assert body[44:] == call(server.url, "/v1/audio/speech", SPEECH | NATIVE_PCM)[2]


def test_models_health_and_voices_round_trip(server):
    assert json.loads(call(server.url, "/v1/models")[2])["data"][0]["id"]
    assert json.loads(call(server.url, "/health")[2])["sample_rate"] == SR
    st, _, body = call(server.url, "/v1/audio/voices", {"name": "bob", "audio": wav_b64()})
    assert st == 201, body
    listed = json.loads(call(server.url, "/v1/audio/voices")[2])["voices"]
    assert "bob" in [v["name"] for v in listed]
    with_voice = call(server.url, "/v1/audio/speech", SPEECH | {"voice": "bob"})[2]
    without = call(server.url, "/v1/audio/speech", SPEECH)[2]
    assert with_voice != without  # the stored reference changes the prompt
    assert call(server.url, "/v1/audio/speech", SPEECH | {"voice": "alloy"})[2] == without
    assert call(server.url, "/v1/audio/voices/bob", method="DELETE")[0] == 200
    assert call(server.url, "/v1/audio/voices/bob", method="DELETE")[0] == 404


@pytest.mark.parametrize("name", ["../evil", "evil\n", None, 5, "a/b", "", ".hidden"])
def test_voice_names_cannot_escape_the_voices_directory(files, tmp_path, name):
    tts = NanoTTS.load(files[0], codec=files[1], threads=1)
    voices = tmp_path / "store" / "voices"
    s = Served(create_app(tts, settings(voices)))
    try:
        st, _, raw = call(s.url, "/v1/audio/voices", {"name": name, "audio": wav_b64()})
        assert st == 400 and "name" in json.loads(raw)["error"]["message"]
        # real audio was sent, so only the name check can have refused it: nothing anywhere
        assert [p for p in tmp_path.rglob("*") if p.is_file()] == []
    finally:
        s.stop()
        tts.close()


BAD_FIELDS = [
    ({"input": ""}, 400, "input"), ({"input": None}, 400, "input"), ({"input": 5}, 400, "input"),
    ({"input": "x" * 5000}, 413, "input"),
    ({"response_format": "wma"}, 400, "response_format"),
    ({"response_format": 1}, 400, "response_format"),
    ({"seed": "5"}, 400, "seed"), ({"seed": 1.5}, 400, "seed"), ({"seed": -1}, 400, "seed"),
    ({"seed": [1]}, 400, "seed"), ({"seed": True}, 400, "seed"), ({"seed": 2**32}, 400, "seed"),
    ({"top_k": 2.5}, 400, "top_k"), ({"top_k": -1}, 400, "top_k"), ({"top_k": "3"}, 400, "top_k"),
    ({"top_p": 0}, 400, "top_p"), ({"top_p": 1.5}, 400, "top_p"), ({"top_p": "a"}, 400, "top_p"),
    ({"temperature": 0}, 400, "temperature"), ({"temperature": False}, 400, "temperature"),
    ({"repetition_penalty": -1}, 400, "repetition_penalty"),
    ({"max_new_frames": 0}, 400, "max_new_frames"),
    ({"max_new_frames": 1e9}, 400, "max_new_frames"),
    ({"speed": 9}, 400, "speed"), ({"speed": "fast"}, 400, "speed"),
    ({"speed": 2, "stream_format": "sse"}, 400, "speed"),
    ({"stream_format": "chunks"}, 400, "stream_format"),
    ({"stream_format": "audio", "response_format": "mp3"}, 400, "stream_format"),
    ({"stream_format": "sse", "response_format": "wav"}, 400, "sse"),
    ({"pcm_layout": "planar"}, 400, "pcm_layout"), ({"voice": 3}, 400, "voice"),
    ({"model": ["tts-1"]}, 400, "model"), ({"instructions": {}}, 400, "instructions"),
    ({"reference_audio": "!!"}, 400, "reference_audio"),
    ({"reference_audio": base64.b64encode(b"not audio").decode()}, 400, "reference_audio"),
    ({"colour": "blue"}, 400, "colour"),
]


@pytest.mark.parametrize("fields,status,named", BAD_FIELDS)
def test_bad_fields_are_4xx_naming_the_field(server, fields, status, named):
    st, h, raw = call(server.url, "/v1/audio/speech", SPEECH | fields)
    assert st == status and h["content-type"] == "application/json"
    assert named in json.loads(raw)["error"]["message"]


@pytest.mark.parametrize("raw,named", [
    (b"[" * 100_000 + b"]" * 100_000, "nested"), (b'{"input": NaN}', "JSON"),
    (b"[1, 2]", "object"), (b"{", "JSON"), (b'{"input": "\xff"}', "JSON")])
def test_pathological_json_is_400(server, raw, named):
    st, _, body = call(server.url, "/v1/audio/speech", data=raw)
    assert st == 400 and named in json.loads(body)["error"]["message"]


@pytest.mark.parametrize("body", [[{"name": "x"}], {"name": "x", "audio": 5}, {"name": "x"},
                                  {"name": "x", "audio": "AAAA", "extra": 1}])
def test_malformed_voice_posts_are_400(server, body):
    st, _, raw = call(server.url, "/v1/audio/voices", body)
    assert st == 400 and json.loads(raw)["error"]["message"]


def test_a_refused_request_keeps_the_connection_alive(server):
    conn = http.client.HTTPConnection("127.0.0.1", int(server.url.rsplit(":", 1)[1]), timeout=60)
    try:
        for fields, status in (({"seed": "x"}, 400), ({}, 200), ({"seed": -3}, 400), ({}, 200)):
            conn.request("POST", "/v1/audio/speech", json.dumps(SPEECH | fields),
                         {"Content-Type": "application/json"})
            r = conn.getresponse()
            r.read()
            assert r.status == status
    finally:
        conn.close()


def test_openai_and_ignored_fields_are_accepted(server):
    body = SPEECH | {"instructions": "cheerful", "model": "gpt-4o-mini-tts", "voice": "nova"}
    assert call(server.url, "/v1/audio/speech", body)[0] == 200


def test_speed_changes_duration(server):
    n = sf.info(io.BytesIO(call(server.url, "/v1/audio/speech",
                                SPEECH | {"response_format": "wav"})[2])).frames
    st, _, fast = call(server.url, "/v1/audio/speech",
                       SPEECH | {"speed": 2.0, "response_format": "wav"})
    assert st == 200 and abs(sf.info(io.BytesIO(fast)).frames - n / 2) <= 64


def test_concurrent_clients_each_get_their_own_audio(server):
    results = {}

    def ask(key, seed):
        results[key] = call(server.url, "/v1/audio/speech", SPEECH | {"seed": seed} | NATIVE_PCM)
    threads = [threading.Thread(target=ask, args=(i, seed)) for i, seed in enumerate((1, 2, 3, 1))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert all(st == 200 for st, _, _ in results.values())
    alone = {seed: call(server.url, "/v1/audio/speech", SPEECH | {"seed": seed} | NATIVE_PCM)[2]
             for seed in (1, 2, 3)}
    # serialized synthesis leaks no state between requests: each equals its solo run
    assert [results[i][2] for i in range(4)] == [alone[1], alone[2], alone[3], alone[1]]
    assert alone[1] != alone[2]


def test_concurrent_uploads_and_reference_speech_give_single_threaded_codes(server, files):
    """Voice uploads and speech-with-reference all encode on the codec's one encoder runner."""
    # two voices: 4 requests, all fit the server's line (1 running + 4 waiting)
    refs = {f"v{i}": wav_b64(0.5 + 0.25 * i, 120 + 40 * i) for i in range(2)}
    solo = NanoTTS.load(files[0], codec=files[1], threads=1)   # single-threaded expectation
    try:
        want_codes = {n: solo.encode_reference(*sf.read(io.BytesIO(base64.b64decode(b)),
                                                        dtype="float32", always_2d=True)).codes
                      for n, b in refs.items()}
    finally:
        solo.close()
    alone = {n: call(server.url, "/v1/audio/speech",
                     SPEECH | NATIVE_PCM | {"reference_audio": b})[2] for n, b in refs.items()}
    results = {}

    def upload(n):
        results[("up", n)] = call(server.url, "/v1/audio/voices", {"name": n, "audio": refs[n]})

    def speak(n):
        results[("speak", n)] = call(server.url, "/v1/audio/speech",
                                     SPEECH | NATIVE_PCM | {"reference_audio": refs[n]})
    threads = [threading.Thread(target=f, args=(n,)) for n in refs for f in (upload, speak)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    try:
        for n in refs:
            assert results[("up", n)][0] == 201 and results[("speak", n)][2] == alone[n]
            assert np.array_equal(load_voice(n, root=server.voices_root)[0].codes, want_codes[n])
            with_voice = call(server.url, "/v1/audio/speech", SPEECH | NATIVE_PCM | {"voice": n})[2]
            assert with_voice == alone[n]   # stored codes == the single-threaded encode
    finally:
        for n in refs:
            call(server.url, f"/v1/audio/voices/{n}", method="DELETE")
