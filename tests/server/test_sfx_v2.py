"""The server with MOSS-SoundEffect v2.0 (the tiny pipeline through the real converter), with the
stock `openai` client: `input` is the description, the diffusion knobs are request fields, the
answer equals the API's audio; a streamed SSE request gets `speech.progress` events for the
steps before its audio; a bad field is a 400 naming it."""

import base64
import io
import json

import numpy as np
import openai
import pytest
import soundfile as sf

from fixtures.make_soundeffect_v2 import make_tiny_sfx_v2
from moss_tts import load_tts
from moss_tts.server import create_app
from tests.server.helpers import call, settings

FIELDS = {"seed": 2, "steps": 3, "seconds": 0.7, "cfg_scale": 3.0, "negative": "speech"}


@pytest.fixture(scope="module")
def tts(tmp_path_factory):
    made = make_tiny_sfx_v2(tmp_path_factory.mktemp("server_sfx_v2"))
    with load_tts(str(made["gguf"]), threads=1) as t:
        yield t


@pytest.fixture
def server(tts, served, tmp_path):
    s = served(create_app({"sfx-v2": tts}, settings(tmp_path / "voices")))
    return s, openai.OpenAI(base_url=s.url + "/v1", api_key="unused", max_retries=0)


def api(tts):
    from moss_tts.sampling import DiffusionOptions

    return tts.synthesize(sound="rain on a tin roof", seconds=0.7, steps=3, seed=2,
                          negative="speech", options=DiffusionOptions(cfg_scale=3.0))[0]


def test_the_openai_client_gets_the_apis_sound(server, tts):
    _, client = server
    r = client.audio.speech.create(model="sfx-v2", voice="alloy", input="rain on a tin roof",
                                   response_format="wav", extra_body=FIELDS)
    audio, sr = sf.read(io.BytesIO(r.content), dtype="float32", always_2d=True)
    want = api(tts)
    assert sr == 60 and audio.shape == want.shape
    assert np.abs(audio - np.round(np.clip(want, -1, 1) * 32767) / 32767).max() <= 1 / 32767


def test_an_sse_stream_reports_the_steps_before_its_audio(server, tts):
    s, _ = server
    body = {"model": "sfx-v2", "input": "rain on a tin roof", "stream_format": "sse",
            "response_format": "pcm", "pcm_layout": "native"} | FIELDS
    st, h, raw = call(s.url, "/v1/audio/speech", body)
    assert st == 200 and h["content-type"].startswith("text/event-stream"), raw[:300]
    events = [json.loads(b[len("data: "):]) for b in raw.decode().split("\n\n") if b]
    kinds = [e["type"] for e in events]
    assert kinds[:3] == ["speech.progress"] * 3 and kinds[-1] == "speech.audio.done"
    assert [(e["done"], e["total"]) for e in events[:3]] == [(1, 3), (2, 3), (3, 3)]
    assert set(kinds[3:-1]) == {"speech.audio.delta"}
    pcm = b"".join(base64.b64decode(e["audio"]) for e in events[3:-1])
    got = np.frombuffer(pcm, "<i2").astype(np.float32)
    assert np.abs(got - np.round(np.clip(api(tts)[:, 0], -1, 1) * 32767)).max() <= 1


@pytest.mark.parametrize("field, match", [
    ({"cfg_scale": -1}, "'cfg_scale' must lie in [0, 100]"),
    ({"seconds": 31}, "'seconds' must be at most 30"),
    ({"steps": 0}, "'steps' must be"),
    ({"temperature": 0.5}, "'temperature' is not a MOSS-SoundEffect-v2.0 option"),
    ({"short_latent": "yes"}, "'short_latent' must be true or false"),
])
def test_a_bad_field_is_a_400_naming_it(server, field, match):
    s, _ = server
    st, _, raw = call(s.url, "/v1/audio/speech", {"model": "sfx-v2", "input": "rain",
                                                   "response_format": "wav"} | field)
    assert st == 400 and match in json.loads(raw)["error"]["message"], raw
