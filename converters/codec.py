"""MOSS-Audio-Tokenizer checkpoint → one codec GGUF (design §4; docs/upstream-notes.md §codecs-1-2,
seed 003).

    python -m moss_tts convert codec --model DIR_OR_REPO --out codec.gguf [--outtype f16]
        [--decoder-type q8_0] [--strict]

The towers are resolved from `encoder_kwargs` / `decoder_kwargs` into per-stage metadata (with
each transformer's sliding-window context); weight-norm pairs are fused into dense weights.
The transformers' linears take --outtype, the decoder's --decoder-type where given (a streamed
frame's decode reads every decoder weight: docs/codecs.md); the quantizer stays f32.
`--decoder-type stream` is the measured choice for streaming on a CPU (STREAM_DECODER_TYPE):
what a repo id converts to when no type is asked for.
"""

from __future__ import annotations

import json
import logging
import math
import re
from pathlib import Path

import numpy as np

from moss_tts.codec.config import (FORMAT_VERSION, KIND, PATCH, TRANSFORMER, CodecConfig,
                                   StageConfig, tensor_shapes)
from moss_tts.codec.tower import LAYER_TENSORS
from moss_tts.errors import ConfigError, MossTTSError

from .checkpoint import fuse_weight_norm, open_checkpoint, read_config, resolve_model_dir
from .gguf_io import Lazy, matmul_types, weight_type
from .registry import finish

logger = logging.getLogger(__name__)

WN_G, WN_V = ".parametrizations.weight.original0", ".parametrizations.weight.original1"
# `--decoder-type stream`: a decoder of STREAM_MIN_PARAMS or more (the 24 kHz codec's 0.9 B,
# v2's) in q6_K — a one-frame push reads every decoder weight, and q6_K made it 2.1x faster than
# f32, offline decode 1.4x, the audio 2.9 % RMS / 0.09 dB log-mel from f32's (q8_0: 1.6x, 0.9x,
# 1.8 % / 0.05 dB; q4_K slower than q6_K at one frame, 11 % / 0.32 dB: bench/codec_stream.py,
# docs/performance.md). A smaller one (Nano's, 15 ms a streamed frame in f32) keeps --outtype.
STREAM_DECODER_TYPE, STREAM_MIN_PARAMS = "q6_K", 100_000_000
STREAM = "stream"
WN_LEGACY_G, WN_LEGACY_V = ".weight_g", ".weight_v"  # older weight_norm spelling, same math
# v1 spells the attention and MLP weights differently from v2/Nano; upstream's own load hook
# accepts the v2 spelling for v1 too, so the GGUF uses that one and the runtime knows one name.
V1_RENAMES = ((".self_attn.in_projs.0.weight", ".self_attn.in_proj.weight"),
              (".self_attn.out_projs.0.weight", ".self_attn.out_proj.weight"),
              (".linear1.weight", ".ffn.0.weight"),
              (".linear2.weight", ".ffn.2.weight"))


def detect_variant(config: dict, names) -> tuple[str, int]:
    """(variant, channels) from the checkpoint's structure, never from `model_type` or channel
    keys, which upstream's config classes rewrite on save (a 24 kHz config re-saved carries
    `model_type: "moss-audio-tokenizer"` and no channel keys).

    The encoder's patches turn one code frame of the (interleaved) stream into one latent, so
    they multiply to downsample_rate × channels (upstream asserts the decoder inverts it). A
    stereo codec is the Nano / v2 code (v1 has no stereo path); Nano and v2 share that code and
    their label (16 vs 32 codebooks) is informational. Weight spellings do not decide it: the
    Nano / v2 loader also accepts v1's."""
    if not any(".self_attn.in_projs.0.weight" in n or ".self_attn.in_proj.weight" in n
               for n in names):
        raise ConfigError("not a MOSS-Audio-Tokenizer checkpoint: no transformer attention "
                          "weights found")
    per_frame = math.prod(int(kw["patch_size"]) for kw in config["encoder_kwargs"]
                          if kw.get("module_type") == "PatchedPretransform")
    downsample = int(config["downsample_rate"])
    channels, rest = divmod(per_frame, downsample)
    if rest or channels not in (1, 2):
        raise ConfigError(f"the encoder patches multiply to {per_frame} stream samples per code "
                          f"frame, not 1 or 2 channels × downsample_rate {downsample}")
    if channels == 1:
        return "v1", 1
    n_q = int(config.get("quantizer_kwargs", {}).get("num_quantizers", 0))
    return ("nano" if n_q == 16 else "v2"), 2


def resolve_stages(kwargs_list: list[dict], rate: float, duration: float, *, down: bool,
                   tower: str, variant: str) -> tuple[tuple[StageConfig, ...], float]:
    """Upstream's tower construction: a transformer's context is its duration (v2/Nano: the
    module's own `context_duration`, else the global one) × the frame rate entering it; v1
    truncates, v2/Nano round. The rate changes after each patch stage."""
    stages = []
    for i, kw in enumerate(kwargs_list):
        kind = kw.get("module_type")
        if kind == "PatchedPretransform":
            stages.append(StageConfig(kind=PATCH, patch=int(kw["patch_size"])))
            rate = rate / kw["patch_size"] if down else rate * kw["patch_size"]
        elif kind == "Transformer":
            if kw.get("gating", "none") != "none" or kw.get("norm", "layer_norm") != "layer_norm" \
                    or kw.get("positional_embedding", "rope") != "rope" or not kw.get("causal", True):
                raise ConfigError(f"{tower}.{i}: unsupported transformer options {kw}")
            d = int(kw["d_model"])
            seconds = duration if variant == "v1" else float(kw.get("context_duration", duration))
            context = int(rate * seconds) if variant == "v1" else int(round(rate * seconds))
            stages.append(StageConfig(
                kind=TRANSFORMER, in_dim=int(kw["input_dimension"]), d_model=d,
                out_dim=int(kw.get("output_dimension", d)), n_heads=int(kw["num_heads"]),
                n_layers=int(kw["num_layers"]), ffn=int(kw["dim_feedforward"]), context=context,
                # v1 builds a projection only where the dims differ (Identity otherwise);
                # v2/Nano always build both. A checkpoint that disagrees is reported, not trusted.
                has_input_proj=variant != "v1" or int(kw["input_dimension"]) != d,
                has_output_proj=variant != "v1" or int(kw.get("output_dimension", d)) != d))
        else:
            raise ConfigError(f"{tower}.{i}: unknown module_type {kind!r}")
    return tuple(stages), rate


def codec_config(config: dict, names) -> CodecConfig:
    try:
        variant, channels = detect_variant(config, names)
        sr = int(config.get("sampling_rate", config.get("sample_rate")))
        declared = config.get("number_channels", config.get("channels_numbers"))
        if declared is not None and int(declared) != channels:
            # e.g. a 24 kHz config re-saved by the v2 class, which writes its default of 2
            logger.warning("config.json declares %s channel(s), but its towers are a %d-channel "
                           "codec; converting as %d", declared, channels, channels)
        # the Nano / v2 config class defaults to interleaving; only an explicit false is refused
        if channels > 1 and not config.get("enable_channel_interleave", True):
            raise ConfigError(f"{channels}-channel codec without channel interleave is not supported")
        duration = float(config.get("causal_transformer_context_duration", 10.0))
        q = config["quantizer_kwargs"]
        if q.get("quantizer_type", config.get("quantizer_type", "rvq")) not in ("rlfq", "random_prefix_rlfq"):
            raise ConfigError(f"quantizer type {q.get('quantizer_type')!r} is not the RLFQ these "
                              "codecs use")
        # stereo codecs run one interleaved L R L R stream at channels × the sample rate
        encoder, rate = resolve_stages(config["encoder_kwargs"], float(sr * channels), duration,
                                       down=True, tower="encoder", variant=variant)
        decoder, _ = resolve_stages(config["decoder_kwargs"], rate, duration, down=False,
                                    tower="decoder", variant=variant)
        return CodecConfig(variant=variant, sample_rate=sr, channels=channels,
                           downsample_rate=int(config["downsample_rate"]), encoder=encoder,
                           decoder=decoder, n_quantizers=int(q["num_quantizers"]),
                           codebook_size=int(q["codebook_size"]), codebook_dim=int(q["codebook_dim"]),
                           rvq_dim=int(q.get("rvq_dim") or q["input_dim"]),
                           code_dim=int(config.get("code_dim", q["input_dim"])),
                           rope_base=float(_common(config, "max_period", 10000.0)))
    except KeyError as e:
        raise ConfigError(f"config.json lacks {e.args[0]!r}") from None


def _common(config: dict, key: str, default):
    values = {kw[key] for kw in config["encoder_kwargs"] + config["decoder_kwargs"] if key in kw}
    if len(values) > 1:
        raise ConfigError(f"stages disagree on {key}: {sorted(values)}")
    return values.pop() if values else default


def map_tensors(ckpt, cfg: CodecConfig) -> tuple[dict[str, Lazy], list[str]]:
    """Checkpoint → GGUF tensors, loaded only when written. Returns (tensors, unmapped keys)."""
    out, used = {}, set()
    names = ckpt.keys()
    for name in names:
        for g_suffix, v_suffix in ((WN_G, WN_V), (WN_LEGACY_G, WN_LEGACY_V)):
            if name.endswith(g_suffix) and name[: -len(g_suffix)] + v_suffix in ckpt:
                base = name[: -len(g_suffix)]
                v_shape = ckpt.shape(base + v_suffix)
                out[base + ".weight"] = Lazy(
                    (v_shape[0], int(np.prod(v_shape[1:]))), np.float32,
                    lambda g=name, v=base + v_suffix: fuse_weight_norm(ckpt[g], ckpt[v]))
                used.update((name, base + v_suffix))
    for name in names:
        if name in used:
            continue
        target = name
        for old, new in V1_RENAMES:
            if name.endswith(old):
                target = name[: -len(old)] + new
        if _is_known(target):
            shape = ckpt.shape(name)
            if target.endswith("proj.weight") and len(shape) == 3:  # a 1x1 conv kernel (out, in, 1)
                shape = (shape[0], int(np.prod(shape[1:])))
            out[target] = Lazy(shape, np.float32, lambda n=name, s=shape: ckpt[n].reshape(s))
            used.add(name)
    unmapped = [n for n in names if n not in used]
    return out, unmapped


_KNOWN = re.compile(r"^(encoder|decoder)\.\d+\.((input|output)_proj\.weight|transformer\.layers\.\d+\."
                    r"(" + "|".join(re.escape(n) for n in LAYER_TENSORS) + r"))$"
                    r"|^quantizer\.((input|output)_proj\.(weight|bias)|quantizers\.\d+\."
                    r"((in|out)_proj\.(weight|bias)|codebook\.weight))$")


def _is_known(name: str) -> bool:
    return bool(_KNOWN.match(name))


def convert(model: str, out: str | Path, *, outtype: str = "f32", decoder_type: str | None = None,
            strict: bool = False, progress=None) -> Path:
    tower_types(outtype, None if decoder_type == STREAM else decoder_type)  # bad types: before a fetch
    model_dir = resolve_model_dir(model)
    config = read_config(model_dir)
    # closed on every way out: a failed conversion keeps no checkpoint file mapped
    with open_checkpoint(model_dir) as ckpt:
        cfg = codec_config(config, ckpt.keys())
        tensors, unmapped = map_tensors(ckpt, cfg)
        meta = cfg.to_metadata() | {"moss.codec.config_json": json.dumps(config, sort_keys=True)}
        if decoder_type == STREAM:
            decoder_type = stream_decoder_type(tensors)
        return finish(model_dir, out, tensors, unmapped, tensor_shapes(cfg), meta, kind=KIND,
                      version=FORMAT_VERSION, type_for=tower_types(outtype, decoder_type),
                      strict=strict, progress=progress)


def stream_decoder_type(tensors: dict) -> str | None:
    """`--decoder-type stream` for these tensors: STREAM_DECODER_TYPE where the decoder's
    linears hold STREAM_MIN_PARAMS or more, else None (--outtype)."""
    params = sum(math.prod(t.shape) for name, t in tensors.items()
                 if name.startswith("decoder.") and is_matmul(name, t))
    return STREAM_DECODER_TYPE if params >= STREAM_MIN_PARAMS else None


def tower_types(outtype: str, decoder_type: str | None):
    """The type of each tensor: the linears in `outtype`, the decoder's in `decoder_type` when
    given (a type, or `stream`, resolved by variant once the config is read; checked before any
    tensor is read)."""
    encoder = matmul_types(outtype, is_matmul)
    if decoder_type is None:
        return encoder
    try:
        decoder = matmul_types(weight_type(decoder_type, "the type"), is_matmul)
    except MossTTSError as e:             # an unknown name: say which flag gave it
        raise ConfigError(f"--decoder-type: {e}") from None
    return lambda name, spec: (decoder if name.startswith("decoder.") else encoder)(name, spec)


def is_matmul(name: str, spec) -> bool:
    """Transformer and block-projection weights may be quantized; the quantizer stays f32, as
    upstream runs it in fp32 whatever the model dtype."""
    return spec.ndim == 2 and not name.startswith("quantizer.") and name.endswith(".weight") \
        and not name.split(".")[-2].startswith("norm")
