"""MossTTSRealtime checkpoint (MOSS-TTS-Realtime) → one GGUF holding the weights, the config and
the tokenizer.json text (design §4; docs/upstream-notes.md §family-5.1-5.2).

    python -m moss_tts convert realtime --model DIR_OR_REPO --out realtime.gguf [--outtype q4_K]
        [--head-type q8_0] [--embed-type f16]

The backbone takes llama.cpp's Qwen3 names (its text table `embed_tokens.0` is `token_embd`),
the local transformer's blocks the same names below `local.`; the audio tables and heads keep
upstream names (the local ones below `local.`). Padding rows are kept as stored. A type per
group: block linears --outtype; the local heads --head-type (default: outtype, not below
q8_0); embedding tables --embed-type (default f32).
"""

from __future__ import annotations

from pathlib import Path


from moss_tts.errors import ConfigError
from moss_tts.models import spec
from moss_tts.models.realtime import (FORMAT_VERSION, KIND, LOCAL_LAYER, LOCAL_NORM, TEXT_TABLE,
                                      TOKENIZER_KEY, RealtimeConfig)

from .delay import find_tokenizer, qwen3_config
from .gguf_io import Lazy, TypeFor, group_types, renamed
from .registry import convert_checkpoint

BACKBONE = "language_model."
LOCAL = "local_transformer."
# Keys the runtime never reads, each with the reason (C21: nothing is dropped silently).
IGNORED = {
    "language_model.embed_tokens.weight": "a copy of embed_tokens.0, the text table the model "
                                          "reads (P17)",
    "language_model.rotary_emb.inv_freq": "RoPE frequencies are recomputed",
    "local_transformer.model.rotary_emb.inv_freq": "RoPE frequencies are recomputed",
}
# upstream MossTTSRealtimeLocalTransformerConfig defaults, for keys a config.json leaves out
LOCAL_DEFAULTS = {"hidden_size": 2048, "num_hidden_layers": 4, "num_attention_heads": 16,
                  "num_key_value_heads": 8, "head_dim": 128, "intermediate_size": 6144,
                  "rope_parameters": {"rope_theta": 1e6}, "rms_norm_eps": 1e-6}


def realtime_config(config: dict) -> RealtimeConfig:
    if config.get("model_type") not in (None, "moss_tts_realtime"):
        raise ConfigError(f"model_type {config.get('model_type')!r} is not moss_tts_realtime "
                          "(convert the other families with their own `convert` family)")
    try:
        lc = config["language_config"]
        given = config.get("local_config") or {}
        local = LOCAL_DEFAULTS | {k: v for k, v in given.items() if v is not None}
        ids = {k: int(config[k]) for k in ("rvq", "audio_pad_token", "audio_vocab_size",
                                          "reference_audio_pad", "text_pad", "sampling_rate")
               if k in config}
        return RealtimeConfig(qwen3_config(lc), qwen3_config(local),
                              vocab_size=int(lc["vocab_size"]), **ids)
    except KeyError as e:
        raise ConfigError(f"config.json lacks {e.args[0]!r}") from None


def source_names(cfg: RealtimeConfig) -> dict[str, str]:
    """{checkpoint name: GGUF name} of every tensor the model reads."""
    names = cfg.language_config.source_names(BACKBONE) | {"embed_tokens.0.weight": TEXT_TABLE}
    names |= {f"embed_tokens.{k + 1}.weight": f"embed_tokens.{k + 1}.weight"
              for k in range(cfg.rvq)}
    lc = cfg.local_config
    names |= {f"{LOCAL}model.norm.weight": LOCAL_NORM}
    for i in range(lc.num_hidden_layers):
        names |= spec.source_names(lc.layer_spec(), LOCAL_LAYER.format(i),
                                   f"{LOCAL}model.layers.{i}.")
    # P16: local table j embeds codebook j, the input of local position j + 1; kept as indexed
    names |= {f"{LOCAL}model.embed_tokens.{j}.weight": f"local.embed_tokens.{j}.weight"
              for j in range(cfg.rvq - 1)}
    return names | {f"{LOCAL}local_lm_heads.{j}.weight": f"local.lm_heads.{j}.weight"
                    for j in range(cfg.rvq)}


def map_tensors(ckpt, cfg: RealtimeConfig) -> tuple[dict[str, Lazy], list[str]]:
    """Checkpoint → GGUF tensors, loaded only when written. Returns (tensors, unmapped keys)."""
    return renamed(ckpt, source_names(cfg), lambda n: n in IGNORED)


def realtime_group(name: str) -> str:
    """A Realtime GGUF tensor's type group (gguf_io.group_types): the backbone's and the local
    transformer's block linears, the local heads, else the text, audio and local tables."""
    if name.startswith(("blk.", "local.blk.")):
        return "block"
    return "head" if name.startswith("local.lm_heads.") else "embed"


def tensor_types(outtype="f32", *, head=None, embed="f32") -> TypeFor:
    return group_types(realtime_group, outtype, head=head, embed=embed)


def convert(model: str, out: str | Path, *, outtype: str = "f32", head_type: str | None = None,
            embed_type: str = "f32", strict: bool = False, progress=None) -> Path:
    return convert_checkpoint(model, out, parse_config=realtime_config,
                              find_tokenizer=find_tokenizer, map_tensors=map_tensors,
                              tokenizer_key=TOKENIZER_KEY, kind=KIND, version=FORMAT_VERSION,
                              strict=strict, progress=progress,
                              type_for=tensor_types(outtype, head=head_type, embed=embed_type))
