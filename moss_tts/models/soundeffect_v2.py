"""MOSS-SoundEffect v2.0's sampling loop: prompt and given noise → waveform, through the text
encoder, the DiT and the DAC VAE decoder (upstream moss_soundeffect_v2/
pipeline_moss_soundeffect.py `MossSoundEffectPipeline.__call__` around diffsynth/pipelines/
wan_audio.py `WanAudioPipeline.__call__`; docs/upstream-notes.md §family-10.2-10.6).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Callable

import numpy as np

from ..errors import InputError
from ..ggml import Weights
from ..ggml.backend import NativeResource, released_on_error
from ..text.qwen_tokenizer import QwenTokenizer
from .soundeffect_v2_dit import WanAudioConfig, WanAudioDiT
from .soundeffect_v2_schedule import FlowMatchSchedule, guided_velocity
from .soundeffect_v2_text import (TextEncoder, TextEncoderConfig, duration_seconds,
                                  positive_prompt)
from .soundeffect_v2_vae import DACConfig, DACDecoder, tensor_shapes as vae_shapes

logger = logging.getLogger(__name__)

# the GGUF (converters/soundeffect_v2.py): one file holding the three components under their
# own names (text: llama.cpp's Qwen3 names; DiT: upstream's native names; VAE: upstream's with
# weight norm fused), each config under its prefix, and model_index.json's two rates
KIND = "sfx-v2"
FORMAT_VERSION = 1
TOKENIZER_KEY = "moss.tokenizer.json"
SAMPLE_RATE_KEY = "moss.soundeffect_v2.sample_rate"
MAX_SECONDS_KEY = "moss.soundeffect_v2.max_inference_seconds"

DEFAULT_STEPS = 100      # MossSoundEffectPipeline.__call__'s defaults
DEFAULT_CFG = 4.0
DEFAULT_SHIFT = 5.0
NO_GUIDANCE = 1.0        # at this CFG scale upstream skips the negative prompt entirely
# latent frames the VAE decodes at a time (2 s at 50 Hz; each chunk also decodes its receptive
# field on either side, DACConfig.context_frames)
VAE_CHUNK_FRAMES = 100


def output_samples(sample_rate: int, seconds: float) -> int:
    """The crop: int() of the float product, so int(48000·2.3) = 110399 (§family-10.3)."""
    return int(sample_rate * duration_seconds(seconds))


@dataclass(frozen=True)
class SoundEffectSampler:
    """The three loaded components and the checkpoint's rates (model_index.json); no state
    between calls, and closing the components is the owner's business.

    Upstream always denoises `max_inference_seconds` of latent whatever `seconds` asks, decodes
    all of it and crops afterwards (§family-10.3). It draws the noise with torch's generator,
    which a port cannot reproduce, so the caller hands the noise in (shape: `noise_shape()`).
    Upstream runs the DiT twice per step (cond, then uncond), and so does this (`velocity`).
    """

    text_encoder: TextEncoder
    dit: WanAudioDiT
    vae: DACDecoder
    sample_rate: int = 48000
    max_inference_seconds: int = 30

    def noise_shape(self, seconds: float | None = None) -> tuple[int, int]:
        """[in_dim, F]: the whole `max_inference_seconds` of latent frames, the samples floored
        to whole VAE hops (wan_audio.py's shape check, then its noise initializer). With
        `seconds` (not upstream's): the frames that cover those seconds' samples, rounded up."""
        if seconds is None:
            frames = self.sample_rate * self.max_inference_seconds // self.vae.config.hop_length
        else:
            frames = -(-output_samples(self.sample_rate, seconds) // self.vae.config.hop_length)
        return self.dit.cfg.in_dim, frames

    def check_seconds(self, seconds: float) -> float:
        """The seconds rounded as upstream rounds them, after its two ValueErrors."""
        rounded = duration_seconds(seconds)
        if not rounded > 0:
            raise InputError(f"seconds must be > 0 after rounding to 0.1, got {seconds!r}")
        if rounded > self.max_inference_seconds:
            raise InputError(f"seconds={rounded} exceeds max_inference_seconds="
                             f"{self.max_inference_seconds}")
        return rounded

    def check_request(self, seconds: float, noise: np.ndarray) -> float:
        """The rounded seconds (`check_seconds`) and the noise's shape: the whole window's,
        or just the seconds' (`noise_shape(seconds)`)."""
        rounded = self.check_seconds(seconds)
        if noise.shape not in (self.noise_shape(), self.noise_shape(rounded)):
            raise InputError(f"noise must have shape {self.noise_shape()} [in_dim, frames] "
                             f"(or {self.noise_shape(rounded)}: just the seconds asked), got "
                             f"{noise.shape}")
        if not np.all(np.isfinite(noise)):
            raise InputError("noise has non-finite values")
        return rounded

    def contexts(self, prompt: str, seconds: float, negative_prompt: str,
                 cfg_scale: float) -> np.ndarray:
        """(B, text_len, text_dim): the suffixed positive prompt, then (only when guiding) the
        negative prompt as given, without a suffix (§family-10.2)."""
        texts = [positive_prompt(prompt, seconds)]
        if cfg_scale != NO_GUIDANCE:
            texts.append(negative_prompt)
        return np.stack([self.text_encoder.context(t) for t in texts])

    def velocity(self, latent: np.ndarray, timestep, context: np.ndarray,
                 cfg_scale: float) -> np.ndarray:
        """The guided velocity (F, out_dim) at one step: the DiT on the cond, then the uncond
        context (both see the same latent), then v_u + cfg·(v_c − v_u). One pass each, not the
        pair as one batch of two (`WanAudioDiT.forward` takes either): at 1500 frames every
        matmul is compute-bound, so a batch reads no fewer bytes per FLOP, and ggml's GEMM ran
        the pair 1.04-1.18× slower than two single passes (docs/performance.md, MOSS-SoundEffect
        v2.0); one graph of batch 1 also halves the compute buffer."""
        v = [self.dit.forward(latent[None], timestep, c[None])[0] for c in context]
        return v[0] if len(context) == 1 else guided_velocity(v[0], v[1], cfg_scale)

    def __call__(self, prompt: str, seconds: float, noise, **kwargs) -> np.ndarray:
        """Waveform float32 (int(sample_rate·seconds),) in [−1, 1] from `noise` [in_dim, F]
        (`noise_shape()`): `sample`'s pieces joined. `progress(i, n)` is called after each
        of the n denoising steps."""
        return np.concatenate(list(self.sample(prompt, seconds, noise, **kwargs)))

    def sample(self, prompt: str, seconds: float, noise, *, negative_prompt: str = "",
               steps: int = DEFAULT_STEPS, cfg_scale: float = DEFAULT_CFG,
               shift: float = DEFAULT_SHIFT,
               progress: Callable[[int, int], None] | None = None):
        """The waveform in pieces: an empty piece after each denoising step (so a caller
        pulling several requests in turn gets its thread back: a CPU step takes seconds),
        then the audio as the VAE decodes it, VAE_CHUNK_FRAMES latent frames at a time,
        cropped to int(sample_rate·seconds) samples in all."""
        noise = np.asarray(noise, dtype=np.float32)
        seconds = self.check_request(seconds, noise)
        schedule = FlowMatchSchedule.make(steps, shift=shift)
        context = self.contexts(prompt, seconds, negative_prompt, cfg_scale)
        latent = np.ascontiguousarray(noise.T)                 # (F, in_dim): the port's layout
        for i, timestep in enumerate(schedule.timesteps):
            v = self.velocity(latent, timestep, context, cfg_scale)
            latent = schedule.euler_step(latent, v, i)
            logger.debug("soundeffect_v2 step %d/%d at t=%.3f", i + 1, schedule.steps, timestep)
            if progress is not None:
                progress(i + 1, schedule.steps)
            yield np.zeros(0, np.float32)
        # the latent decoded up to the crop (upstream decodes all of it: the frames past the
        # crop cannot change the samples before it beyond the receptive field, which the
        # chunks carry), in chunks so the compute buffer holds VAE_CHUNK_FRAMES frames of
        # activations, not 30 s of them
        left = output_samples(self.sample_rate, seconds)
        for piece in self.vae.decode_chunks(latent, chunk_frames=VAE_CHUNK_FRAMES):
            yield piece[:left]
            left -= len(piece)
            if left <= 0:       # the chunks past the crop are never decoded
                break


class SoundEffectV2Model(NativeResource):
    """The three components over one loaded GGUF (converters/soundeffect_v2.py) and its
    sampler; stateless after load (style C16)."""

    def __init__(self, weights: Weights):
        self.weights = weights
        self.dit = self.vae = None
        with released_on_error(self):
            meta = weights.file
            meta.check_kind(KIND, version=FORMAT_VERSION)
            text = TextEncoderConfig.from_gguf(meta)
            dit, vae = WanAudioConfig.from_gguf(meta), DACConfig.from_gguf(meta)
            # every component's tensors at once: one error lists all problems, extras included
            shapes = text.tensor_shapes() | dit.tensor_shapes() | vae_shapes(vae)
            weights.require(shapes, floats=True)
            self.text = TextEncoder(weights, QwenTokenizer.from_json(meta.text(TOKENIZER_KEY)),
                                    alone=False)
            self.dit = WanAudioDiT(weights, dit, weights.backend)
            self.vae = DACDecoder(weights, vae)
            self.sampler = SoundEffectSampler(self.text, self.dit, self.vae,
                                              sample_rate=meta.integer(SAMPLE_RATE_KEY),
                                              max_inference_seconds=meta.integer(MAX_SECONDS_KEY))

    @classmethod
    def load(cls, path, backend=None) -> "SoundEffectV2Model":
        weights = Weights.load(path, backend)
        with released_on_error(weights):
            return cls(weights)

    def close(self) -> None:
        # the text encoder holds no graph of its own; the weights are shared, closed once
        for part in (self.dit, self.vae, self.weights):
            if part is not None:
                part.close()
        self.dit = self.vae = self.weights = None
