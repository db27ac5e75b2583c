"""Codec configuration: the stage tables of the encoder and decoder towers and the RLFQ
quantizer, as the converter writes them into GGUF metadata (`moss.codec.*`).

Upstream builds the towers from `encoder_kwargs` / `decoder_kwargs` lists (MOSS-Audio-Tokenizer
`modeling_moss_audio_tokenizer.py`); the converter resolves those lists, including each
transformer's sliding-window `context`, into the flat per-stage arrays read here.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

from ..errors import ConfigError

KIND = "codec"
FORMAT_VERSION = 1
PREFIX = "moss.codec"
PATCH, TRANSFORMER = 0, 1
# Far above every real codec (widths ≤ 1280, 32 layers, windows of 1600 frames, 48 kHz) and far
# below a size that a corrupt file could make a loop or an allocation run through.
MAX_SIZE = 1 << 20
STAGE_FIELDS = ("kind", "patch", "in_dim", "d_model", "out_dim", "n_heads", "n_layers", "ffn",
                "context", "has_input_proj", "has_output_proj")


def _check_sizes(cfg, what: str) -> None:
    for f in fields(cfg):
        value = getattr(cfg, f.name)
        if type(value) is int and not 0 <= value <= MAX_SIZE:
            raise ConfigError(f"codec: {what} field {f.name} = {value} is outside [0, {MAX_SIZE}] "
                              "(a corrupt file?)")


@dataclass(frozen=True)
class StageConfig:
    kind: int               # PATCH or TRANSFORMER
    patch: int = 1          # patch size (PATCH stages)
    in_dim: int = 0
    d_model: int = 0
    out_dim: int = 0
    n_heads: int = 0
    n_layers: int = 0
    ffn: int = 0
    context: int = 0        # sliding window in this stage's frames: 0 ≤ q − k < context
    has_input_proj: bool = False   # v1 drops identity projections from the checkpoint
    has_output_proj: bool = False

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_heads

    def __post_init__(self):
        _check_sizes(self, "stage")
        if self.kind not in (PATCH, TRANSFORMER):
            raise ConfigError(f"codec: unknown stage kind {self.kind}")
        if self.kind == PATCH and self.patch < 1:
            raise ConfigError(f"codec: patch stage with patch size {self.patch}")
        if self.kind == TRANSFORMER:
            if self.n_heads < 1 or self.d_model % self.n_heads or self.head_dim % 2:
                raise ConfigError(f"codec: d_model {self.d_model} does not split into "
                                  f"{self.n_heads} heads of an even size")
            if self.context < 1 or self.n_layers < 0:
                raise ConfigError(f"codec: transformer stage with context {self.context}, "
                                  f"{self.n_layers} layers")


@dataclass(frozen=True)
class CodecConfig:
    variant: str                    # "v1" (24 kHz mono), "nano", "v2" (48 kHz stereo)
    sample_rate: int
    channels: int
    downsample_rate: int            # samples per channel per code frame
    encoder: tuple[StageConfig, ...]
    decoder: tuple[StageConfig, ...]
    n_quantizers: int
    codebook_size: int
    codebook_dim: int
    rvq_dim: int
    code_dim: int                   # latent width entering / leaving the quantizer
    rope_base: float = 10000.0
    norm_eps: float = 1e-5

    def __post_init__(self):
        _check_sizes(self, "config")
        for name in ("sample_rate", "downsample_rate", "n_quantizers", "codebook_size",
                     "codebook_dim", "rvq_dim", "code_dim"):
            if getattr(self, name) < 1:
                raise ConfigError(f"codec: {name} is {getattr(self, name)}, must be positive")
        down = 1
        for s in self.encoder:
            down *= s.patch if s.kind == PATCH else 1
        up = 1
        for s in self.decoder:
            up *= s.patch if s.kind == PATCH else 1
        stream = self.downsample_rate * self.channels  # stereo codecs interleave L/R samples
        if down != stream or up != stream:
            raise ConfigError(f"codec: encoder patches multiply to {down}, decoder to {up}, but a "
                              f"code frame is {stream} interleaved samples")
        if self.channels not in (1, 2):
            raise ConfigError(f"codec: {self.channels} channels are not supported")

    @property
    def frame_rate(self) -> float:
        return self.sample_rate / self.downsample_rate

    @property
    def stream_samples_per_frame(self) -> int:
        """Interleaved samples of one code frame (downsample_rate × channels)."""
        return self.downsample_rate * self.channels

    @classmethod
    def from_gguf(cls, meta) -> "CodecConfig":
        """From a GGUFFile's typed reads (a missing or wrongly typed key: ModelFileError)."""
        def tower(name: str) -> tuple[StageConfig, ...]:
            arrays = {f: meta.integers(f"{PREFIX}.{name}.{f}") for f in STAGE_FIELDS}
            n = len(arrays["kind"])
            if any(len(a) != n for a in arrays.values()):
                raise ConfigError(f"codec: the {name} stage arrays have different lengths")
            return tuple(StageConfig(**{f: (bool(arrays[f][i]) if f.startswith("has_")
                                            else arrays[f][i]) for f in STAGE_FIELDS})
                         for i in range(n))

        q = f"{PREFIX}.quantizer"
        return cls(variant=meta.text(f"{PREFIX}.variant"), sample_rate=meta.integer(f"{PREFIX}.sample_rate"),
                   channels=meta.integer(f"{PREFIX}.channels"),
                   downsample_rate=meta.integer(f"{PREFIX}.downsample_rate"),
                   encoder=tower("encoder"), decoder=tower("decoder"),
                   n_quantizers=meta.integer(f"{q}.n_quantizers"),
                   codebook_size=meta.integer(f"{q}.codebook_size"),
                   codebook_dim=meta.integer(f"{q}.codebook_dim"), rvq_dim=meta.integer(f"{q}.rvq_dim"),
                   code_dim=meta.integer(f"{PREFIX}.code_dim"),
                   rope_base=meta.real(f"{PREFIX}.rope_base"),
                   norm_eps=meta.real(f"{PREFIX}.norm_eps"))

    def to_metadata(self) -> dict:
        meta = {f"{PREFIX}.variant": self.variant, f"{PREFIX}.sample_rate": self.sample_rate,
                f"{PREFIX}.channels": self.channels,
                f"{PREFIX}.downsample_rate": self.downsample_rate,
                f"{PREFIX}.code_dim": self.code_dim, f"{PREFIX}.rope_base": self.rope_base,
                f"{PREFIX}.norm_eps": self.norm_eps,
                f"{PREFIX}.quantizer.n_quantizers": self.n_quantizers,
                f"{PREFIX}.quantizer.codebook_size": self.codebook_size,
                f"{PREFIX}.quantizer.codebook_dim": self.codebook_dim,
                f"{PREFIX}.quantizer.rvq_dim": self.rvq_dim}
        for name, stages in (("encoder", self.encoder), ("decoder", self.decoder)):
            for f in STAGE_FIELDS:
                meta[f"{PREFIX}.{name}.{f}"] = [int(getattr(s, f)) for s in stages]
        return meta


def tensor_shapes(cfg: CodecConfig) -> dict[str, tuple]:
    """Every tensor the runtime reads, with its numpy shape (Linear weights are (out, in))."""
    shapes = {}
    for tower, stages in (("encoder", cfg.encoder), ("decoder", cfg.decoder)):
        for i, s in enumerate(stages):
            if s.kind != TRANSFORMER:
                continue
            d, f = s.d_model, s.ffn
            if s.has_input_proj:
                shapes[f"{tower}.{i}.input_proj.weight"] = (d, s.in_dim)
            if s.has_output_proj:
                shapes[f"{tower}.{i}.output_proj.weight"] = (s.out_dim, d)
            per_layer = {"norm1.weight": (d,), "norm1.bias": (d,),
                         "self_attn.in_proj.weight": (3 * d, d), "self_attn.out_proj.weight": (d, d),
                         "layer_scale_1.scale": (d,), "norm2.weight": (d,), "norm2.bias": (d,),
                         "ffn.0.weight": (f, d), "ffn.2.weight": (d, f), "layer_scale_2.scale": (d,)}
            for layer in range(s.n_layers):
                for name, shape in per_layer.items():
                    shapes[f"{tower}.{i}.transformer.layers.{layer}.{name}"] = shape
    r, c, k = cfg.rvq_dim, cfg.codebook_dim, cfg.codebook_size
    shapes.update({"quantizer.input_proj.weight": (r, cfg.code_dim), "quantizer.input_proj.bias": (r,),
                   "quantizer.output_proj.weight": (cfg.code_dim, r),
                   "quantizer.output_proj.bias": (cfg.code_dim,)})
    for i in range(cfg.n_quantizers):
        p = f"quantizer.quantizers.{i}."
        shapes.update({p + "in_proj.weight": (c, r), p + "in_proj.bias": (c,),
                       p + "out_proj.weight": (r, c), p + "out_proj.bias": (r,),
                       p + "codebook.weight": (k, c)})
    return shapes
