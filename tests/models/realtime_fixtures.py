"""Fixtures of the MossTTSRealtime tests (imported by name into each test module): the tiny
upstream-named checkpoints (fixtures.make_realtime) through the real converter with --strict,
their float state for fixtures/reference/realtime.py, the loaded model, and RealtimeTTS with the
tiny 24 kHz-style (v1) codec."""

import pytest

from converters.codec import convert as convert_codec
from converters.realtime import convert as convert_realtime
from fixtures.make_codec import make_tiny_v1_checkpoint
from fixtures.make_realtime import make_state, make_tiny_realtime_checkpoint, tiny_config
from moss_tts.ggml import F32, Weights, get_backend
from moss_tts.models.realtime import RealtimeModel
from moss_tts.models.realtime_tts import RealtimeTTS
from moss_tts.sampling import RealtimeSamplingOptions

from .conftest import THREADS

GREEDY = RealtimeSamplingOptions(do_sample=False)


@pytest.fixture(scope="session")
def realtime_files(tmp_path_factory):
    """steer → (float state, config.json dict, GGUF path); the steered model speaks until the
    text is spent, then stops (fixtures.make_realtime.make_state)."""
    made = {}

    def get(steer=False):
        if steer not in made:
            root = tmp_path_factory.mktemp(f"realtime_steer{int(steer)}")
            ckpt = make_tiny_realtime_checkpoint(root / "hf", seed=0, steer=steer)
            gguf = convert_realtime(str(ckpt), root / "realtime.gguf", strict=True)
            made[steer] = (make_state(tiny_config(), 0, steer), tiny_config(), gguf)
        return made[steer]

    return get


@pytest.fixture(scope="session")
def realtime_model(realtime_files):
    """steer → RealtimeModel with an f32 KV cache (parity tests see f32 rounding only)."""
    made = {}

    def get(steer=False):
        if steer not in made:
            made[steer] = RealtimeModel(Weights.load(realtime_files(steer)[2],
                                                     get_backend(None, THREADS)), kv_type=F32)
        return made[steer]

    yield get
    for model in made.values():
        model.close()


@pytest.fixture(scope="session")
def v1_codec_gguf(tmp_path_factory):
    root = tmp_path_factory.mktemp("v1_codec_realtime")
    return convert_codec(str(make_tiny_v1_checkpoint(root / "hf", seed=0)), root / "codec.gguf")


@pytest.fixture(scope="session")
def realtime_tts(realtime_files, v1_codec_gguf):
    """steer → RealtimeTTS (f32 KV) with the tiny v1 codec, loaded once."""
    made = {}

    def get(steer=True):
        if steer not in made:
            made[steer] = RealtimeTTS.load(realtime_files(steer)[2], codec=v1_codec_gguf,
                                           threads=THREADS, kv_type=F32)
        return made[steer]

    yield get
    for tts in made.values():
        tts.close()
