"""`SoundEffectV2TTS`: a described sound → 48 kHz mono audio with MOSS-SoundEffect v2.0, a
diffusion pipeline (docs/upstream-notes.md §family-10): the Qwen3 text encoder, the WAN audio
DiT denoising a latent over `steps` flow-match steps under classifier-free guidance, and the
DAC VAE decoding it. No codec: the VAE is in the model's GGUF.

Seeds: upstream draws the initial noise from torch's generator; here it is numpy's
`default_rng(seed).standard_normal`, so a seed gives the same sound on every run of this
package, but not upstream's sound for that seed (docs/upstream-notes.md §family-10.3).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import numpy as np

from ..errors import InputError
from ..ggml import get_backend
from ..sampling import DiffusionOptions
from .soundeffect_v2 import DEFAULT_STEPS, KIND, SoundEffectV2Model
from .tts import CodecTTS, FrameBudget, described_sound, family_stream

DEFAULT_SECONDS = 10.0      # MossSoundEffectPipeline.__call__'s
MAX_STEPS = 1000            # the scheduler's train steps: more would repeat timesteps


class SoundEffectV2TTS(CodecTTS):
    """MOSS-SoundEffect v2.0. `SoundEffectV2TTS.load("sfx-v2.gguf")`, then
    `synthesize(sound="rain on a tin roof", seconds=5, seed=1)` → (samples [n, 1], 48000).
    A CPU run takes minutes (100 steps of a 1.3B DiT over a 30 s latent): pass
    `progress=lambda done, total: ...` to follow the steps, or `short_latent=True` to denoise
    only the seconds asked (not upstream's audio; see `stream`).

    >>> tts = SoundEffectV2TTS.load("sfx-v2.gguf")                          # doctest: +SKIP
    >>> audio, sr = tts.synthesize(sound="rain on a tin roof", seconds=5, seed=1)  # doctest: +SKIP
    """

    FAMILY, NAME, OPTIONS = KIND, "MOSS-SoundEffect-v2.0", DiffusionOptions
    KEYWORDS = ("sound", "seconds", "steps", "negative", "short_latent")
    TEXT_FIELDS = ("sound", "negative")
    TEXT_OPTIONAL = True
    # one description, never cut into chunks (the encoder reads its first 512 tokens)
    MAX_TEXT_CHARS = 1024
    # the work a request asks for: its denoising steps (each one DiT pass over the pair)
    BUDGET = FrameBudget("steps", DEFAULT_STEPS, MAX_STEPS, "steps")
    # the `seconds` knob's bound before a model is loaded: upstream's window (model_index.json's
    # max_inference_seconds; a checkpoint with a shorter one says so when asked)
    MAX_SECONDS = 30
    CHANNELS = 1

    def __init__(self, model: SoundEffectV2Model):
        self.model = model
        self.codec = None

    @classmethod
    def load(cls, model, *, codec=None, backend=None,
             threads: int | None = None) -> "SoundEffectV2TTS":
        """model: a MOSS-SoundEffect v2.0 GGUF (`convert sfx-v2`). It decodes with its own
        VAE, so `codec` must be None."""
        if codec is not None:
            raise InputError(f"{cls.NAME} decodes with its own VAE: leave the codec out")
        return cls(SoundEffectV2Model.load(model, get_backend(backend, threads)))

    @property
    def sample_rate(self) -> int:
        return self.model.sampler.sample_rate

    def encode_reference(self, samples, sample_rate: int):
        raise InputError(f"{self.NAME} makes sounds from a description: it takes no reference")

    def noise(self, seconds: float, seed: int | None, *, short_latent: bool = False) -> np.ndarray:
        """The initial latent noise [in_dim, frames] from numpy's generator (a fresh seed when
        None): the whole window's, or with `short_latent` just the seconds'."""
        sampler = self.model.sampler
        shape = sampler.noise_shape(seconds if short_latent else None)
        return np.random.default_rng(seed).standard_normal(shape, dtype=np.float32)

    @family_stream
    def stream(self, text: str | None = None, *, sound: str | None = None,
               seconds: float = DEFAULT_SECONDS, negative: str = "",
               options: DiffusionOptions = DiffusionOptions(), seed: int | None = None,
               steps: int = DEFAULT_STEPS, short_latent: bool = False,
               progress: Callable[[int, int], None] | None = None) -> Iterator[np.ndarray]:
        """Audio chunks [m, 1] of the sound: an empty chunk after each denoising step (the
        caller gets its thread back while the steps run; `progress(done, total)` is called
        after each), then the decoded audio, 2 s of latent at a time. `short_latent`: denoise
        only the frames covering `seconds` instead of upstream's fixed window (the DiT's cost
        scales with the frames, so 5 s of a 30 s window is about 6× faster; the model was
        trained on the whole window, so the sound differs from upstream's for the same noise).
        """
        sound = described_sound(text, sound)      # short_latent: checked by the knob table
        sampler = self.model.sampler
        rounded = sampler.check_seconds(seconds)
        noise = self.noise(rounded, seed, short_latent=short_latent)
        pieces = sampler.sample(sound, rounded, noise, negative_prompt=negative or "",
                                steps=steps, cfg_scale=options.cfg_scale, shift=options.shift,
                                progress=progress)
        return (piece[:, None] for piece in pieces)
