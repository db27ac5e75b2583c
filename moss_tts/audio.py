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

from .errors import InputError, whole_number
from .fileio import atomic_output

logger = logging.getLogger(__name__)

WRITE_FORMATS = {".wav": "WAV", ".flac": "FLAC"}
# A voice reference longer than this is cut to it: a voice needs seconds (upstream suggests 5-15 s
# and ships 2.6-17 s voices); encoding more only costs time, and the prompt, attention.
REFERENCE_MAX_SECONDS = 30.0
BLOCK_SECONDS = 10.0  # read_audio_blocks: audio per block
# What a file's header may declare, checked before a sample is decoded (issue 31, finding 4):
MAX_CHANNELS = 2          # every codec takes mono or stereo (to_channels): more is never used
# speech is recorded at 8-48 kHz and studio gear reaches 192 kHz, where 30 s of stereo is 46 MB
# (4.4x the server's 10 MiB upload); below 1 kHz nothing of a voice is left (the tiny test
# codecs run at 1.6 kHz)
SAMPLE_RATES = (1000, 192000)
# A continuation prompt is used whole (it must match its transcript): its frames share the
# backbone's context with the text and the new frames, and the largest context of a family that
# continues (Delay, Local, Local v1.5: 40960 positions at 12.5 frames/s) holds 54 min; a longer
# prompt could never be used.
PROMPT_MAX_SECONDS = 40960 / 12.5
UNKNOWN_LENGTH = 2**63 - 1   # libsndfile's frame count for a file that does not state it
# Output sample formats, the same bytes in a file and on stdout. 16-bit PCM by default: every
# player, browser and speech tool reads it, and its noise floor (-96 dBFS) lies far below the
# codec's own error. s24 and s16 clip to [-1, 1]; f32 is the model output unchanged (unclipped).
SAMPLE_FORMATS = {"s16": "PCM_16", "s24": "PCM_24", "f32": "FLOAT"}
DEFAULT_SAMPLE_FORMAT = "s16"
_FULL_SCALE = {"s16": 32767, "s24": 8388607}
STREAM_SIZE = 0xFFFFFFFF  # a streamed WAV's RIFF and data sizes: "unknown, read to the end"


def read_audio(source, *, max_seconds: float | None = None, limit_seconds: float | None = None,
               name: str | None = None) -> tuple[np.ndarray, int]:
    """→ (samples float32 [n, channels], sample_rate) of a WAV/FLAC file: a path, or a binary
    file object (an upload). `max_seconds`: only that much is read from the start (a warning
    says what was left out): a voice needs seconds of an hour. `limit_seconds`: the file is
    used whole, and one longer than that is refused. `name` names the file in errors (the flag
    or field that gave it; default: the path).

    The header is checked before a sample is decoded (`_checked_header`) and the samples are
    read a block at a time up to the bound, whatever the header says of their length: a small
    compressed file (a FLAC of silence holds 100 M samples in 300 KB) cannot decode to
    gigabytes."""
    import soundfile as sf

    if isinstance(source, (str, os.PathLike)):
        source = _existing(source, name)
        name = name or str(source)
        source = str(source)
    name = name or "audio"
    try:
        with sf.SoundFile(source) as f:
            sr = _checked_header(f, name, limit_seconds)
            bounds = [int(s * sr) for s in (max_seconds, limit_seconds) if s is not None]
            data = _read_frames(f, min(bounds, default=f.frames))
            if max_seconds is not None and f.frames > len(data) == int(max_seconds * sr):
                logger.warning("%s: %.1f s long; using its first %g s", name, f.frames / sr,
                               max_seconds)
    except InputError:
        raise
    except Exception as e:  # libsndfile: unknown format, truncated header, ...
        raise _unreadable(name, e) from None
    return data, sr


def _checked_header(f, name: str, limit_seconds: float | None = None) -> int:
    """An open SoundFile's sample rate, once its header declares what a voice or prompt can be:
    at most MAX_CHANNELS channels, a rate within SAMPLE_RATES, a length it states (and, with
    `limit_seconds`, within it); a one-line InputError naming `name` else."""
    sr, low, high = int(f.samplerate), *SAMPLE_RATES
    if not low <= sr <= high:
        raise InputError(f"{name}: its header declares {sr} Hz; audio is read at {low} to "
                         f"{high} Hz — resample it first")
    if f.channels > MAX_CHANNELS:
        raise InputError(f"{name}: its header declares {f.channels} channels; every codec "
                         f"takes mono or stereo (at most {MAX_CHANNELS}) — mix it down first")
    if f.frames >= UNKNOWN_LENGTH:
        raise InputError(f"{name}: its header does not say how long it is (a FLAC written to "
                         "a pipe?) — write it to a file again")
    if limit_seconds is not None and f.frames > limit_seconds * sr:
        raise InputError(f"{name} is {f.frames / sr:.1f} s long; it is used whole, and the "
                         f"limit is {limit_seconds:g} s — cut it")
    return sr


def _read_frames(f, frames: int, block_seconds: float = BLOCK_SECONDS) -> np.ndarray:
    """Up to `frames` frames [n, channels] of an open SoundFile, a block at a time, so nothing
    is allocated for a length the header only claims (soundfile sizes a whole read by it). A
    header that says less than the file holds is read to what it says (soundfile reads no
    further where it can seek, as in a file or an upload), one that says more to `frames`."""
    blocksize = max(1, int(block_seconds * f.samplerate))
    blocks, n = [], 0
    while n < frames:
        block = f.read(min(blocksize, frames - n), dtype="float32", always_2d=True)
        if not len(block):
            break
        blocks.append(block)
        n += len(block)
    if len(blocks) == 1:
        return blocks[0]
    return np.concatenate(blocks) if blocks else np.zeros((0, f.channels), np.float32)


def read_audio_blocks(path: str | os.PathLike, *, block_seconds: float = BLOCK_SECONDS
                      ) -> tuple[Iterator[np.ndarray], int, int]:
    """A file read a block at a time, so an hour of audio never sits in memory:
    (blocks float32 [n, channels], sample_rate, frames per channel)."""
    import soundfile as sf

    path = _existing(path)
    try:
        with sf.SoundFile(str(path)) as f:
            sr, frames = _checked_header(f, str(path)), int(f.frames)
    except InputError:
        raise
    except Exception as e:
        raise _unreadable(str(path), e) from None
    blocksize = max(1, int(block_seconds * sr))
    return _blocks(path, blocksize), sr, frames


def _blocks(path: Path, blocksize: int) -> Iterator[np.ndarray]:
    import soundfile as sf

    try:
        yield from sf.blocks(str(path), blocksize=blocksize, dtype="float32", always_2d=True)
    except Exception as e:  # a file that breaks off mid-way
        raise _unreadable(str(path), e) from None


def _existing(path, name: str | None = None) -> Path:
    path = Path(path)
    if not path.is_file():
        raise InputError(f"{name or path}: no such file")
    return path


def _unreadable(name: str, e: Exception) -> InputError:
    reason = str(e).splitlines()[0] if str(e) else type(e).__name__
    if reason.startswith("Error opening "):   # libsndfile repeats the file (an upload's repr)
        reason = reason.rsplit(": ", 1)[-1]
    return InputError(f"{name}: cannot read audio ({reason}) — use a WAV or FLAC file")


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


def as_sample_rate(value, name: str = "sample_rate") -> int:
    """A sample rate as a positive whole number of Hz; 16000.5 is a mistake to report, not a
    rate to truncate."""
    return whole_number(value, name, 1)


def resample(x: np.ndarray, sr_from: int, sr_to: int) -> np.ndarray:
    """Polyphase resampling along time (scipy.signal.resample_poly); x [n, channels]."""
    sr_from, sr_to = as_sample_rate(sr_from), as_sample_rate(sr_to)
    if sr_from == sr_to:
        return x
    from scipy.signal import resample_poly

    g = gcd(sr_from, sr_to)
    return resample_poly(x, sr_to // g, sr_from // g, axis=0).astype(np.float32)


class StreamResampler:
    """`resample` over a signal that arrives in blocks, equal to resampling it whole.

    Each output sample of resample_poly depends on the inputs within its filter's reach, so a
    block is resampled with `margin` inputs of context on each side and only its own outputs are
    kept; block edges fall on multiples of `down` inputs, where input and output grids align."""

    def __init__(self, sr_from: int, sr_to: int):
        self.sr_from, self.sr_to = as_sample_rate(sr_from), as_sample_rate(sr_to)
        g = gcd(self.sr_from, self.sr_to)
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


def write_audio(path: str | os.PathLike, samples: np.ndarray, sample_rate: int, *,
                sample_format: str = DEFAULT_SAMPLE_FORMAT) -> Path:
    """Write [n, channels] float32 to .wav or .flac atomically, as `sample_format` (SAMPLE_FORMATS;
    FLAC holds integers only)."""
    path = Path(path)
    encoded = encode_file(samples, sample_rate, container_of(path, sample_format), sample_format)
    with atomic_output(path) as tmp:   # Python writes the bytes: see encode_file
        tmp.write_bytes(encoded)
    return path


def quantize(samples, sample_format: str) -> np.ndarray:
    """float samples → the values `sample_format` stores: int16, int32 holding 24-bit values (both
    clipped to [-1, 1] and rounded), or float32 unchanged."""
    if sample_format not in SAMPLE_FORMATS:
        raise InputError(f"unknown sample format {sample_format!r}; use one of "
                         f"{', '.join(SAMPLE_FORMATS)}")
    x = np.asarray(samples, dtype=np.float32)
    if sample_format == "f32":
        return x
    # in float64: a float32 product has 24 mantissa bits, too few to round to 24-bit steps
    q = np.round(np.clip(x, -1.0, 1.0).astype(np.float64) * _FULL_SCALE[sample_format])
    return q.astype(np.int16 if sample_format == "s16" else np.int32)


def container_of(path: str | os.PathLike, sample_format: str) -> str:
    """The soundfile format of an output path (by its suffix) that can hold `sample_format`."""
    path = Path(path)
    fmt = WRITE_FORMATS.get(path.suffix.lower())
    if fmt is None:
        raise InputError(f"{path}: unsupported output format {path.suffix!r}; use .wav or .flac")
    if fmt == "FLAC" and sample_format == "f32":
        raise InputError(f"{path}: FLAC stores integer samples; use sample format s16 or s24, or "
                         "a .wav file for f32")
    return fmt


def file_samples(samples, sample_format: str) -> tuple[np.ndarray, str]:
    """(array for soundfile, subtype) so that a file holds exactly the bytes `pcm_bytes` streams."""
    q = quantize(samples, sample_format)
    if sample_format == "s24":
        q = q << 8  # libsndfile scales int32 data to 24 bits by dropping the low byte
    return q, SAMPLE_FORMATS[sample_format]


def encode_file(samples, sample_rate: int, container: str, sample_format: str) -> bytes:
    """The whole WAV/FLAC file in memory. Encoding to memory and writing the bytes with Python
    makes a full disk an OSError: libsndfile's FLAC encoder ignores failed writes (a 16 KiB
    tmpfs kept a truncated FLAC and reported success)."""
    import soundfile as sf

    data, subtype = file_samples(samples, sample_format)
    buf = io.BytesIO()
    sf.write(buf, data, int(sample_rate), subtype=subtype, format=container)
    return buf.getvalue()


def pcm_bytes(samples, sample_format: str) -> bytes:
    """Interleaved little-endian samples of `sample_format` (s24: 3 bytes each)."""
    q = quantize(samples, sample_format)
    if sample_format == "s24":
        return q.astype("<i4").view(np.uint8).reshape(-1, 4)[:, :3].tobytes()
    return q.astype(q.dtype.newbyteorder("<"), copy=False).tobytes()


def wav_header(sample_rate: int, channels: int, sample_format: str, data_bytes: int) -> bytes:
    """The 44-byte canonical WAV header; data_bytes=STREAM_SIZE gives the streaming header (both
    sizes 0xFFFFFFFF, as ffmpeg writes to a pipe and streaming speech APIs send)."""
    import struct

    width = {"s16": 2, "s24": 3, "f32": 4}[sample_format]
    tag = 3 if sample_format == "f32" else 1  # WAVE_FORMAT_IEEE_FLOAT / WAVE_FORMAT_PCM
    riff = STREAM_SIZE if data_bytes > STREAM_SIZE - 36 else data_bytes + 36
    block = width * channels
    return (b"RIFF" + struct.pack("<I", riff) + b"WAVEfmt " +
            struct.pack("<IHHIIHH", 16, tag, channels, sample_rate, sample_rate * block, block,
                        8 * width) + b"data" + struct.pack("<I", min(data_bytes, STREAM_SIZE)))


class PcmStreamWriter:
    """Interleaved PCM to a binary stream as audio arrives: raw, or a WAV with the streaming
    header (`wav_header`). When the stream can seek (stdout redirected to a file), `close`
    writes the real sizes into the header, so the result is an ordinary WAV file."""

    def __init__(self, stream, sample_rate: int, channels: int, *, fmt: str = "wav",
                 sample_format: str = DEFAULT_SAMPLE_FORMAT):
        self.stream, self.sample_rate, self.channels, self.fmt = stream, sample_rate, channels, fmt
        self.sample_format = sample_format
        self._started = False
        self._header_at = None  # stream offset of the WAV header when it can be patched
        self._data_bytes = 0

    def _start(self) -> None:
        self._started = True
        if self.fmt == "wav":
            self._header_at = _patch_offset(self.stream)
            self.stream.write(wav_header(self.sample_rate, self.channels, self.sample_format,
                                         STREAM_SIZE))

    def write(self, samples: np.ndarray) -> None:
        if not self._started:
            self._start()
        data = pcm_bytes(samples, self.sample_format)
        self.stream.write(data)
        self._data_bytes += len(data)
        self.stream.flush()

    def close(self) -> None:
        if not self._started:  # no audio at all: still a valid, empty WAV
            self._start()
        if self._header_at is not None:
            end = self.stream.tell()
            self.stream.seek(self._header_at)
            self.stream.write(wav_header(self.sample_rate, self.channels, self.sample_format,
                                         self._data_bytes))
            self.stream.seek(end)
        self.stream.flush()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        if exc[0] is None:
            self.close()


def _patch_offset(stream) -> int | None:
    """Where the header will start if it can be rewritten later: the stream seeks and is not in
    append mode (where every write lands at the end); else None."""
    try:
        if not stream.seekable():
            return None
        import fcntl

        if fcntl.fcntl(stream.fileno(), fcntl.F_GETFL) & os.O_APPEND:
            return None
        return stream.tell()
    except (AttributeError, OSError, ValueError, ImportError):  # BytesIO, closed, not POSIX
        return None


def time_stretch(x: np.ndarray, rate: float, sample_rate: int) -> np.ndarray:
    """Change tempo by `rate` (> 1 faster) keeping pitch: a phase vocoder over 2048-sample
    frames (about 43 ms at 48 kHz), x [n, channels] → [round(n / rate), channels]. Any length
    works: the input gets a frame of silence after it, so audio shorter than a frame (a
    one-word answer) still fills whole frames, and the output is cut to the stretched length."""
    if rate == 1.0:
        return x
    if not 0.25 <= rate <= 4.0:
        raise InputError(f"speed must be between 0.25 and 4.0, got {rate}")
    from scipy.signal import istft, stft

    nfft = 2048 if sample_rate >= 16000 else 256
    hop = nfft // 4
    n_out = round(len(x) / rate)
    if n_out == 0:
        return np.zeros((0, x.shape[1]), np.float32)
    x = np.concatenate([x, np.zeros((nfft, x.shape[1]), x.dtype)])
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
    n = min(n_out, *(len(y) for y in out))
    return np.stack([y[:n] for y in out], axis=1).astype(np.float32)


def loudness_normalize(x: np.ndarray, *, target_dbfs: float = -20.0,
                       max_gain_db: float = 3.0) -> np.ndarray:
    """MOSS-TTS's reference loudness step (docs/upstream-notes.md §family-1.3): gain toward
    target_dbfs, clamped to ±max_gain_db, from dBFS = 10·log10(mean(x²) + 1e-9) over all samples."""
    dbfs = 10.0 * np.log10(float(np.mean(np.square(x, dtype=np.float64))) + 1e-9)
    gain_db = min(max(target_dbfs - dbfs, -max_gain_db), max_gain_db)
    return (x * np.float32(10.0 ** (gain_db / 20.0))).astype(np.float32)
