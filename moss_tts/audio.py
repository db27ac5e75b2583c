"""Audio in and out: read/write WAV and FLAC (soundfile), resample (scipy), channel layout, and
atomic writes so a failed run never leaves a half-written file."""

from __future__ import annotations

import os
import tempfile
from math import gcd
from pathlib import Path

import numpy as np

from .errors import InputError

WRITE_FORMATS = {".wav": "WAV", ".flac": "FLAC"}


def read_audio(path: str | os.PathLike) -> tuple[np.ndarray, int]:
    """→ (samples float32 [n, channels], sample_rate)."""
    import soundfile as sf

    path = Path(path)
    if not path.is_file():
        raise InputError(f"{path}: no such file")
    try:
        data, sr = sf.read(str(path), dtype="float32", always_2d=True)
    except Exception as e:  # libsndfile: unknown format, truncated header, ...
        raise InputError(f"{path}: cannot read audio ({str(e).splitlines()[0]}) — use a WAV or "
                         "FLAC file") from None
    return data, int(sr)


def as_samples(samples, *, what: str = "audio") -> np.ndarray:
    """float32 [n, channels] from [n] or [n, channels]; rejects empty and non-finite input."""
    x = np.asarray(samples)
    if x.dtype.kind not in "fiu":
        raise InputError(f"{what}: samples must be numbers, got dtype {x.dtype}")
    x = x.astype(np.float32, copy=False)
    if x.ndim == 1:
        x = x[:, None]
    if x.ndim != 2:
        raise InputError(f"{what}: expected shape [n] or [n, channels], got {x.shape}")
    if x.shape[0] == 0 or x.shape[1] == 0:
        raise InputError(f"{what}: no samples")
    if not np.isfinite(x).all():
        raise InputError(f"{what}: contains NaN or infinite samples")
    return x


def resample(x: np.ndarray, sr_from: int, sr_to: int) -> np.ndarray:
    """Polyphase resampling along time (scipy.signal.resample_poly); x [n, channels]."""
    if sr_from == sr_to:
        return x
    if sr_from <= 0 or sr_to <= 0:
        raise InputError(f"sample rate must be positive, got {sr_from} → {sr_to}")
    from scipy.signal import resample_poly

    g = gcd(int(sr_from), int(sr_to))
    return resample_poly(x, sr_to // g, sr_from // g, axis=0).astype(np.float32)


def to_channels(x: np.ndarray, channels: int) -> np.ndarray:
    """Mono codecs take the channel mean (as MOSS-TTS's processors do); stereo codecs duplicate a
    mono input and refuse more than two channels."""
    have = x.shape[1]
    if have == channels:
        return x
    if channels == 1:
        return x.mean(axis=1, keepdims=True, dtype=np.float32)
    if have == 1:
        return np.repeat(x, channels, axis=1)
    raise InputError(f"audio has {have} channels; this codec takes {channels} (or mono)")


def write_audio(path: str | os.PathLike, samples: np.ndarray, sample_rate: int) -> Path:
    """Write [n, channels] float32 to .wav (float32) or .flac (24-bit) atomically."""
    import soundfile as sf

    path = Path(path)
    fmt = WRITE_FORMATS.get(path.suffix.lower())
    if fmt is None:
        raise InputError(f"{path}: unsupported output format {path.suffix!r}; use .wav or .flac")
    subtype = "FLOAT" if fmt == "WAV" else "PCM_24"
    data = np.asarray(samples, dtype=np.float32)
    if fmt == "FLAC":
        data = np.clip(data, -1.0, 1.0)  # FLAC is integer PCM
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".partial", dir=path.parent)
    os.close(fd)
    try:
        sf.write(tmp, data, int(sample_rate), subtype=subtype, format=fmt)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


class PcmStreamWriter:
    """Interleaved 16-bit PCM to a binary stream as audio arrives: raw s16le, or a WAV whose
    header declares the maximum length (the total is unknown while streaming; players read on)."""

    def __init__(self, stream, sample_rate: int, channels: int, *, fmt: str = "wav"):
        self.stream, self.sample_rate, self.channels, self.fmt = stream, sample_rate, channels, fmt
        self._header_done = fmt == "raw"

    def _header(self) -> bytes:
        import struct

        block = 2 * self.channels
        size = 0xFFFFFFFF - 36
        return (b"RIFF" + struct.pack("<I", size + 36) + b"WAVEfmt " +
                struct.pack("<IHHIIHH", 16, 1, self.channels, self.sample_rate,
                            self.sample_rate * block, block, 16) + b"data" + struct.pack("<I", size))

    def write(self, samples: np.ndarray) -> None:
        if not self._header_done:
            self.stream.write(self._header())
            self._header_done = True
        pcm = np.round(np.clip(samples, -1.0, 1.0) * 32767.0).astype("<i2")
        self.stream.write(pcm.tobytes())
        self.stream.flush()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        if not self._header_done and exc[0] is None:
            self.stream.write(self._header())
        self.stream.flush()


def time_stretch(x: np.ndarray, rate: float, sample_rate: int) -> np.ndarray:
    """Change tempo by `rate` (> 1 faster) keeping pitch: a phase vocoder over 2048-sample
    frames (about 43 ms at 48 kHz), x [n, channels] → [≈ n / rate, channels]."""
    if rate == 1.0:
        return x
    if not 0.25 <= rate <= 4.0:
        raise InputError(f"speed must be between 0.25 and 4.0, got {rate}")
    from scipy.signal import istft, stft

    nfft = 2048 if sample_rate >= 16000 else 256
    hop = nfft // 4
    out = []
    for ch in range(x.shape[1]):
        _, _, spec = stft(x[:, ch], nperseg=nfft, noverlap=nfft - hop, boundary="zeros")
        steps = np.arange(0, spec.shape[1] - 1, rate)
        bins = spec.shape[0]
        advance = 2 * np.pi * hop * np.arange(bins) / nfft      # expected phase step per hop
        phase = np.angle(spec[:, 0])
        frames = np.empty((bins, len(steps)), dtype=np.complex128)
        for j, t in enumerate(steps):
            i, frac = int(t), t - int(t)
            a, b = spec[:, i], spec[:, i + 1]
            frames[:, j] = ((1 - frac) * np.abs(a) + frac * np.abs(b)) * np.exp(1j * phase)
            delta = np.angle(b) - np.angle(a) - advance
            phase = phase + advance + (delta - 2 * np.pi * np.round(delta / (2 * np.pi)))
        _, y = istft(frames, nperseg=nfft, noverlap=nfft - hop, boundary=True)
        out.append(y)
    n = min(len(y) for y in out)
    return np.stack([y[:n] for y in out], axis=1).astype(np.float32)


def loudness_normalize(x: np.ndarray, *, target_dbfs: float = -20.0,
                       max_gain_db: float = 3.0) -> np.ndarray:
    """MOSS-TTS's reference loudness step (moss_tts_family.md §1.3): gain toward target_dbfs,
    clamped to ±max_gain_db, from dBFS = 10·log10(mean(x²) + 1e-9) over all samples."""
    dbfs = 10.0 * np.log10(float(np.mean(np.square(x, dtype=np.float64))) + 1e-9)
    gain_db = min(max(target_dbfs - dbfs, -max_gain_db), max_gain_db)
    return (x * np.float32(10.0 ** (gain_db / 20.0))).astype(np.float32)
