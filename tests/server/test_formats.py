"""The server's audio encodings: the streaming resampler against scipy's whole-signal one, the
OpenAI pcm layout, and the streamable WAV header."""

import io
import struct
import time

import numpy as np
import pytest
import soundfile as sf
from scipy.signal import resample_poly

from moss_tts.audio import StreamResampler
from moss_tts.server.formats import PcmLayout, encode_audio, wav_stream_header

# float32 output vs scipy's float64: a few ulps of full scale
TOL = 1e-6


@pytest.mark.parametrize("rate_from,rate_to", [(48000, 24000), (1600, 24000), (16000, 24000),
                                                (44100, 24000), (24000, 24000)])
@pytest.mark.parametrize("cuts", [[5000], [1, 7, 300, 0, 2000, 2692], [64] * 79 + [56]])
def test_stream_resampler_matches_resample_poly_however_cut(rng, rate_from, rate_to, cuts):
    x = rng.standard_normal((sum(cuts), 2))
    up, down = rate_to // np.gcd(rate_from, rate_to), rate_from // np.gcd(rate_from, rate_to)
    want = resample_poly(x, up, down, axis=0)
    r = StreamResampler(rate_from, rate_to)
    parts, at = [], 0
    for n in cuts:
        parts.append(r.push(x[at:at + n]))
        at += n
    got = np.concatenate(parts + [r.flush()])
    assert got.shape == want.shape and np.abs(got - want).max() < TOL
    # sensitivity: one changed input sample moves the output past the tolerance
    x[len(x) // 2] += 1
    r2 = StreamResampler(rate_from, rate_to)
    assert np.abs(np.concatenate([r2.push(x), r2.flush()]) - want).max() > 100 * TOL


def test_openai_pcm_layout_is_24k_mono_s16le(rng):
    x = rng.uniform(-0.5, 0.5, (4800, 2)).astype(np.float32)
    layout = PcmLayout("openai", 48000, 2)
    got = np.frombuffer(layout.push(x) + layout.flush(), "<i2")
    want = np.round(resample_poly(x.mean(axis=1), 1, 2) * 32767)
    assert (layout.rate, layout.channels) == (24000, 1)
    assert got.shape == want.shape and np.abs(got - want).max() <= 1


def test_native_pcm_layout_keeps_rate_and_channels(rng):
    x = rng.uniform(-0.5, 0.5, (100, 2)).astype(np.float32)
    layout = PcmLayout("native", 48000, 2)
    assert (layout.rate, layout.channels) == (48000, 2) and layout.flush() == b""
    assert np.array_equal(np.frombuffer(layout.push(x), "<i2").reshape(-1, 2),
                          np.round(x * 32767).astype(np.int16))


def test_wav_stream_header_declares_unknown_length():
    h = wav_stream_header(48000, 2)
    assert len(h) == 44
    fields = struct.unpack("<4sI4s4sIHHIIHH4sI", h)
    assert fields == (b"RIFF", 0xFFFFFFFF, b"WAVE", b"fmt ", 16, 1, 2, 48000, 192000, 4, 16,
                      b"data", 0xFFFFFFFF)


def test_float_wav_is_exact_and_the_same_bytes_every_time(rng):
    x = rng.uniform(-1.5, 1.5, (1000, 2)).astype(np.float32)   # past full scale is kept
    a = encode_audio(x, 48000, "wav")
    time.sleep(1.1)   # libsndfile's PEAK chunk would carry a new timestamp now
    assert encode_audio(x, 48000, "wav") == a
    back, rate = sf.read(io.BytesIO(a), dtype="float32")
    info = sf.info(io.BytesIO(a))
    assert rate == 48000 and info.subtype == "FLOAT" and np.array_equal(back, x)
