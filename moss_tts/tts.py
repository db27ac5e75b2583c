"""The protocol every TTS family offers (the CLI and the server use only this): its output
format, references encoded once and reused, and speech as a whole or as it is made."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import numpy as np

from .audio import as_sample_rate, as_samples, trim_reference
from .errors import InputError, ModelFileError
from .ggml.backend import NativeResource, released_on_error


@dataclass(frozen=True)
class Reference:
    """A voice: the codec codes [frames, n_vq] of reference speech."""

    codes: np.ndarray


@runtime_checkable
class TTS(Protocol):
    @property
    def sample_rate(self) -> int: ...

    @property
    def channels(self) -> int: ...

    def encode_reference(self, samples, sample_rate: int):
        """Reference speech → the family's reference object (its codec codes)."""

    def synthesize(self, text: str, **options) -> tuple[np.ndarray, int]:
        """Text → (float32 samples [n, channels], sample_rate)."""

    def stream(self, text: str, **options) -> Iterator[np.ndarray]:
        """Text → float32 chunks [m, channels] as they are generated; concatenated they equal
        `synthesize` for the same options and seed."""


class CodecTTS(NativeResource):
    """What every family's TTS object shares around its `stream`: `synthesize` as the
    concatenated stream, the codec check, and closing the model and the codec it owns."""

    CODEC_NAME = "codec"      # what `_need_codec` asks for, e.g. "the MOSS-Audio-Tokenizer GGUF"
    FAMILY = NAME = ""        # the GGUF kind ("nano") and the name people know ("MOSS-TTS-Nano")
    OPTIONS: type = object    # the family's sampling dataclass: its defaults are the only ones
    PROMPT_FIELDS: tuple[str, ...] = ()   # prompt keywords of `stream` (instruction, language, ...)
    CHANNELS = 1              # of the audio `stream` yields
    model = codec = None

    @property
    def sample_rate(self) -> int:
        return self.config.sampling_rate      # upstream's config field of the Qwen3 families

    @property
    def channels(self) -> int:
        return self.CHANNELS

    def stream(self, text: str, **options) -> Iterator[np.ndarray]:
        raise NotImplementedError

    def synthesize(self, text: str, **kwargs) -> tuple[np.ndarray, int]:
        """Text → (samples float32 [n, channels], sample_rate). Same options as `stream`."""
        parts = list(self.stream(text, **kwargs))
        audio = np.concatenate(parts) if parts else np.zeros((0, self.channels), np.float32)
        return audio, self.sample_rate

    @classmethod
    def _with_codec(cls, model, codec, backend):
        """cls(model, codec), loading `codec` when it is a path; a codec that fails to load or to
        fit frees the model (and the codec loaded here)."""
        from .codec import Codec

        with released_on_error(model):
            owned = Codec.load(codec, backend=backend) if codec is not None \
                and not isinstance(codec, Codec) else None
            with released_on_error(owned):
                return cls(model, owned or codec)

    def _check_codec(self, codec) -> None:
        """The codec must have the model's rate, channels and codebooks."""
        c, layout = self.config, {1: "mono", 2: "stereo"}.get(self.channels, "")
        problems = []
        if codec.channels != self.channels or codec.sample_rate != self.sample_rate:
            problems.append(f"it is {codec.sample_rate} Hz x {codec.channels} channel(s), the "
                            f"model needs {self.sample_rate} Hz {layout}")
        # a config whose audio vocabulary holds more than the codes (Realtime's pad, BOS and
        # EOS) names its codebook size
        size = getattr(c, "codebook_size", c.audio_vocab_size)
        if codec.n_quantizers < c.n_vq or codec.config.codebook_size != size:
            problems.append(f"it has {codec.n_quantizers} codebooks of "
                            f"{codec.config.codebook_size}, the model needs {c.n_vq} of {size}")
        if problems:
            raise ModelFileError("mismatched codec: " + "; ".join(problems) +
                                 f" — pass {self.CODEC_NAME}")

    @staticmethod
    def _reference_audio(samples, sample_rate, max_seconds) -> tuple[np.ndarray, int]:
        """Reference speech as float32 [n, channels] at a checked rate, cut to its first
        max_seconds with a warning (None keeps it all: a continuation prompt must match its
        text)."""
        x, sample_rate = as_samples(samples, what="reference audio"), as_sample_rate(sample_rate)
        return (x if max_seconds is None else trim_reference(x, sample_rate, max_seconds),
                sample_rate)

    def voice(self, name: str, *, root=None) -> Reference:
        """A stored voice (`voice add`, or an upload to the server) as this model's reference;
        a voice made with another codec is refused by name, never used as noise."""
        from .voices import codec_problem, load_voice

        codes, info = load_voice(name, root=root)
        problem = codec_problem(info, self._need_codec())
        if problem is None and codes.shape[1] < self.config.n_vq:
            problem = f"it has {codes.shape[1]} codebooks, the model needs {self.config.n_vq}"
        if problem:
            raise InputError(f"voice {name!r} does not fit this model: {problem} — add it again "
                             f"with `python -m moss_tts voice add {name} REF.wav --codec CODEC "
                             "--force` using this model's codec")
        return Reference(codes[:, : self.config.n_vq])

    def _need_codec(self):
        if self.codec is None:
            raise InputError(f"no codec loaded: pass codec=... ({self.CODEC_NAME})")
        return self.codec

    def close(self) -> None:
        if self.codec is not None:
            self.codec.close()
            self.codec = None
        if self.model is not None:
            self.model.close()
            self.model = None
