"""Tiny MOSS-TTS-Nano checkpoints (fixtures.make_nano), converted once per session through the real
converter and loaded through the real loader (style C30), with their float64 reference state, and
the tiny 1600 Hz stereo codec (fixtures.make_codec) that matches them."""


import numpy as np
import pytest

from converters.nano import convert as convert_nano
from fixtures.make_nano import load_config, load_state, make_tiny_nano_tts_checkpoint
from fixtures.make_spm import make_tiny_spm
from fixtures.reference import nano as ref
from moss_tts.ggml import Weights, get_backend
from moss_tts.models.nano import NanoModel
from moss_tts.models.nano_tts import NanoTTS
from tests.models.local_v15_fixtures import local_v15_files, local_v15_model  # noqa: F401
from tests.models.local_fixtures import local_files, local_model  # noqa: F401 (MossTTSLocal)

# The tiny models' ops take microseconds; on a shared machine several ggml threads mostly wait on
# each other (tests/codec/conftest.py measured 10× slower on 2 loaded cores).
THREADS = 1
SAMPLE_RATE = 1600  # the tiny stereo codec: 8 codebooks of 64, 32 samples per frame and channel
N_VQ = 4
AUDIO_VOCAB = 64    # fixtures.make_nano default; the audio pad id is 64, outside every codebook


@pytest.fixture(scope="session")
def spm_bytes():
    """The tiny SentencePiece model with the real Nano special ids (vocab 480)."""
    return make_tiny_spm()


@pytest.fixture(scope="session")
def nano_files(tmp_path_factory, spm_bytes):
    """(seed, stop_bias) → (checkpoint dir, GGUF path); each is written and converted once."""
    made = {}

    def get(seed=0, stop_bias=0.0):
        key = (int(seed), float(stop_bias))
        if key not in made:
            root = tmp_path_factory.mktemp(f"nano_seed{seed}_bias{stop_bias:+g}")
            ckpt = make_tiny_nano_tts_checkpoint(
                root / "hf", seed=seed, tokenizer_model_bytes=spm_bytes, stop_bias=stop_bias,
                n_vq=N_VQ, audio_vocab_size=AUDIO_VOCAB, audio_tokenizer_sample_rate=SAMPLE_RATE)
            made[key] = (ckpt, convert_nano(str(ckpt), root / "nano.gguf"))
        return made[key]

    return get


@pytest.fixture(scope="session")
def nano_reference(nano_files):
    """(seed, stop_bias) → (float64 state, config.json dict) for fixtures.reference.nano."""
    made = {}

    def get(seed=0, stop_bias=0.0):
        key = (int(seed), float(stop_bias))
        if key not in made:
            ckpt, _ = nano_files(seed, stop_bias)
            made[key] = (ref.as_float64(load_state(ckpt)), load_config(ckpt))
        return made[key]

    return get


@pytest.fixture(scope="session")
def nano_model(nano_files):
    """The default tiny model (seed 0, stop_bias 0) as a bare NanoModel."""
    _, gguf = nano_files()
    model = NanoModel(Weights.load(gguf, get_backend(None, THREADS)))
    yield model
    model.close()


@pytest.fixture(scope="session")
def codec_gguf(tiny_codec):
    return tiny_codec("nano")


@pytest.fixture(scope="session")
def nano_tts(nano_files, codec_gguf):
    """(seed, stop_bias) → NanoTTS with the tiny stereo codec, loaded once per session."""
    made = {}

    def get(seed=0, stop_bias=0.0):
        key = (int(seed), float(stop_bias))
        if key not in made:
            _, gguf = nano_files(seed, stop_bias)
            made[key] = NanoTTS.load(gguf, codec=codec_gguf, threads=THREADS)
        return made[key]

    yield get
    for tts in made.values():
        tts.close()


def seeded_codes(frames, *, seed):
    """Random codes [frames, N_VQ] inside the codebooks (never all equal)."""
    return np.random.default_rng(seed).integers(0, AUDIO_VOCAB, size=(frames, N_VQ))


@pytest.fixture(scope="session")
def delay_files(tmp_path_factory):
    """(gen_bias, steady) → the tiny MossTTSDelay checkpoint (fixtures.make_delay, seed 0), its
    upstream-named float state (bf16 values), config.json dict, and its GGUF through the real
    converter with --strict; each made once."""
    from converters.delay import convert as convert_delay
    from fixtures.make_delay import make_state, make_tiny_delay_checkpoint, tiny_config

    made = {}

    def get(gen_bias=0.0, steady=True):
        if (gen_bias, steady) not in made:
            root = tmp_path_factory.mktemp(f"delay_bias{gen_bias:g}")
            state = make_state(tiny_config(), 0, gen_bias, steady=steady)
            ckpt = make_tiny_delay_checkpoint(root / "hf", state=state)
            gguf = convert_delay(str(ckpt), root / "delay.gguf", strict=True)
            made[gen_bias, steady] = (ckpt, state, tiny_config(), gguf)
        return made[gen_bias, steady]

    return get


@pytest.fixture(scope="session")
def delay_model(delay_files):
    """(gen_bias, KV type, steady) → DelayModel, loaded once; an f32 KV cache by default, so
    parity tests see f32 rounding only."""
    from moss_tts.ggml import F32
    from moss_tts.models.delay import DelayModel

    made = {}

    def get(gen_bias=0.0, kv_type=F32, steady=True):
        key = (gen_bias, int(kv_type), steady)
        if key not in made:
            made[key] = DelayModel(Weights.load(delay_files(gen_bias, steady)[3],
                                                get_backend(None, THREADS)), kv_type=kv_type)
        return made[key]

    yield get
    for model in made.values():
        model.close()


@pytest.fixture(scope="session")
def realtime_files(tmp_path_factory):
    """steer → the tiny MossTTSRealtime checkpoint (fixtures.make_realtime, seed 0) as (float
    state, config.json dict, GGUF through the real converter with --strict); the steered model
    speaks until the text is spent, then stops (fixtures.make_realtime.make_state)."""
    made = {}

    def get(steer=False):
        from converters.realtime import convert as convert_realtime
        from fixtures.make_realtime import make_state, make_tiny_realtime_checkpoint, tiny_config

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
    from moss_tts.ggml import F32
    from moss_tts.models.realtime import RealtimeModel

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
def v1_codec_gguf(tiny_codec):
    return tiny_codec()


@pytest.fixture(scope="session")
def v2_codec_gguf(tiny_codec):
    return tiny_codec("v2")


@pytest.fixture(scope="session")
def realtime_tts(realtime_files, v1_codec_gguf):
    """steer → RealtimeTTS (f32 KV) with the tiny v1 codec, loaded once."""
    from moss_tts.ggml import F32
    from moss_tts.models.realtime_tts import RealtimeTTS

    made = {}

    def get(steer=True):
        if steer not in made:
            made[steer] = RealtimeTTS.load(realtime_files(steer)[2], codec=v1_codec_gguf,
                                           threads=THREADS, kv_type=F32)
        return made[steer]

    yield get
    for tts in made.values():
        tts.close()


@pytest.fixture(scope="session")
def published_files(tmp_path_factory):
    """(kind, gen_bias, steady) → a tiny published MossTTSDelay checkpoint (fixtures.make_delay
    PUBLISHED: ttsd, voicegen, sfx; seed 0) as (checkpoint dir, config.json dict, GGUF through
    the real converter with --strict, recognized by its name); each made once."""
    from converters.delay import convert as convert_delay
    from fixtures.make_delay import PUBLISHED_N_VQ, make_tiny_published_checkpoint, tiny_config

    made = {}

    def get(kind, gen_bias=4.0, steady=True):
        if (kind, gen_bias, steady) not in made:
            root = tmp_path_factory.mktemp(f"{kind}_bias{gen_bias:g}")
            ckpt = make_tiny_published_checkpoint(kind, root, seed=0, gen_bias=gen_bias,
                                                  steady=steady)
            gguf = convert_delay(str(ckpt), root / f"{kind}.gguf", strict=True)
            made[kind, gen_bias, steady] = (ckpt, tiny_config(n_vq=PUBLISHED_N_VQ), gguf)
        return made[kind, gen_bias, steady]

    return get


@pytest.fixture(scope="session")
def published_tts(published_files, v1_codec_gguf):
    """kind → its TTS (load_tts picks the class from the GGUF; f32 KV) with the tiny v1 codec."""
    from moss_tts.ggml import F32
    from moss_tts.models.registry import family_of_model

    made = {}

    def get(kind):
        if kind not in made:
            gguf = published_files(kind)[2]
            made[kind] = family_of_model(gguf).tts_class().load(
                gguf, codec=v1_codec_gguf, threads=THREADS, kv_type=F32)
        return made[kind]

    yield get
    for tts in made.values():
        tts.close()
