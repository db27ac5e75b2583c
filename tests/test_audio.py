"""audio.py: the phase-vocoder tempo change keeps pitch and scales duration; long files are read
in blocks and resampled as a stream exactly as a whole; voice references are cut to a limit."""

import logging

import numpy as np
import pytest

from fixtures.compare import assert_close, assert_differs
from moss_tts.audio import (REFERENCE_MAX_SECONDS, StreamResampler, read_audio, read_audio_blocks,
                            resample, time_stretch, trim_reference)
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


@pytest.mark.parametrize("n", [0, 1, 160, 255, 2047])
@pytest.mark.parametrize("rate", [0.5, 2.0])
def test_time_stretch_handles_audio_shorter_than_a_frame(n, rate):
    """A one-word answer can be shorter than the vocoder's frame (2048 samples at 24 kHz):
    scipy refused it, and the server answered `speed` with a 500 (issue 23, hole 1)."""
    sr = 24000
    x = (0.5 * np.sin(2 * np.pi * 440 * np.arange(n) / sr))[:, None].repeat(2, 1)
    y = time_stretch(x.astype(np.float32), rate, sr)
    assert y.shape == (round(n / rate), 2) and y.dtype == np.float32
    if n >= 160:   # the speech survives: not cut to silence
        assert np.sqrt(np.mean(y ** 2)) > 0.1


def test_time_stretch_rejects_out_of_range_and_passes_rate_one_through():
    x = np.zeros((100, 2), np.float32)
    assert time_stretch(x, 1.0, 48000) is x
    with pytest.raises(InputError, match="between 0.25 and 4.0"):
        time_stretch(x, 5.0, 48000)


# -- long files: block reads and a streaming resampler ------------------------------------------
@pytest.mark.parametrize("rates", [(44100, 48000), (48000, 16000), (16000, 48000), (8000, 3200),
                                   (22050, 1600)])
def test_stream_resampler_equals_resampling_the_whole_signal(rates, rng):
    sr_from, sr_to = rates
    x = rng.standard_normal((sr_from * 2 + 37, 2)).astype(np.float32)
    want = resample(x, sr_from, sr_to)
    r = StreamResampler(sr_from, sr_to)
    parts, i = [], 0
    while i < len(x):   # blocks of random sizes, some shorter than the filter's reach
        n = int(rng.integers(1, sr_from // 3))
        parts.append(r.push(x[i:i + n]))
        i += n
    got = np.concatenate(parts + [r.flush()])
    assert got.shape == want.shape
    assert_close(got, want, atol=1e-6, what=f"streamed {sr_from} → {sr_to} Hz")
    # guard: resampling each block on its own (no context) is wrong at the block edges
    naive = np.concatenate([resample(x[j:j + sr_from // 4], sr_from, sr_to)
                            for j in range(0, len(x), sr_from // 4)])[: len(want)]
    assert_differs(naive, want, atol=1e-3, what="blocks resampled without context")


def test_read_audio_blocks_concatenate_to_the_file_and_max_seconds_reads_the_start(
        tmp_path, rng, caplog):
    import soundfile as sf
    x = (0.1 * rng.standard_normal((3200 * 25 + 11, 2))).astype(np.float32)
    path = tmp_path / "long.wav"
    sf.write(path, x, 3200, subtype="FLOAT")
    blocks, sr, total = read_audio_blocks(path, block_seconds=2.0)
    got = list(blocks)
    assert (sr, total) == (3200, len(x)) and max(len(b) for b in got) == 6400
    assert_close(np.concatenate(got), x, atol=0, what="blocks")
    with caplog.at_level(logging.WARNING, logger="moss_tts.audio"):
        head, _ = read_audio(path, max_seconds=10)
    assert_close(head, x[:32000], atol=0, what="the first 10 s")
    assert "25.0 s long; using its first 10 s" in caplog.text
    with pytest.raises(InputError, match="no such file"):
        read_audio_blocks(tmp_path / "missing.wav")


def test_trim_reference_cuts_past_the_limit_with_a_warning(caplog):
    x = np.zeros((1600 * 31, 2), np.float32)
    with caplog.at_level(logging.WARNING, logger="moss_tts.audio"):
        assert len(trim_reference(x, 1600)) == 1600 * REFERENCE_MAX_SECONDS
    assert "31.0 s long; using its first 30 s" in caplog.text
    short = x[:1600 * 5]
    assert trim_reference(short, 1600) is short


def test_stream_resampler_flush_keeps_the_channel_count():
    for rates in ((3200, 3200), (8000, 3200)):
        r = StreamResampler(*rates)
        r.push(np.ones((5000, 2), np.float32))
        assert r.flush().shape[1] == 2
    assert StreamResampler(8000, 3200).flush().shape == (0, 1)   # nothing pushed


@pytest.mark.parametrize("amplitude", [0.01, 0.14, 0.5])
def test_loudness_normalize_follows_the_clamped_gain_formula(amplitude):
    """docs/upstream-notes.md §family-1.3: gain = clamp(−20 − dBFS, −3, +3) dB; a quiet input gains
    at most 3 dB, a loud one loses at most 3 dB, one near −20 dBFS lands on it."""
    from moss_tts.audio import loudness_normalize

    x = (amplitude * np.sin(np.linspace(0, 300, 4800))).astype(np.float32)[:, None]
    dbfs = 10 * np.log10(np.mean(x.astype(np.float64) ** 2) + 1e-9)
    gain = np.clip(-20 - dbfs, -3, 3)
    y = loudness_normalize(x)
    np.testing.assert_allclose(y, x * 10 ** (gain / 20), rtol=1e-6)
    assert abs(gain) == 3 or abs(10 * np.log10(np.mean(y.astype(np.float64) ** 2)) + 20) < 1e-4


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
    with pytest.raises(InputError, match="sample_rate must be"):
        as_sample_rate(rate)
    with pytest.raises(InputError, match="sample_rate must be"):
        resample(np.zeros((10, 1), np.float32), rate, 24000)
    assert as_sample_rate(16000.0) == 16000 and as_sample_rate(np.int64(8000)) == 8000


def test_codec_encode_refuses_a_fractional_rate_instead_of_truncating_it(tiny_codec):
    from moss_tts.codec import Codec

    with Codec.load(tiny_codec(), threads=1) as codec:
        with pytest.raises(InputError, match="16000.5"):
            codec.encode(np.zeros(16000, np.float32), 16000.5)
