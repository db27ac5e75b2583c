"""MossTTSLocal checkpoint (MOSS-TTS-Local-Transformer, 1.7B) → one GGUF holding the weights,
the config and the tokenizer.json text (design §4; docs/upstream-notes.md §family-3.1-3.2).

    python -m moss_tts convert local --model DIR_OR_REPO --out local.gguf [--outtype q8_0]
        [--head-type q8_0] [--embed-type f16]

Its config.json says `model_type: moss_tts_delay`; `local_num_layers` is what tells it apart
(P26). The backbone and the text table take llama.cpp's Qwen3 names, the depth transformer the
same names below `local.`, the adapters, norms, audio tables and audio heads keep upstream's.
The backbone's own `embed_tokens` is a frozen duplicate upstream never reads: dropped, said so.
A text head tied to the text table (absent, or equal to it) is stored once.
"""

from __future__ import annotations

import numpy as np

from moss_tts.errors import ConfigError
from moss_tts.models.local import (AUDIO_EMBED, AUDIO_HEAD, FORMAT_VERSION, HEAD_NORM, KIND,
                                   LOCAL, TEXT_EMBED, TEXT_HEAD, TOKENIZER_KEY, LocalConfig)

from .delay import find_tokenizer, with_language_config
from .gguf_io import Lazy, TypeFor, group_types, renamed
from .registry import convert_checkpoint

MODEL = "model."
BACKBONE = "model.language_model."
LOCAL_SOURCE = "local_transformer."
SOURCE_TEXT_EMBED = "model.embedding_list.0.weight"
SOURCE_TEXT_HEAD = "lm_heads.0.weight"
# Keys the runtime never reads, each with the reason (C21: nothing is dropped silently).
IGNORED = {f"{BACKBONE}embed_tokens.weight": "a frozen duplicate of embedding_list.0 that "
                                               "upstream's forward never reads",
           f"{BACKBONE}rotary_emb.inv_freq": "RoPE frequencies are recomputed"}


def local_config(config: dict) -> LocalConfig:
    if "gpt2_config" in config or config.get("model_type") == "moss_tts_local":
        raise ConfigError("this is MOSS-TTS-Local-Transformer-v1.5 (a GPT-2 local block), not "
                          "the 1.7B MossTTSLocal: convert it with `convert local-v15`")
    if "local_num_layers" not in config:   # P26: the 8B Delay says moss_tts_delay as well
        raise ConfigError("config.json has no local_num_layers: this is MossTTSDelay, not "
                          "MossTTSLocal — convert it with `convert delay`")
    return with_language_config(LocalConfig, config)


def tied_head(cfg: LocalConfig, ckpt) -> LocalConfig:
    """tie_text_head = 1 when lm_heads.0 is absent (a tied checkpoint, §family-3.2) or equal to the
    text table: one copy is stored and read as both."""
    tied = SOURCE_TEXT_HEAD not in ckpt or (
        SOURCE_TEXT_EMBED in ckpt and ckpt.shape(SOURCE_TEXT_HEAD) == ckpt.shape(SOURCE_TEXT_EMBED)
        and np.array_equal(ckpt[SOURCE_TEXT_HEAD], ckpt[SOURCE_TEXT_EMBED]))
    return LocalConfig(**{**cfg.__dict__, "tie_text_head": int(tied)})


def source_names(cfg: LocalConfig) -> dict[str, str]:
    """{checkpoint name: GGUF name} of every tensor."""
    n = cfg.n_vq
    names = cfg.language_config.source_names(BACKBONE) | {SOURCE_TEXT_EMBED: TEXT_EMBED}
    if not cfg.tie_text_head:
        names[SOURCE_TEXT_HEAD] = TEXT_HEAD
    names |= {k: LOCAL + v for k, v in cfg.local_config.source_names(LOCAL_SOURCE).items()}
    names |= {MODEL + AUDIO_EMBED.format(k): AUDIO_EMBED.format(k) for k in range(1, n + 1)}
    kept = [AUDIO_HEAD.format(k) for k in range(1, n + 1)]
    kept += [HEAD_NORM.format(c) for c in range(n + 1)]
    kept += [name for name in cfg.tensor_shapes() if name.endswith("_proj.weight")
             and not name.startswith(LOCAL)]            # the SwiGLU adapters
    return names | {name: name for name in kept}


def map_tensors(ckpt, cfg: LocalConfig) -> tuple[dict[str, Lazy], list[str]]:
    """Checkpoint → GGUF tensors, loaded only when written. Returns (tensors, unmapped keys)."""
    return renamed(ckpt, source_names(cfg), lambda n: n in IGNORED or (
        cfg.tie_text_head and n == SOURCE_TEXT_HEAD))


def local_group(name: str) -> str:
    """A Local GGUF tensor's type group (gguf_io.group_types): the text and audio
    heads; the embedding tables (a tied text table too); every other matrix — backbone, depth
    stack and adapters — a block linear."""
    if name.startswith("lm_heads.") or name == TEXT_HEAD:
        return "head"
    return "embed" if name.startswith("embedding_list.") or name == TEXT_EMBED else "block"


def tensor_types(outtype="f32", *, head=None, embed="f32") -> TypeFor:
    return group_types(local_group, outtype, head=head, embed=embed)


def convert(model: str, out, *, outtype: str = "f32", head_type: str | None = None,
            embed_type: str = "f32", strict: bool = False, progress=None):
    return convert_checkpoint(model, out, parse_config=local_config, find_tokenizer=find_tokenizer,
                              map_tensors=map_tensors, tokenizer_key=TOKENIZER_KEY, kind=KIND,
                              version=FORMAT_VERSION, strict=strict, progress=progress,
                              refine=tied_head,
                              type_for=tensor_types(outtype, head=head_type, embed=embed_type))
