"""The TTS protocol across families (moss_tts/tts.py, moss_tts/load.py): NanoTTS and DelayTTS
share CodecTTS and one Reference type, and `load_tts` picks the family from the GGUF's kind."""

import numpy as np
import pytest

import moss_tts
from moss_tts.errors import InputError, ModelFileError
from moss_tts.load import load_tts, tts_class
from moss_tts.models import nano_tts as nano_tts_module
from moss_tts.models.delay_tts import DelayTTS
from moss_tts.models.nano_tts import NanoTTS
from moss_tts.sampling import DelaySamplingOptions, SamplingOptions
from moss_tts.models.tts import TTS, CodecTTS, Reference, family_stream

from .conftest import THREADS


def test_nano_is_a_codec_tts_with_the_shared_synthesize_and_close(nano_tts):
    tts = nano_tts()
    assert isinstance(tts, TTS) and isinstance(tts, CodecTTS)
    assert tts.channels == 2 and tts.sample_rate == tts.codec.sample_rate
    assert NanoTTS.synthesize is CodecTTS.synthesize
    assert NanoTTS.OPTIONS is SamplingOptions and DelayTTS.OPTIONS is DelaySamplingOptions


def test_one_reference_type_for_every_family(nano_tts):
    assert nano_tts_module.Reference is Reference is moss_tts.Reference
    tts = nano_tts()
    t = np.arange(tts.sample_rate // 2) / tts.sample_rate
    ref = tts.encode_reference(0.3 * np.sin(2 * np.pi * 220 * t), tts.sample_rate)
    assert type(ref) is Reference


def test_a_stream_with_no_audio_is_an_error_never_0_samples(nano_tts, monkeypatch):
    tts = nano_tts()
    monkeypatch.setattr(NanoTTS, "stream", family_stream(lambda self, text, **kw: iter(())))
    with pytest.raises(InputError, match="no audio was made: the model ended the speech"):
        tts.synthesize("Hi.")


def test_load_tts_picks_the_family_from_the_gguf_kind(nano_files, codec_gguf, delay_files):
    _, nano_gguf = nano_files()
    assert tts_class(nano_gguf) is NanoTTS and tts_class(delay_files(4.0)[3]) is DelayTTS
    with load_tts(nano_gguf, codec=codec_gguf, threads=THREADS) as tts:
        assert type(tts) is NanoTTS and tts.codec is not None
    assert moss_tts.load_tts is load_tts


def test_load_tts_refuses_a_codec_gguf_as_a_model(codec_gguf):
    with pytest.raises(ModelFileError, match=r"'codec' GGUF, not a speech model — pass a nano, "
                                             r"delay, local, local-v15, realtime or sfx-v2 model GGUF"):
        load_tts(codec_gguf)


def test_load_tts_refuses_a_plain_directory(tmp_path):
    with pytest.raises(ModelFileError, match="not a published MOSS-TTS-GGUF"):
        tts_class(tmp_path)
