"""`serve --model local-v15.gguf`: the family read from the GGUF, named moss-tts-local-v15,
its sampling defaults from LocalV15SamplingOptions, `max_new_frames` reaching its frame cap;
the audio equals the Python API's for the same seed (tiny model, tiny v2 codec)."""

import io
from types import SimpleNamespace

import numpy as np
import openai
import pytest
import soundfile as sf

from converters.local_v15 import convert
from fixtures.make_local_v15 import SAMPLE_RATE, make_tiny_local_v15_checkpoint
from moss_tts.cli.serve import load_models
from moss_tts.models.local_v15_tts import LocalV15TTS
from moss_tts.server import create_app
from tests.server.helpers import Served, settings


@pytest.fixture(scope="module")
def served(tmp_path_factory, tiny_codec):
    d = tmp_path_factory.mktemp("server_local_v15")
    model = convert(str(make_tiny_local_v15_checkpoint(d / "hf", continue_bias=6.0)),
                    d / "local-v15.gguf", strict=True)
    codec = tiny_codec("v2")
    models = load_models(SimpleNamespace(model=[str(model)], codec=[str(codec)], backend="cpu",
                                         threads=1))
    s = Served(create_app(models, settings(d / "voices")))
    yield s, model, codec, list(models)
    s.stop()
    for tts in models.values():
        tts.close()


def test_serve_speaks_local_v15_as_the_api_does(served):
    s, model, codec, names = served
    assert names == ["moss-tts-local-v15"]
    client = openai.OpenAI(base_url=s.url + "/v1", api_key="unused", max_retries=0)
    r = client.audio.speech.create(model="moss-tts-local-v15", voice="alloy", input="Hello.",
                                   response_format="wav",
                                   extra_body={"seed": 7, "max_new_frames": 6})
    audio, rate = sf.read(io.BytesIO(r.content), dtype="float32", always_2d=True)
    with LocalV15TTS.load(model, codec=codec, threads=1) as tts:
        want, _ = tts.synthesize("Hello.", seed=7, max_frames=6)
    assert rate == SAMPLE_RATE and audio.shape == want.shape == (6 * 32, 2)
    # the family's defaults: the API's audio (streamed in adaptive chunks, so up to the
    # codec's f32 order)
    np.testing.assert_allclose(audio, want, atol=1e-5, rtol=0)
    assert not np.allclose(audio, tts_other_seed(model, codec), atol=1e-3)


def tts_other_seed(model, codec):
    with LocalV15TTS.load(model, codec=codec, threads=1) as tts:
        return tts.synthesize("Hello.", seed=8, max_frames=6)[0]
