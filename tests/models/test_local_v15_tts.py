"""LocalV15TTS (models/local_v15_tts.py) with the tiny Local v1.5 model and the tiny v2 stereo
codec: streamed audio == synthesize() == codec.decode of the generated frames, for upstream's
adaptive chunk ladder and fixed chunks; continuation through the codec stream; voice cloning;
the family read from the GGUF; bad input."""

import numpy as np
import pytest

from fixtures.compare import assert_close
from fixtures.make_local_v15 import N_VQ, SAMPLE_RATE
from moss_tts.errors import InputError, ModelFileError
from moss_tts.load import load_tts, tts_class
from moss_tts.models.local_v15_tts import LocalV15TTS
from moss_tts.sampling import LocalV15SamplingOptions
from moss_tts.models.tts import TTS, Reference
from tests.models.local_v15_fixtures import THREADS

DECODE_ATOL = 1e-5   # streaming vs offline codec decode: f32 kernel order only (codec tests)
GREEDY = LocalV15SamplingOptions(do_sample=False)
HOP = 32             # the tiny v2 codec: samples per frame and channel


@pytest.fixture(scope="module")
def tts(local_v15_files, v2_codec_gguf):
    t = LocalV15TTS.load(local_v15_files(6.0)[3], codec=v2_codec_gguf, threads=THREADS)
    yield t
    t.close()


def frames_of(tts, text, **kw):
    return tts.generate(tts.plan(text), **kw)[:, 1:]


@pytest.mark.parametrize("chunk_frames", [0, 1, 3], ids=["adaptive", "fixed1", "fixed3"])
def test_stream_equals_synthesize_equals_offline_decode(tts, chunk_frames):
    kw = dict(options=GREEDY, max_frames=11)
    chunks = list(tts.stream("Hello there.", chunk_frames=chunk_frames, **kw))
    audio, sr = tts.synthesize("Hello there.", chunk_frames=chunk_frames, **kw)
    codes = frames_of(tts, "Hello there.", **kw)
    assert sr == SAMPLE_RATE and audio.shape == (11 * HOP, 2) and len(codes) == 11
    # adaptive chunks follow the wall clock, so two runs may push different chunks: the tiny
    # f32 codec's stream gives the same samples whatever the grouping
    np.testing.assert_array_equal(np.concatenate(chunks), audio)
    assert_close(audio, tts.codec.decode(codes.T), atol=DECODE_ATOL, what="offline decode")
    sizes = [len(c) // HOP for c in chunks]
    if chunk_frames:
        assert sizes[:-1] == [chunk_frames] * (len(sizes) - 1)
    else:   # 4 frames first (§family-4.7), then by the lead; the tiny model runs far ahead of time
        assert sizes[0] == 4 and max(sizes) <= 8 and sum(sizes) == 11


def test_sampled_stream_is_reproducible_and_seeded(tts):
    """synthesize() pushes fixed chunks by default, so a seed gives the same floats."""
    a, _ = tts.synthesize("Hello.", seed=3, max_frames=12)
    b, _ = tts.synthesize("Hello.", seed=3, max_frames=12)
    c, _ = tts.synthesize("Hello.", seed=4, max_frames=12)
    assert_close(a, b, atol=0, what="same seed")
    assert not np.array_equal(a, c)


def test_continuation_continues_the_prompt_through_the_codec(tts):
    """The prompt codes prime the codec stream and their audio is dropped: the output is the
    offline decode of prompt + generated frames without the prompt's samples (§family-4.5)."""
    prompt = np.random.default_rng(2).integers(0, 64, (5, N_VQ))
    audio, _ = tts.synthesize("Earlier. Next.", prompt=prompt, options=GREEDY, max_frames=6)
    codes = tts.generate(tts.plan("Earlier. Next.", prompt=prompt), options=GREEDY,
                         max_frames=6)[:, 1:]
    whole = tts.codec.decode(np.vstack([prompt, codes]).T)
    assert_close(audio, whole[len(prompt) * HOP:], atol=DECODE_ATOL, what="continued audio")
    assert not np.allclose(audio, tts.codec.decode(codes.T), atol=1e-3), "prompt had no effect"
    # the transcript as prompt_text is the same request
    same, _ = tts.synthesize("Next.", prompt=prompt, prompt_text="Earlier.", options=GREEDY,
                             max_frames=6)
    assert_close(same, audio, atol=DECODE_ATOL, what="prompt_text joined to the text")


def test_reference_audio_is_encoded_in_stereo_and_cloned(tts):
    rng = np.random.default_rng(5)
    mono = (0.2 * rng.standard_normal(20 * HOP)).astype(np.float32)
    ref = tts.encode_reference(mono, SAMPLE_RATE)
    assert isinstance(ref, Reference) and ref.codes.shape == (20, N_VQ)
    stereo = tts.encode_reference(np.column_stack([mono, mono]), SAMPLE_RATE)
    np.testing.assert_array_equal(ref.codes, stereo.codes)   # mono is duplicated (P22)
    rows = tts.plan("Hi.", reference=ref)
    assert (rows[:, 0] == 151654).sum() == 20
    audio, _ = tts.synthesize("Hi.", reference=(mono, SAMPLE_RATE), options=GREEDY, max_frames=4)
    plain, _ = tts.synthesize("Hi.", options=GREEDY, max_frames=4)
    assert audio.shape == (4 * HOP, 2) and not np.array_equal(audio, plain)


def test_family_is_read_from_the_gguf(local_v15_files, v2_codec_gguf):
    gguf = local_v15_files(6.0)[3]
    assert tts_class(gguf) is LocalV15TTS
    with load_tts(gguf, codec=v2_codec_gguf, threads=THREADS) as t:
        assert isinstance(t, TTS) and (t.sample_rate, t.channels) == (SAMPLE_RATE, 2)


def test_a_mono_codec_is_refused(local_v15_files, v1_codec_gguf):
    with pytest.raises(ModelFileError, match="mismatched codec.*v2"):
        LocalV15TTS.load(local_v15_files(6.0)[3], codec=v1_codec_gguf, threads=THREADS)


@pytest.mark.parametrize("kwargs, match", [
    ({"chunk_frames": -1}, "chunk_frames"),
    ({"max_frames": 0}, "max_frames"),
    ({"seed": -2}, "seed"),
    ({"options": {"do_sample": False}}, "LocalV15SamplingOptions"),
    ({"reference": "voice.wav"}, "cannot be a str"),
    ({"seconds": 2, "tokens": 5}, "seconds"),
    ({"mood": "happy"}, "unknown prompt field"),
    ({"prompt_text": "Earlier."}, "give prompt="),
])
def test_bad_arguments_fail_before_any_audio(tts, kwargs, match):
    with pytest.raises(InputError, match=match) as e:
        tts.stream("Hello.", **kwargs)
    assert "\n" not in str(e.value)
