"""Audio in and out: read/write WAV and FLAC (soundfile), resample (scipy), channel layout, and
atomic writes so a failed run never leaves a half-written file."""

from __future__ import annotations

import io
import logging
import os
from collections.abc import Iterator
from math import gcd
from pathlib import Path

import numpy as np

from .errors import InputError
from .fileio import atomic_output

logger = logging.getLogger(__name__)

WRITE_FORMATS = {".wav": "WAV", ".flac": "FLAC"}
# A voice reference longer than this is cut to it: a voice needs seconds (upstream suggests 5-15 s
# and ships 2.6-17 s voices); encoding more only costs time, and the prompt, attention.
REFERENCE_MAX_SECONDS = 30.0
BLOCK_SECONDS = 10.0  # read_audio_blocks: audio per block


def read_audio(path: str | os.PathLike, *, max_seconds: float | None = None
               ) -> tuple[np.ndarray, int]:
    """→ (samples float32 [n, channels], sample_rate). With `max_seconds`, only that much is
    read from the start (a warning says what was left out): a voice needs seconds of an hour."""
    import soundfile as sf

    path = _existing(path)
    try:
        with sf.SoundFile(str(path)) as f:
            sr = int(f.samplerate)
            frames = -1 if max_seconds is None else int(max_seconds * sr)
            if 0 <= frames < f.frames:
                logger.warning("%s: %.1f s long; using its first %g s", path, f.frames / sr,
                               max_seconds)
            data = f.read(frames, dtype="float32", always_2d=True)
    except Exception as e:  # libsndfile: unknown format, truncated header, ...
        raise _unreadable(path, e) from None
    return data, sr


def read_audio_blocks(path: str | os.PathLike, *, block_seconds: float = BLOCK_SECONDS
                      ) -> tuple[Iterator[np.ndarray], int, int]:
    """A file read a block at a time, so an hour of audio never sits in memory:
    (blocks float32 [n, channels], sample_rate, frames per channel)."""
    import soundfile as sf

    path = _existing(path)
    try:
        info = sf.info(str(path))
    except Exception as e:
        raise _unreadable(path, e) from None
    blocksize = max(1, int(block_seconds * info.samplerate))
    return _blocks(path, blocksize), int(info.samplerate), int(info.frames)


def _blocks(path: Path, blocksize: int) -> Iterator[np.ndarray]:
    import soundfile as sf

    try:
        yield from sf.blocks(str(path), blocksize=blocksize, dtype="float32", always_2d=True)
    except Exception as e:  # a file that breaks off mid-way
        raise _unreadable(path, e) from None


def _existing(path) -> Path:
    path = Path(path)
    if not path.is_file():
        raise InputError(f"{path}: no such file")
    return path


def _unreadable(path: Path, e: Exception) -> InputError:
    return InputError(f"{path}: cannot read audio ({str(e).splitlines()[0]}) — use a WAV or "
                      "FLAC file")


def trim_reference(x: np.ndarray, sample_rate: int,
                   max_seconds: float = REFERENCE_MAX_SECONDS) -> np.ndarray:
    """A voice reference [n, channels] cut to its first max_seconds, with a warning when cut."""
    limit = int(max_seconds * sample_rate)
    if len(x) <= limit:
        return x
    logger.warning("reference audio is %.1f s long; using its first %g s (a voice needs a few "
                   "seconds)", len(x) / sample_rate, max_seconds)
    return x[:limit]


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


class StreamResampler:
    """`resample` over a signal that arrives in blocks, equal to resampling it whole.

    Each output sample of resample_poly depends on the inputs within its filter's reach, so a
    block is resampled with `margin` inputs of context on each side and only its own outputs are
    kept; block edges fall on multiples of `down` inputs, where input and output grids align."""

    def __init__(self, sr_from: int, sr_to: int):
        if sr_from <= 0 or sr_to <= 0:
            raise InputError(f"sample rate must be positive, got {sr_from} → {sr_to}")
        g = gcd(int(sr_from), int(sr_to))
        self.sr_from, self.sr_to = int(sr_from), int(sr_to)
        self.up, self.down = self.sr_to // g, self.sr_from // g
        # resample_poly's default filter reaches 10·max(up, down) upsampled samples each side
        reach = -(-10 * max(self.up, self.down) // self.up) + 1
        self.margin = -(-reach // self.down) * self.down
        self._pending = np.zeros((0, 1), np.float32)   # inputs from index _start on
        self._start = 0
        self._emitted = 0                               # outputs returned so far

    def push(self, x: np.ndarray) -> np.ndarray:
        """Input block [n, channels] → the output samples it completes."""
        if self.up == self.down:
            self._pending = x[:0]   # remembers the channel count for flush()
            return x
        self._pending = np.concatenate([self._pending, x]) if len(self._pending) else x
        known = self._start + len(self._pending)
        return self._emit((known - self.margin) // self.down * self.down)

    def flush(self) -> np.ndarray:
        """The outputs left at the end of the signal."""
        if self.up == self.down or not len(self._pending):
            return self._pending[:0]
        return self._emit(None)

    def _emit(self, end: int | None) -> np.ndarray:
        """Outputs for inputs [done, end) (end None: to the end of the signal)."""
        from scipy.signal import resample_poly

        done = self._emitted * self.down // self.up
        if end is not None and end <= done:
            return np.zeros((0, self._pending.shape[1]), np.float32)
        seg = max(self._start, done - self.margin)
        stop = None if end is None else end + self.margin - self._start
        y = resample_poly(self._pending[seg - self._start:stop], self.up, self.down, axis=0)
        lo = (done - seg) * self.up // self.down
        out = y[lo:] if end is None else y[lo:lo + (end - done) * self.up // self.down]
        self._emitted += len(out)
        if end is not None:  # keep only the left context the next block needs
            keep = max(self._start, end - self.margin)
            self._pending, self._start = self._pending[keep - self._start:], keep
        return out.astype(np.float32)


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
    path = Path(path)
    data = encode_audio(samples, sample_rate, path.suffix, name=str(path))
    with atomic_output(path) as tmp:
        tmp.write_bytes(data)
    return path


def encode_audio(samples: np.ndarray, sample_rate: int, suffix: str, *, name: str = "output") -> bytes:
    """[n, channels] float32 → the bytes of a .wav (float32) or .flac (24-bit) file; a batch
    worker sends these to the process that owns the output directory."""
    import soundfile as sf

    fmt = WRITE_FORMATS.get(suffix.lower())
    if fmt is None:
        raise InputError(f"{name}: unsupported output format {suffix!r}; use .wav or .flac")
    subtype = "FLOAT" if fmt == "WAV" else "PCM_24"
    data = np.asarray(samples, dtype=np.float32)
    if fmt == "FLAC":
        data = np.clip(data, -1.0, 1.0)  # FLAC is integer PCM
    buf = io.BytesIO()
    sf.write(buf, data, int(sample_rate), subtype=subtype, format=fmt)
    return buf.getvalue()


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
