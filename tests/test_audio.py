"""audio.py: the phase-vocoder tempo change keeps pitch and scales duration."""

import numpy as np
import pytest

from moss_tts.audio import time_stretch
from moss_tts.errors import InputError


@pytest.mark.parametrize("rate", [0.5, 1.5, 2.0])
def test_time_stretch_scales_duration_and_keeps_pitch(rate):
    sr = 48000
    t = np.arange(2 * sr) / sr
    x = np.stack([np.sin(2 * np.pi * 440 * t), np.sin(2 * np.pi * 660 * t)], 1).astype(np.float32)
    y = time_stretch(x, rate, sr)
    assert abs(len(y) / len(x) - 1 / rate) < 0.01
    freqs = np.fft.rfftfreq(len(y), 1 / sr)
    for ch, f0 in ((0, 440), (1, 660)):
        peak = freqs[np.argmax(np.abs(np.fft.rfft(y[:, ch])))]
        assert abs(peak - f0) < 2, (rate, ch, peak)
    # guard: plain resampling to the same length moves the pitch, and this check sees it
    from scipy.signal import resample
    naive = resample(x[:, 0], len(y))
    assert abs(freqs[np.argmax(np.abs(np.fft.rfft(naive)))] - 440) > 2


def test_time_stretch_rejects_out_of_range_and_passes_rate_one_through():
    x = np.zeros((100, 2), np.float32)
    assert time_stretch(x, 1.0, 48000) is x
    with pytest.raises(InputError, match="between 0.25 and 4.0"):
        time_stretch(x, 5.0, 48000)


# --- output sample formats (the same bytes in a file and on stdout) ----------------------------

from moss_tts.audio import (PcmStreamWriter, as_sample_rate, pcm_bytes, resample,  # noqa: E402
                            wav_header, write_audio)


def _edge_samples(rng):
    x = rng.uniform(-0.9, 0.9, size=(50, 2)).astype(np.float32)
    x[:4, 0] = [1.5, -1.5, 1.0, -1.0]  # past full scale: integers clip, f32 keeps them
    return x


def test_pcm_bytes_match_an_independent_packing(rng):
    x = _edge_samples(rng)
    clipped = np.clip(x.astype(np.float64), -1, 1)
    s16 = np.round(clipped * 32767).astype(np.int64)
    assert pcm_bytes(x, "s16") == b"".join(int(v).to_bytes(2, "little", signed=True)
                                           for v in s16.ravel())
    s24 = np.round(clipped * 8388607).astype(np.int64)
    assert pcm_bytes(x, "s24") == b"".join(int(v).to_bytes(3, "little", signed=True)
                                           for v in s24.ravel())
    assert np.array_equal(np.frombuffer(pcm_bytes(x, "f32"), "<f4").reshape(x.shape), x)
    with pytest.raises(InputError, match="unknown sample format 's8'"):
        pcm_bytes(x, "s8")


@pytest.mark.parametrize("sample_format", ["s16", "s24", "f32"])
def test_write_audio_stores_what_the_stream_sends(rng, tmp_path, sample_format):
    import soundfile as sf

    x = _edge_samples(rng)
    write_audio(tmp_path / "a.wav", x, 8000, sample_format=sample_format)
    width = {"s16": 2, "s24": 3, "f32": 4}[sample_format]
    data = (tmp_path / "a.wav").read_bytes()
    assert data.endswith(pcm_bytes(x, sample_format))            # the data chunk ends the file
    assert sf.info(tmp_path / "a.wav").frames * 2 * width == len(pcm_bytes(x, sample_format))
    if sample_format != "f32":
        write_audio(tmp_path / "a.flac", x, 8000, sample_format=sample_format)
        a, _ = sf.read(tmp_path / "a.wav", dtype="int32")
        b, _ = sf.read(tmp_path / "a.flac", dtype="int32")
        assert np.array_equal(a, b)
    else:
        with pytest.raises(InputError, match="FLAC stores integer samples"):
            write_audio(tmp_path / "a.flac", x, 8000, sample_format="f32")
        assert not (tmp_path / "a.flac").exists()


def test_wav_header_fields():
    import struct

    h = wav_header(48000, 2, "s24", 600)
    fields = struct.unpack("<4sI4s4sIHHIIHH4sI", h)
    assert fields == (b"RIFF", 636, b"WAVE", b"fmt ", 16, 1, 2, 48000, 48000 * 6, 6, 24,
                      b"data", 600)
    assert struct.unpack("<H", wav_header(8000, 1, "f32", 0)[20:22]) == (3,)  # IEEE float tag
    streaming = wav_header(8000, 1, "s16", 0xFFFFFFFF)
    assert streaming[4:8] == streaming[40:44] == b"\xff\xff\xff\xff"


def test_stream_writer_patches_a_seekable_stream_and_leaves_a_pipe_streaming(rng, tmp_path):
    import io
    import os

    x = _edge_samples(rng)
    with open(tmp_path / "s.wav", "wb") as f, PcmStreamWriter(f, 8000, 2) as w:
        w.write(x[:20])
        w.write(x[20:])
    data = (tmp_path / "s.wav").read_bytes()
    assert data == wav_header(8000, 2, "s16", 200) + pcm_bytes(x, "s16")
    with open(tmp_path / "s.wav", "ab") as f, PcmStreamWriter(f, 8000, 2) as w:  # append mode:
        w.write(x)                                                # a patch would land at the end
    assert (tmp_path / "s.wav").read_bytes()[len(data):] == (
        wav_header(8000, 2, "s16", 0xFFFFFFFF) + pcm_bytes(x, "s16"))
    read, write = os.pipe()
    with os.fdopen(write, "wb") as pipe_end, PcmStreamWriter(pipe_end, 8000, 2) as w:
        w.write(x)
    with os.fdopen(read, "rb") as r:
        assert r.read() == wav_header(8000, 2, "s16", 0xFFFFFFFF) + pcm_bytes(x, "s16")
    empty = io.BytesIO()
    with PcmStreamWriter(empty, 8000, 2, fmt="raw"):
        pass
    assert empty.getvalue() == b""


@pytest.mark.parametrize("rate", [16000.5, 0, -8000, float("nan"), "16000", True])
def test_a_sample_rate_must_be_a_positive_whole_number(rate):
    with pytest.raises(InputError, match="sample rate must be"):
        as_sample_rate(rate)
    with pytest.raises(InputError, match="sample rate must be"):
        resample(np.zeros((10, 1), np.float32), rate, 24000)
    assert as_sample_rate(16000.0) == 16000 and as_sample_rate(np.int64(8000)) == 8000


def test_codec_encode_refuses_a_fractional_rate_instead_of_truncating_it(tmp_path):
    from converters.codec import convert
    from fixtures.make_codec import make_tiny_v1_checkpoint
    from moss_tts.codec import Codec

    gguf = convert(make_tiny_v1_checkpoint(tmp_path / "c", seed=0), tmp_path / "c.gguf")
    with Codec.load(gguf, threads=1) as codec:
        with pytest.raises(InputError, match="16000.5"):
            codec.encode(np.zeros(16000, np.float32), 16000.5)
