"""Audio encodings of the speech server: whole responses (wav, flac, mp3, opus, aac, pcm), streams
(raw pcm, a streamable wav, SSE events of base64 pcm), and the PCM layout OpenAI clients expect
(24 kHz mono s16le).
"""

from __future__ import annotations

import base64
import io
import json
import struct

import numpy as np

from .. import audio
from ..audio import STREAM_SIZE, StreamResampler, resample, to_channels, wav_header
from ..errors import InputError

FORMATS = ("mp3", "opus", "aac", "flac", "wav", "pcm")
MEDIA_TYPES = {"mp3": "audio/mpeg", "opus": "audio/ogg", "aac": "audio/aac", "flac": "audio/flac",
               "wav": "audio/wav",
               # little-endian, as OpenAI clients read it: audio/L16 would mean big-endian
               # (RFC 2586), so the layout travels in X-Audio-Sample-Rate / X-Audio-Channels
               "pcm": "audio/pcm"}
STREAMED_FORMATS = ("wav", "pcm")     # a whole-file encoder cannot emit audio as it arrives
OPENAI_PCM_RATE = 24000
# The encoders take only these rates (MPEG-1/2/2.5 layer III, Opus, AAC-LC); other rates are
# resampled up to the next one.
ENCODER_RATES = {"mp3": (8000, 11025, 12000, 16000, 22050, 24000, 32000, 44100, 48000),
                 "opus": (8000, 12000, 16000, 24000, 48000),
                 "aac": (8000, 11025, 12000, 16000, 22050, 24000, 32000, 44100, 48000)}


def pcm_bytes(samples: np.ndarray) -> bytes:
    """Interleaved s16le, the bytes the CLI streams."""
    return audio.pcm_bytes(samples, "s16")


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
    return wav_header(rate, channels, "s16", STREAM_SIZE)


class PcmLayout:
    """Native audio chunks → s16le bytes in the requested layout: 'native' keeps the model's rate
    and channels, 'openai' is 24 kHz mono (OpenAI's pcm)."""

    def __init__(self, layout: str, native_rate: int, native_channels: int):
        if layout not in ("openai", "native"):
            raise InputError(f"pcm_layout must be 'openai' or 'native', got {layout!r}")
        self.mono = layout == "openai"
        self.rate = OPENAI_PCM_RATE if self.mono else native_rate
        self.channels = 1 if self.mono else native_channels
        self._resampler = StreamResampler(native_rate, self.rate)

    def push(self, chunk: np.ndarray) -> bytes:
        return pcm_bytes(self._resampler.push(to_channels(chunk, self.channels)))

    def flush(self) -> bytes:
        return pcm_bytes(self._resampler.flush())


def sse_event(event: dict, name: str | None = None) -> bytes:
    """One server-sent event: its JSON data line, after an `event:` line when named."""
    head = f"event: {name}\n" if name else ""
    return f"{head}data: {json.dumps(event)}\n\n".encode()


class StreamEncoder:
    """Native audio chunks → the bytes of one streamed response: SSE events of base64 pcm, raw
    pcm, or a streamable WAV (header first, then native s16le)."""

    def __init__(self, stream_format: str, fmt: str, pcm_layout: str, rate: int, channels: int):
        self.sse = stream_format == "sse"
        self.layout = PcmLayout("native" if fmt == "wav" else pcm_layout, rate, channels)
        self.header = wav_stream_header(self.layout.rate, self.layout.channels) \
            if fmt == "wav" else b""
        self.media_type = "text/event-stream" if self.sse else MEDIA_TYPES[fmt]

    def _wrap(self, pcm: bytes) -> bytes:
        if not self.sse:
            return pcm
        if not pcm:
            return b""
        return sse_event({"type": "speech.audio.delta", "audio": base64.b64encode(pcm).decode()})

    def chunk(self, audio: np.ndarray) -> bytes:
        head, self.header = self.header, b""
        return head + self._wrap(self.layout.push(audio))

    def progress(self, done: int, total: int) -> bytes:
        """A `speech.progress` event (SSE only: raw audio has no place for one)."""
        if not self.sse:
            return b""
        return sse_event({"type": "speech.progress", "done": done, "total": total})

    def end(self) -> bytes:
        tail = self.header + self._wrap(self.layout.flush())
        if self.sse:
            tail += sse_event({"type": "speech.audio.done"})
        return tail

    def error(self, message: str) -> bytes | None:
        """The SSE error event; None for raw audio, which can only end abruptly."""
        if not self.sse:
            return None
        return sse_event({"type": "error", "error": {"message": message}}, name="error")
