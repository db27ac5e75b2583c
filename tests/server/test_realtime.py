"""The speech server with a MOSS-TTS-Realtime model (`serve --model realtime.gguf`): the family
comes from the GGUF, the offline route speaks with the family's sampling defaults and its frame
cap, the same audio as the Python API (the live WebSocket route is tested with its endpoint)."""

import io
from types import SimpleNamespace

import numpy as np
import openai
import pytest
import soundfile as sf

from converters.realtime import convert as convert_realtime
from fixtures.make_realtime import SAMPLE_RATE, make_tiny_realtime_checkpoint
from moss_tts.cli.serve import load_models
from moss_tts.models.realtime_tts import RealtimeTTS
from moss_tts.sampling import RealtimeSamplingOptions
from moss_tts.server import create_app
from tests.server.helpers import Served, settings

TEXT = "Hello there, quick brown foxes jump."


@pytest.fixture(scope="module")
def served(tmp_path_factory, tiny_codec):
    d = tmp_path_factory.mktemp("server_realtime")
    model = convert_realtime(str(make_tiny_realtime_checkpoint(d / "rt", seed=0, steer=True)),
                             d / "rt.gguf", strict=True)
    codec = tiny_codec()
    models = load_models(SimpleNamespace(model=[str(model)], codec=[str(codec)], backend="cpu",
                                         threads=1))
    s = Served(create_app(models, settings(d / "voices")))
    yield s, openai.OpenAI(base_url=s.url + "/v1", api_key="unused", max_retries=0), model, codec
    s.stop()
    for tts in models.values():
        tts.close()


def test_the_offline_route_speaks_as_the_api(served):
    _, client, model, codec = served
    assert [m.id for m in client.models.list().data] == ["moss-tts-realtime"]
    r = client.audio.speech.create(model="moss-tts-realtime", voice="alloy", input=TEXT,
                                   response_format="wav",
                                   extra_body={"seed": 7, "max_new_frames": 8})
    audio, rate = sf.read(io.BytesIO(r.content), dtype="float32", always_2d=True)
    with RealtimeTTS.load(model, codec=codec, threads=1) as tts:
        want, _ = tts.synthesize(TEXT, options=RealtimeSamplingOptions(), seed=7, max_frames=8)
    assert rate == SAMPLE_RATE and audio.shape == want.shape == (8 * 64, 1)
    np.testing.assert_array_equal(audio, want)
