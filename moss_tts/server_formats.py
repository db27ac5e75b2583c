"""Audio encodings of the speech server: whole responses (wav, flac, mp3, opus, aac, pcm), streams
(raw pcm and a streamable wav), and the PCM layout OpenAI clients expect (24 kHz mono s16le).
"""

from __future__ import annotations

import io
import struct
from math import gcd

import numpy as np

from .audio import PcmStreamWriter, resample, to_channels
from .errors import InputError

FORMATS = ("mp3", "opus", "aac", "flac", "wav", "pcm")
MEDIA_TYPES = {"mp3": "audio/mpeg", "opus": "audio/ogg", "aac": "audio/aac", "flac": "audio/flac",
               "wav": "audio/wav",
               # little-endian, as OpenAI clients read it: audio/L16 would mean big-endian
               # (RFC 2586), so the layout travels in X-Audio-Sample-Rate / X-Audio-Channels
               "pcm": "audio/pcm"}
STREAMED_FORMATS = ("wav", "pcm")     # a whole-file encoder cannot emit audio as it arrives
OPENAI_PCM_RATE = 24000
INPUT_BLOCK = 8192       # samples resampled at once: the working set stays in cache
# The encoders take only these rates (MPEG-1/2/2.5 layer III, Opus, AAC-LC); other rates are
# resampled up to the next one.
ENCODER_RATES = {"mp3": (8000, 11025, 12000, 16000, 22050, 24000, 32000, 44100, 48000),
                 "opus": (8000, 12000, 16000, 24000, 48000),
                 "aac": (8000, 11025, 12000, 16000, 22050, 24000, 32000, 44100, 48000)}


def pcm_bytes(samples: np.ndarray) -> bytes:
    """Interleaved s16le."""
    return np.round(np.clip(samples, -1.0, 1.0) * 32767.0).astype("<i2").tobytes()


def format_problem(fmt: str) -> str | None:
    """Why this installation cannot encode `fmt`, or None when it can."""
    if fmt == "aac":
        try:
            import av  # noqa: F401  (PyAV, the optional `aac` extra)
        except ImportError:
            return "response_format 'aac' needs the optional PyAV package (pip install av); " \
                   "mp3 and opus work without it"
        return None
    if fmt in ("mp3", "opus"):
        import soundfile as sf

        container, subtype = ("MP3", "MPEG_LAYER_III") if fmt == "mp3" else ("OGG", "OPUS")
        if subtype not in sf.available_subtypes(container):
            return (f"response_format {fmt!r} needs libsndfile >= 1.1 (this soundfile has "
                    f"{sf.__libsndfile_version__}); use wav or flac")
    return None


def _encoder_rate(fmt: str, rate: int) -> int:
    allowed = ENCODER_RATES[fmt]
    return next((r for r in allowed if r >= rate), allowed[-1])


def float_wav(samples: np.ndarray, rate: int) -> bytes:
    """32-bit float WAV with a fixed header. libsndfile's float WAV carries a PEAK chunk with a
    timestamp, so the same audio would give different bytes from one second to the next."""
    data = np.ascontiguousarray(samples, "<f4")
    channels, size = data.shape[1], data.nbytes
    fmt = struct.pack("<HHIIHHH", 3, channels, rate, rate * 4 * channels, 4 * channels, 32, 0)
    fact = struct.pack("<I", data.shape[0])   # non-PCM WAV: the frame count
    return (b"RIFF" + struct.pack("<I", 4 + 8 + len(fmt) + 8 + len(fact) + 8 + size) + b"WAVE"
            + b"fmt " + struct.pack("<I", len(fmt)) + fmt + b"fact" + struct.pack("<I", len(fact))
            + fact + b"data" + struct.pack("<I", size) + data.tobytes())


def _encode_aac(samples: np.ndarray, rate: int) -> bytes:
    import av

    buf = io.BytesIO()
    with av.open(buf, "w", format="adts") as out:
        layout = "stereo" if samples.shape[1] == 2 else "mono"
        stream = out.add_stream("aac", rate=rate, layout=layout)
        frame = av.AudioFrame.from_ndarray(np.ascontiguousarray(samples.T, np.float32),
                                           format="fltp", layout=layout)
        frame.sample_rate = rate
        for packet in stream.encode(frame):
            out.mux(packet)
        for packet in stream.encode(None):
            out.mux(packet)
    return buf.getvalue()


def encode_audio(samples: np.ndarray, rate: int, fmt: str) -> bytes:
    """A whole response: WAV float32, FLAC 24-bit, mp3, Ogg Opus, AAC (ADTS), or raw s16le."""
    import soundfile as sf

    if fmt == "pcm":
        return pcm_bytes(samples)
    if fmt == "wav":
        return float_wav(samples, rate)
    if fmt in ENCODER_RATES:
        target = _encoder_rate(fmt, rate)
        samples, rate = resample(samples, rate, target), target
    if fmt == "aac":
        return _encode_aac(samples, rate)
    container, subtype = {"flac": ("FLAC", "PCM_24"), "mp3": ("MP3", "MPEG_LAYER_III"),
                          "opus": ("OGG", "OPUS")}[fmt]
    # integer and perceptual codecs clip past full scale
    data = np.clip(np.asarray(samples, np.float32), -1.0, 1.0)
    buf = io.BytesIO()
    sf.write(buf, data, rate, format=container, subtype=subtype)
    return buf.getvalue()


def wav_stream_header(rate: int, channels: int) -> bytes:
    """The header of a streamed s16 WAV: RIFF and data sizes at their maximum (0xFFFFFFFF),
    as the length is unknown while streaming; players read on until the connection ends."""
    sink = io.BytesIO()
    with PcmStreamWriter(sink, rate, channels, fmt="wav"):
        pass
    return sink.getvalue()


class StreamResampler:
    """Polyphase resampling chunk by chunk, equal to `scipy.signal.resample_poly` over the whole
    signal (same Kaiser FIR) however the input is cut.
    x [n, channels] → [≈ n·to/from, channels].

    Output n is sum_i x[i]·h[n·down + half − i·up]: a dot product of the last `taps` inputs
    with one of `up` filter phases, so only `taps` input samples are kept between chunks.
    """

    def __init__(self, rate_from: int, rate_to: int, channels: int):
        from scipy.signal import firwin

        g = gcd(rate_from, rate_to)
        self.up, self.down = rate_to // g, rate_from // g
        self.identity = self.up == self.down == 1    # resample_poly returns the input as is
        self.history = np.zeros((0, channels))
        if self.identity:
            return
        max_rate = max(self.up, self.down)
        self.half = 10 * max_rate                    # scipy's resample_poly filter design
        h = firwin(2 * self.half + 1, 1.0 / max_rate, window=("kaiser", 5.0)) * self.up
        self.taps = -(-len(h) // self.up)
        padded = np.zeros(self.taps * self.up)
        padded[: len(h)] = h
        # phases[p, k] = h[p + k·up]: the taps that meet x[i0 − k] for phase p
        self.phases = padded.reshape(self.taps, self.up).T
        self.history = np.zeros((self.taps - 1, channels))   # x[-taps+1 .. -1] = 0
        self.n_in = 0      # input samples received
        self.n_out = 0     # output samples produced

    def _produce(self, x: np.ndarray, until: int) -> np.ndarray:
        """Outputs n_out .. until-1 from x, the last len(x) inputs (history, then new input).

        Outputs n, n + up, n + 2·up, ... share a filter phase and read inputs `down` apart, so
        each such run is `taps` multiply-adds over strided views, summed in a fixed order (the
        result does not depend on how the input was cut)."""
        first = self.n_in - len(x)                   # the input index of x[0]
        out = np.empty((max(0, until - self.n_out), x.shape[1]))
        for r in range(min(self.up, len(out))):
            count = len(range(self.n_out + r, until, self.up))
            pos = (self.n_out + r) * self.down + self.half
            newest, phase = pos // self.up - first, pos % self.up
            acc = np.zeros((count, x.shape[1]))
            for k in range(self.taps):
                start = newest - k
                acc += self.phases[phase, k] * x[start: start + (count - 1) * self.down + 1:
                                                 self.down]
            out[r::self.up] = acc
        self.n_out = max(self.n_out, until)
        return out.astype(np.float32)

    def push(self, chunk: np.ndarray) -> np.ndarray:
        """The outputs whose inputs have all arrived."""
        if self.identity:
            return chunk.astype(np.float32)
        if len(chunk) > INPUT_BLOCK:   # cache-sized pieces; cutting never changes the result
            return np.concatenate([self.push(chunk[i: i + INPUT_BLOCK])
                                   for i in range(0, len(chunk), INPUT_BLOCK)])
        x = np.concatenate([self.history, chunk.astype(np.float64)])
        self.n_in += len(chunk)
        # output n is complete once its newest input (n·down + half) // up has arrived
        ready = max(self.n_out, -(-(self.n_in * self.up - self.half) // self.down))
        out = self._produce(x, ready)
        self.history = x[len(x) - (self.taps - 1):]
        return out

    def flush(self) -> np.ndarray:
        """The remaining outputs, with zeros after the end (resample_poly's length)."""
        if self.identity:
            return np.zeros((0, self.history.shape[1]), np.float32)
        total = -(-self.n_in * self.up // self.down)
        pad = np.zeros((self.taps, self.history.shape[1]))
        x = np.concatenate([self.history, pad])
        self.n_in += self.taps
        out = self._produce(x, total)
        self.n_in -= self.taps
        return out


class PcmLayout:
    """Native audio chunks → s16le bytes in the requested layout: 'native' keeps the model's rate
    and channels, 'openai' is 24 kHz mono (OpenAI's pcm)."""

    def __init__(self, layout: str, native_rate: int, native_channels: int):
        if layout not in ("openai", "native"):
            raise InputError(f"pcm_layout must be 'openai' or 'native', got {layout!r}")
        self.mono = layout == "openai"
        self.rate = OPENAI_PCM_RATE if self.mono else native_rate
        self.channels = 1 if self.mono else native_channels
        self._resampler = StreamResampler(native_rate, self.rate, self.channels)

    def push(self, chunk: np.ndarray) -> bytes:
        return pcm_bytes(self._resampler.push(to_channels(chunk, self.channels)))

    def flush(self) -> bytes:
        return pcm_bytes(self._resampler.flush())
