"""The server over several models of different families (`serve --model A --model B`): the
request's `model` picks one (OpenAI's names: the first), each model has its own worker thread,
and sampling defaults come from each family's options dataclass. Tiny Nano and tiny Delay, with
the official `openai` client."""

import base64
import io
import json
from types import SimpleNamespace

import numpy as np
import openai
import pytest
import soundfile as sf

from converters.delay import convert as convert_delay
from fixtures.make_delay import SAMPLE_RATE as DELAY_SR, make_tiny_delay_checkpoint
from moss_tts.cli.serve import load_models
from moss_tts.errors import InputError, MossTTSError
from moss_tts.models.delay_tts import DelayTTS
from moss_tts.sampling import DelaySamplingOptions, SamplingOptions
from moss_tts.server import create_app
from moss_tts.server.served import ServedModel
from moss_tts.server.request import parse_speech
from tests.server.helpers import SR, Served, StubTTS, call, settings, tiny_model_files

ROWS = 24    # the tiny Delay model rarely ends by itself: its rows are capped (ShortDelayTTS)
TEXT = "Hello there."


class ShortDelayTTS(DelayTTS):
    """DelayTTS with a short row cap, so a request takes a second, not the 2000-row default."""

    def stream(self, text, *, reference=None, options=DelaySamplingOptions(), seed=None,
               **fields):
        return super().stream(text, reference=reference, options=options, seed=seed,
                              max_new_rows=ROWS, **fields)


@pytest.fixture(scope="module")
def files(tmp_path_factory, tiny_codec):
    d = tmp_path_factory.mktemp("families")
    nano, nano_codec = tiny_model_files(d)
    delay = convert_delay(str(make_tiny_delay_checkpoint(d / "delay", seed=0, gen_bias=4.0)),
                          d / "delay.gguf", strict=True)
    return SimpleNamespace(dir=d, nano=nano, nano_codec=nano_codec, delay=delay,
                           delay_codec=tiny_codec())


@pytest.fixture(scope="module")
def server(files):
    models = load_models(SimpleNamespace(model=[str(files.nano)], codec=[str(files.nano_codec)],
                                         backend="cpu", threads=1))
    models["moss-tts-delay"] = ShortDelayTTS.load(files.delay, codec=files.delay_codec,
                                                  threads=1)
    s = Served(create_app(models, settings(files.dir / "voices")))
    yield s, openai.OpenAI(base_url=s.url + "/v1", api_key="unused", max_retries=0)
    s.stop()
    for tts in models.values():
        tts.close()


def speech(client, model, **extra):
    r = client.audio.speech.create(model=model, voice="alloy", input=TEXT, response_format="wav",
                                   extra_body={"seed": 7} | extra)
    return sf.read(io.BytesIO(r.content), dtype="float32", always_2d=True)


def test_the_request_model_picks_the_family(server, files):
    _, client = server
    audio, rate = speech(client, "moss-tts-delay")
    with DelayTTS.load(files.delay, codec=files.delay_codec, threads=1) as tts:
        want, _ = tts.synthesize(TEXT, options=DelaySamplingOptions(), seed=7, max_new_rows=ROWS)
    assert rate == DELAY_SR and audio.shape == want.shape
    np.testing.assert_array_equal(audio, want)   # the family's defaults: the API's audio
    for name in ("tts-1", "moss-tts-nano"):       # OpenAI's name means the first model
        audio, rate = speech(client, name, max_new_frames=12)
        assert rate == SR and audio.shape == (12 * 32, 2)


def test_openai_instructions_become_delays_instruction(server, files):
    _, client = server
    r = client.audio.speech.create(model="moss-tts-delay", voice="alloy", input=TEXT,
                                   response_format="wav", instructions="  Speak slowly.  ",
                                   extra_body={"seed": 7})
    audio, _ = sf.read(io.BytesIO(r.content), dtype="float32", always_2d=True)
    with DelayTTS.load(files.delay, codec=files.delay_codec, threads=1) as tts:
        want, _ = tts.synthesize(TEXT, seed=7, max_new_rows=ROWS, instruction="Speak slowly.")
        plain = tts.plan(TEXT)
        assert not np.array_equal(tts.plan(TEXT, instruction="Speak slowly."), plain)
    np.testing.assert_array_equal(audio, want)
    # Nano has no style prompt: OpenAI clients send `instructions` freely, so it is ignored
    nano = client.audio.speech.create(model="tts-1", voice="alloy", input=TEXT,
                                      response_format="wav", instructions="Speak slowly.",
                                      extra_body={"seed": 7, "max_new_frames": 12})
    assert sf.info(io.BytesIO(nano.content)).frames == 12 * 32


def test_a_voice_upload_uses_its_models_codec_and_other_codecs_refuse_it(server, files):
    s, client = server
    t = np.arange(DELAY_SR) / DELAY_SR
    buf = io.BytesIO()
    sf.write(buf, (0.3 * np.sin(2 * np.pi * 180 * t)).astype(np.float32), DELAY_SR,
             format="WAV")
    wav = base64.b64encode(buf.getvalue()).decode()
    status, _, body = call(s.url, "/v1/audio/voices", {"name": "dv", "audio": wav,
                                                       "model": "moss-tts-delay"})
    assert status == 201, body
    audio, _ = speech(client, "moss-tts-delay", voice="dv")
    with DelayTTS.load(files.delay, codec=files.delay_codec, threads=1) as tts:
        ref = tts.encode_reference(*sf.read(io.BytesIO(buf.getvalue()), dtype="float32"))
        assert np.array_equal(tts.voice("dv", root=files.dir / "voices").codes, ref.codes)
        want, _ = tts.synthesize(TEXT, reference=ref, seed=7, max_new_rows=ROWS)
    np.testing.assert_array_equal(audio, want)
    # Nano decodes with another codec: its codes would be noise there, so it is a 400
    status, _, body = call(s.url, "/v1/audio/speech", {"model": "moss-tts-nano", "input": TEXT,
                                                       "voice": "dv"})
    message = json.loads(body)["error"]["message"]
    assert status == 400 and "voice 'dv' does not fit this model" in message
    assert "v1 codec" in message and "--" not in message      # the API's fix, not the CLI's
    assert message.endswith('POST /v1/audio/voices with "model": "moss-tts-nano"')
    status, _, body = call(s.url, "/v1/audio/voices", {"name": "x", "audio": wav,
                                                       "model": "nope"})
    assert status == 400 and b"unknown model 'nope'" in body


def test_models_lists_every_loaded_model(server):
    _, client = server
    assert [m.id for m in client.models.list().data] == ["moss-tts-nano", "moss-tts-delay"]


def test_an_unknown_model_is_400_naming_the_available_ones(server):
    _, client = server
    with pytest.raises(openai.BadRequestError, match="unknown model 'tts-9'; available: "
                                                     "moss-tts-nano, moss-tts-delay"):
        speech(client, "tts-9")


def test_a_field_the_family_does_not_take_is_400(server):
    s, _ = server
    status, _, body = call(s.url, "/v1/audio/speech", {"model": "moss-tts-delay", "input": "hi",
                                                       "max_new_frames": 5})
    assert status == 400 and b"'max_new_frames' is not a MOSS-TTS (Delay) option" in body


def test_each_model_runs_on_its_own_worker_thread():
    a, b = StubTTS(), StubTTS()
    s = Served(create_app({"a": a, "b": b}))
    try:
        for model in ("a", "b", "tts-1"):
            assert call(s.url, "/v1/audio/speech", {"model": model, "input": "hi"})[0] == 200
    finally:
        s.stop()
    assert a.threads == {"moss-tts-model"} and b.threads == {"moss-tts-model-b"}


def test_sampling_defaults_come_from_the_familys_dataclass():
    class DelayStub(StubTTS):
        FAMILY, OPTIONS = "delay", DelaySamplingOptions

    served = ServedModel("d", DelayStub(), 1, "test-worker")
    try:
        words = served.stream_keywords(parse_speech(b'{"input": "hi", "top_k": 3}'))
        assert words["options"] == DelaySamplingOptions(audio_top_k=3)
        nano = ServedModel("n", StubTTS(), 1, "test-worker-2")
        words = nano.stream_keywords(parse_speech(b'{"input": "hi"}'))
        assert words["options"] == SamplingOptions()
        nano.worker.close()
    finally:
        served.worker.close()


def test_serve_loading_pairs_codecs_with_models_in_order(files, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")     # the default codec is a repo id: no network
    args = SimpleNamespace(model=[str(files.nano)], codec=[str(files.nano_codec), "x.gguf"],
                           backend="cpu", threads=1)
    with pytest.raises(InputError, match="2 --codec for 1 --model"):
        load_models(args)
    args.codec = None                        # a Delay model's default codec is the 24 kHz one
    args.model = [str(files.delay)]
    with pytest.raises(MossTTSError, match="--codec OpenMOSS-Team/MOSS-Audio-Tokenizer: not in "
                                           "the local Hugging Face cache"):
        load_models(args)
