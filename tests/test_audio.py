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
