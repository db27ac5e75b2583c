"""The official `openai` client against the live server (tiny model on loopback): every
response_format, whole and streamed, decodes to the same speech."""

import io

import av
import numpy as np
import openai
import pytest
import soundfile as sf

from moss_tts.models.nano_tts import NanoTTS
from moss_tts.server import create_app
from tests.server.helpers import SR, Served, settings, tiny_model_files

EXTRA = {"seed": 5, "max_new_frames": 12}
SECONDS = 12 * 32 / SR


@pytest.fixture(scope="module")
def client(tmp_path_factory):
    d = tmp_path_factory.mktemp("openai")
    model, codec = tiny_model_files(d)
    tts = NanoTTS.load(model, codec=codec, threads=1)
    s = Served(create_app(tts, settings(d / "voices")))
    yield openai.OpenAI(base_url=s.url + "/v1", api_key="unused", max_retries=0)
    s.stop()
    tts.close()


def create(client, fmt, **extra):
    return client.audio.speech.create(model="tts-1", voice="alloy", input="Hello there.",
                                      response_format=fmt, extra_body=EXTRA | extra)


def decode(fmt: str, data: bytes) -> tuple[np.ndarray, int]:
    if fmt == "pcm":
        return np.frombuffer(data, "<i2").astype(np.float32)[:, None] / 32768, 24000
    if fmt == "aac":
        with av.open(io.BytesIO(data)) as f:
            frames = [frame.to_ndarray() for frame in f.decode(audio=0)]
            rate = f.streams.audio[0].rate
        return np.concatenate(frames, axis=1).T, rate
    return sf.read(io.BytesIO(data), dtype="float32", always_2d=True)


@pytest.mark.parametrize("fmt", ["mp3", "opus", "aac", "flac", "wav", "pcm"])
def test_every_format_whole_and_streamed(client, fmt):
    whole = create(client, fmt)
    assert whole.response.headers["content-type"] == {
        "mp3": "audio/mpeg", "opus": "audio/ogg", "aac": "audio/aac", "flac": "audio/flac",
        "wav": "audio/wav", "pcm": "audio/pcm"}[fmt]
    with client.audio.speech.with_streaming_response.create(
            model="tts-1", voice="alloy", input="Hello there.", response_format=fmt,
            extra_body=EXTRA) as r:
        streamed = b"".join(r.iter_bytes(chunk_size=100))
    audio, rate = decode(fmt, whole.content)
    if fmt == "opus":   # each Ogg stream gets a random serial number: compare the audio
        assert np.array_equal(decode(fmt, streamed)[0], audio)
    else:
        assert streamed == whole.content
    # encoders pad (AAC priming, Opus pre-skip, MP3 frames): the length is close, not exact
    assert abs(len(audio) / rate - SECONDS) < 0.15 and np.abs(audio).max() > 0.01


def test_pcm_is_24k_mono_s16le_as_openai_clients_read_it(client):
    r = create(client, "pcm")
    assert r.response.headers["x-audio-sample-rate"] == "24000"
    assert r.response.headers["x-audio-channels"] == "1"
    assert len(r.content) == 2 * round(SECONDS * 24000)


@pytest.mark.parametrize("fmt", ["wav", "pcm"])
def test_stream_format_audio_streams_what_the_whole_response_holds(client, fmt):
    with client.audio.speech.with_streaming_response.create(
            model="tts-1", voice="alloy", input="Hello there.", response_format=fmt,
            extra_body=EXTRA | {"stream_format": "audio"}) as r:
        streamed = b"".join(r.iter_bytes())
    whole = create(client, fmt, pcm_layout="native") if fmt == "wav" else create(client, fmt)
    if fmt == "wav":   # a streamable header (sizes unknown), then the same speech in s16
        audio, rate = sf.read(io.BytesIO(whole.content), dtype="float32")
        samples = np.frombuffer(streamed[44:], "<i2").reshape(-1, 2)
        assert rate == SR and np.abs(samples - np.round(np.clip(audio, -1, 1) * 32767)).max() <= 1
    else:
        assert streamed == whole.content


def test_refusals_reach_the_client_as_openai_errors(client):
    with pytest.raises(openai.BadRequestError, match="seed"):
        create(client, "wav", seed=-1)
    with pytest.raises(openai.BadRequestError, match="response_format"):
        create(client, "wma")
