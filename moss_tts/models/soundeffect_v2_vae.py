"""MOSS-SoundEffect v2.0's DAC VAE decoder as ggml graphs: latent frames → mono audio (upstream
moss_soundeffect_v2/diffsynth/models/dac_vae.py, continuous variant: DAC.decode :947-953, Decoder
:772-801, DecoderBlock :750-769, ResidualUnit :680-696, Snake :316-333).

A convolution is one matmul per tap over a shifted view of its input (activations [C, T],
channels fastest), so conv weights are stored tap by tap: see `conv_taps`, `conv_transpose_rows`.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, fields

import numpy as np

from ..errors import ConfigError, InputError, ModelFileError
from ..ggml import Graph, ops
from ..ggml.backend import NativeResource
from ..ggml.graph import Tensor
from .spec import config_from_gguf, config_to_metadata

logger = logging.getLogger(__name__)

KERNEL = 7                 # every WNConv1d of the decoder but the 1×1s (dac_vae.py:684, :779)
DILATIONS = (1, 3, 9)      # the three residual units of each block (dac_vae.py:766-768)
SNAKE_EPS = 1e-9           # dac_vae.py:320
# DAC constructor kwargs that only the discrete (RVQ) variant reads: accepted and ignored
QUANTIZER_KWARGS = ("n_codebooks", "codebook_size", "codebook_dim", "quantizer_dropout")
PREFIX = "moss.soundeffect_v2.vae"      # its GGUF metadata keys


def whole_numbers(values) -> tuple:
    """A config's list (JSON's, or a GGUF array's numpy integers) as a tuple of Python ints;
    anything else is kept for the config's own check to refuse."""
    return tuple(int(v) if isinstance(v, (int, np.integer)) and not isinstance(v, bool) else v
                 for v in values)


@dataclass(frozen=True)
class DACConfig:
    """The DAC constructor's kwargs (the .pth's `metadata.kwargs`); defaults are upstream's."""

    encoder_dim: int = 64
    encoder_rates: tuple[int, ...] = (2, 4, 8, 8)
    latent_dim: int | None = None     # None: encoder_dim · 2^len(encoder_rates), as upstream
    decoder_dim: int = 1536
    decoder_rates: tuple[int, ...] = (8, 8, 4, 2)
    sample_rate: int = 44100
    continuous: bool = False

    def __post_init__(self):
        object.__setattr__(self, "encoder_rates", whole_numbers(self.encoder_rates))
        object.__setattr__(self, "decoder_rates", whole_numbers(self.decoder_rates))
        if self.latent_dim is None:
            object.__setattr__(self, "latent_dim",
                               self.encoder_dim * 2 ** len(self.encoder_rates))
        sizes = (self.encoder_dim, self.latent_dim, self.decoder_dim, self.sample_rate,
                 *self.encoder_rates, *self.decoder_rates)
        if not all(isinstance(v, int) and v > 0 for v in sizes) or not self.decoder_rates:
            raise ConfigError(f"DAC: sizes and rates must be positive integers, got {self}")
        if not self.continuous:
            raise ConfigError("DAC: only the continuous VAE (continuous=True) decodes latents; "
                              "this one quantizes with RVQ codebooks")
        if self.decoder_dim % 2 ** len(self.decoder_rates):
            raise ConfigError(f"DAC: decoder_dim {self.decoder_dim} must halve "
                              f"{len(self.decoder_rates)} times (one per decoder rate)")

    @classmethod
    def from_kwargs(cls, kwargs: dict) -> "DACConfig":
        """From the checkpoint's `metadata.kwargs`. A key DAC's constructor does not take is
        dropped, as audiotools' BaseModel.load drops it, and said in a warning (C21)."""
        if not isinstance(kwargs, dict):
            raise ConfigError(f"DAC kwargs must be a mapping, got {type(kwargs).__name__}")
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(kwargs) - known - set(QUANTIZER_KWARGS))
        if unknown:
            logger.warning("DAC kwargs: %s not DAC constructor arguments; dropped as upstream's "
                           "loader drops them", ", ".join(map(str, unknown)))
        return cls(**{k: v for k, v in kwargs.items() if k in known})

    @classmethod
    def from_gguf(cls, meta) -> "DACConfig":
        return config_from_gguf(cls, meta, PREFIX)

    def to_metadata(self) -> dict:
        return config_to_metadata(self, PREFIX)

    @property
    def hop_length(self) -> int:
        """Samples per latent frame as upstream counts them: the encoder's (dac_vae.py:833)."""
        return math.prod(self.encoder_rates)

    @property
    def upsampling(self) -> int:
        """Samples the decoder makes per latent frame (equal to hop_length in a sane checkpoint)."""
        return math.prod(self.decoder_rates)

    def channels(self, i: int) -> int:
        """Channels after decoder block i (block −1: the first conv)."""
        return self.decoder_dim // 2 ** (i + 1)

    @property
    def context_frames(self) -> int:
        """Latent frames on each side that a frame's samples may depend on (an upper bound of
        the decoder's receptive field, in latent frames, rounded up): the first k-7 conv's 3
        frames; per block, the transposed conv's one input sample and the residual units'
        3·(1 + 3 + 9) samples at its output rate; the last k-7 conv's 3 samples."""
        field, rate = 3.0, 1
        for s in self.decoder_rates:
            field += 1 / rate + 3 * sum(DILATIONS) / (rate * s)
            rate *= s
        return math.ceil(field + 3 / rate)


# -- weights ---------------------------------------------------------------------------------------
def conv_taps(weight: np.ndarray) -> np.ndarray:
    """A fused Conv1d weight (out, in, k) → (k, out, in): tap j is a Linear weight of its own."""
    return np.ascontiguousarray(weight.transpose(2, 0, 1))


def conv_transpose_rows(weight: np.ndarray) -> np.ndarray:
    """A fused ConvTranspose1d weight (in, out, k) → (k·out, in): row j·out + o is what input
    frame t adds to output sample t·stride + j − padding, channel o."""
    in_ch, out_ch, k = weight.shape
    return np.ascontiguousarray(weight.transpose(2, 1, 0).reshape(k * out_ch, in_ch))


def _unit_shapes(p: str, c: int) -> dict:
    return {p + "block.0.alpha": (c,), p + "block.1.weight": (KERNEL, c, c),
            p + "block.1.bias": (c,), p + "block.2.alpha": (c,), p + "block.3.weight": (1, c, c),
            p + "block.3.bias": (c,)}


def tensor_shapes(cfg: DACConfig) -> dict[str, tuple]:
    """Every decoder tensor, upstream name with weight norm fused (`.weight` from `weight_g` /
    `weight_v`), numpy shape in the tap-by-tap layout (conv_taps, conv_transpose_rows)."""
    z, d, n = cfg.latent_dim, cfg.decoder_dim, len(cfg.decoder_rates)
    shapes = {"post_quant_conv.weight": (1, z, z), "post_quant_conv.bias": (z,),
              "decoder.model.0.weight": (KERNEL, d, z), "decoder.model.0.bias": (d,)}
    for i, s in enumerate(cfg.decoder_rates):
        p, c_in, c_out = f"decoder.model.{i + 1}.block.", cfg.channels(i - 1), cfg.channels(i)
        shapes |= {p + "0.alpha": (c_in,), p + "1.weight": (2 * s * c_out, c_in),
                   p + "1.bias": (c_out,)}
        for u in range(len(DILATIONS)):
            shapes |= _unit_shapes(f"{p}{u + 2}.", c_out)
    c = cfg.channels(n - 1)
    return shapes | {f"decoder.model.{n + 1}.alpha": (c,),
                     f"decoder.model.{n + 2}.weight": (KERNEL, 1, c),
                     f"decoder.model.{n + 2}.bias": (1,)}


def check_weights(weights, cfg: DACConfig) -> dict[str, Tensor]:
    """The decoder's tensors by name; every missing or misshapen one in one ModelFileError."""
    problems, out = [], {}
    for name, shape in tensor_shapes(cfg).items():
        try:
            t = weights[name]
        except (KeyError, ModelFileError):
            problems.append(f"{name}: missing (expected {shape})")
            continue
        want = tuple(reversed(shape)) + (1,) * (4 - len(shape))
        if tuple(t.ne) != want:
            problems.append(f"{name}: expected shape {shape}, got {tuple(reversed(t.ne))}")
        out[name] = t
    if problems:
        raise ModelFileError(f"DAC decoder: {len(problems)} tensor problem(s): "
                             + "; ".join(problems[:20]))
    return out


# -- graph builders --------------------------------------------------------------------------------
def snake(x: Tensor, alpha: Tensor) -> Tensor:
    """x + sin²(α·x) / (α + 1e-9), α per channel; x [C, T]."""
    alpha_eps = ops.scale_bias(ops.view(alpha, alpha.ne, graph=x.graph), 1.0, SNAKE_EPS)
    return x + ops.div(ops.sqr(ops.sin(x * alpha)), alpha_eps)


def conv1d(x: Tensor, weight: Tensor, bias: Tensor, *, dilation: int = 1) -> Tensor:
    """'Same' Conv1d (padding dilation·(k−1)/2, stride 1): x [Cin, T] → [Cout, T];
    weight [Cin, Cout, k] (conv_taps)."""
    c_in, t = x.ne[0], x.ne[1]
    c_out, k = weight.ne[1], weight.ne[2]
    pad = dilation * (k - 1) // 2
    xp = ops.pad(x, (0, 0), (pad, pad)) if pad else x             # [Cin, T + 2·pad]
    y = None
    for j in range(k):   # Σ_j W_j · x[t + j·dilation − pad]: tap j reads a shifted window
        w_j = ops.view(weight, (c_in, c_out), (weight.nb[1],), j * weight.nb[2], graph=x.graph)
        x_j = ops.view(xp, (c_in, t), (xp.nb[1],), j * dilation * xp.nb[1])
        y_j = ops.mul_mat(w_j, x_j)                                 # [Cout, T]
        y = y_j if y is None else y + y_j
    return ops.add(y, bias)


def conv_transpose1d(x: Tensor, weight: Tensor, bias: Tensor, *, stride: int) -> Tensor:
    """DAC's upsampling ConvTranspose1d (kernel 2s, padding ⌈s/2⌉, output_padding s mod 2):
    x [Cin, L] → [Cout, L·s]; weight [Cin, 2s·Cout] (conv_transpose_rows)."""
    c_out, n_in = bias.ne[0], x.ne[1]
    y = ops.mul_mat(weight, x)                     # [2s·Cout, L]: tap-major per input frame
    # taps j < s land in the input frame's own output slot (t·s + j), taps j ≥ s in the next
    # one's ((t+1)·s + j − s); each half, laid out [Cout, s, L], is already time-major samples
    half = stride * c_out
    halves = [ops.reshape(ops.cont(ops.view(y, (half, n_in), (y.nb[1],), h * half * y.nb[0])),
                          c_out, stride * n_in) for h in (0, 1)]
    full = ops.pad(halves[0], (0, 0), (0, stride)) + ops.pad(halves[1], (0, 0), (stride, 0))
    # full is [Cout, (L+1)·s]; the output is samples ⌈s/2⌉ … ⌈s/2⌉ + L·s − 1 of it (for odd s
    # output_padding 1 keeps exactly L·s: (L−1)s − 2⌈s/2⌉ + 2s + 1 = L·s)
    out = ops.view(full, (c_out, stride * n_in), (full.nb[1],), math.ceil(stride / 2) * full.nb[1])
    return ops.add(ops.cont(out), bias)


def residual_unit(x: Tensor, w: dict, p: str, dilation: int) -> Tensor:
    """x + conv1×1(snake(conv7 dilated(snake(x)))) (dac_vae.py:680-696; lengths stay equal)."""
    y = snake(x, w[p + "block.0.alpha"])
    y = conv1d(y, w[p + "block.1.weight"], w[p + "block.1.bias"], dilation=dilation)
    y = snake(y, w[p + "block.2.alpha"])
    y = conv1d(y, w[p + "block.3.weight"], w[p + "block.3.bias"])
    return x + y


def decode_graph(z: Tensor, w: dict, cfg: DACConfig) -> Tensor:
    """Latent [latent_dim, F] → audio [F·upsampling] in [−1, 1]."""
    x = conv1d(z, w["post_quant_conv.weight"], w["post_quant_conv.bias"])  # continuous only
    x = conv1d(x, w["decoder.model.0.weight"], w["decoder.model.0.bias"])
    for i, s in enumerate(cfg.decoder_rates):
        p = f"decoder.model.{i + 1}.block."
        x = snake(x, w[p + "0.alpha"])
        x = conv_transpose1d(x, w[p + "1.weight"], w[p + "1.bias"], stride=s)
        for u, d in enumerate(DILATIONS):
            x = residual_unit(x, w, f"{p}{u + 2}.", d)
        x = ops.name(x, f"vae.{i}.out")
    n = len(cfg.decoder_rates)
    x = snake(x, w[f"decoder.model.{n + 1}.alpha"])
    x = conv1d(x, w[f"decoder.model.{n + 2}.weight"],
               w[f"decoder.model.{n + 2}.bias"])                          # [1, F·upsampling]
    return ops.tanh(x)


class DACDecoder(NativeResource):
    """The VAE decoder over loaded weights (a `Weights` or `TensorStore` holding
    `tensor_shapes(config)`); one graph per latent length, built once and replayed.

    >>> audio = DACDecoder(weights, config).decode(latent)   # doctest: +SKIP
    """

    def __init__(self, weights, config: DACConfig, backend=None):
        self.config = config
        self.backend = backend if backend is not None else weights.backend
        self.weights = check_weights(weights, config)
        self._graphs: dict[int, Graph] = {}

    def graph(self, n_frames: int) -> Graph:
        if n_frames not in self._graphs:
            g = Graph(self.backend, name=f"vae[{n_frames}]")
            z = g.input("latent", (n_frames, self.config.latent_dim))   # [latent_dim, F]
            g.output(decode_graph(z, self.weights, self.config), "audio", ndim=1)
            self._graphs[n_frames] = g.build()
        return self._graphs[n_frames]

    def decode(self, latent: np.ndarray, *, chunk_frames: int | None = None) -> np.ndarray:
        """latent float (F, latent_dim), time first (upstream's [1, D, F] is `[0].T`) →
        float32 samples (F·upsampling,) at config.sample_rate's scale of [−1, 1].
        `chunk_frames`: decode that many frames at a time, each with `context_frames` of the
        latent on either side (the receptive field), so the samples are the whole decode's
        (to f32 kernel order) while the compute buffer holds one chunk: 30 s of 48 kHz at
        once would take gigabytes."""
        return np.concatenate(list(self.decode_chunks(latent, chunk_frames=chunk_frames)))

    def _checked(self, latent, chunk_frames) -> np.ndarray:
        latent = np.asarray(latent, dtype=np.float32)
        if latent.ndim != 2 or latent.shape[1] != self.config.latent_dim or not latent.shape[0]:
            raise InputError(f"DAC decode: latent must be (frames, {self.config.latent_dim}), "
                             f"got shape {latent.shape} (upstream's (D, F) needs a transpose)")
        if not np.all(np.isfinite(latent)):
            raise InputError("DAC decode: the latent has non-finite values")
        if chunk_frames is not None and (isinstance(chunk_frames, bool) or
                                         not isinstance(chunk_frames, int) or chunk_frames < 1):
            raise InputError(f"DAC decode: chunk_frames must be a whole number ≥ 1, got "
                             f"{chunk_frames!r}")
        return latent

    def decode_chunks(self, latent: np.ndarray, *, chunk_frames: int | None = None):
        """`decode`'s samples in pieces of `chunk_frames` latent frames each (one piece without
        it), yielded as each is decoded."""
        latent = self._checked(latent, chunk_frames)
        n = latent.shape[0]
        if chunk_frames is None or chunk_frames >= n:
            yield self.graph(n).run({"latent": latent})["audio"].reshape(-1)
            return
        ctx, hop = self.config.context_frames, self.config.upsampling
        for a in range(0, n, chunk_frames):
            b = min(n, a + chunk_frames)
            lo, hi = max(0, a - ctx), min(n, b + ctx)
            audio = self.graph(hi - lo).run({"latent": latent[lo:hi]})["audio"].reshape(-1)
            yield audio[(a - lo) * hop:(b - lo) * hop]

    def close(self) -> None:
        for g in getattr(self, "_graphs", {}).values():
            g.close()
        self._graphs = {}
