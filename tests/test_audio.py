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
    """moss_tts_family.md §1.3: gain = clamp(−20 − dBFS, −3, +3) dB; a quiet input gains at most
    3 dB, a loud one loses at most 3 dB, one near −20 dBFS lands on it."""
    from moss_tts.audio import loudness_normalize

    x = (amplitude * np.sin(np.linspace(0, 300, 4800))).astype(np.float32)[:, None]
    dbfs = 10 * np.log10(np.mean(x.astype(np.float64) ** 2) + 1e-9)
    gain = np.clip(-20 - dbfs, -3, 3)
    y = loudness_normalize(x)
    np.testing.assert_allclose(y, x * 10 ** (gain / 20), rtol=1e-6)
    assert abs(gain) == 3 or abs(10 * np.log10(np.mean(y.astype(np.float64) ** 2)) + 20) < 1e-4
