"""MOSS-TTS-Local-Transformer-v1.5 checkpoint → one GGUF holding the weights, the config and
the tokenizer.json text (design §4; docs/upstream-notes.md §family-4.1-4.2).

    python -m moss_tts convert local-v15 --model DIR_OR_REPO --out local-v15.gguf
        [--outtype q4_K] [--embed-type f16] [--strict]

The backbone takes llama.cpp's Qwen3 names; the local block, the audio tables and the 2-way
head keep upstream names. Tied heads are stored once (audio head k is audio_embeddings.k) and the
text head, a second copy of the text table that the 2-way head makes unused, is dropped.
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np

from moss_tts.errors import ConfigError, ModelFileError
from moss_tts.models import gpt2
from moss_tts.models.local_v15 import (DECISION_HEAD, FORMAT_VERSION, KIND, LOCAL, TOKENIZER_KEY,
                                       LocalV15Config)
from moss_tts.models.qwen3 import Qwen3Config

from .delay import find_tokenizer
from .gguf_io import Lazy, TypeFor, group_types, renamed
from .registry import convert_checkpoint

BACKBONE = "transformer."
# Keys the runtime never reads, each with the reason (C21: nothing is dropped silently).
IGNORED = (
    (re.compile(r"^text_lm_head\.weight$"),
     "tied to transformer.embed_tokens, and the 2-way head replaces it at generation"),
    (re.compile(r"^local_transformer\.wte\.weight$"), "stale: the local input is an identity"),
    (re.compile(r"\.inv_freq$"), "RoPE frequencies are recomputed"),
)
TIED_HEAD = re.compile(r"^audio_lm_heads\.(\d+)\.weight$")


def _qwen3(lc: dict) -> Qwen3Config:
    d, heads = int(lc["hidden_size"]), int(lc["num_attention_heads"])
    return Qwen3Config(
        hidden_size=d, num_hidden_layers=int(lc["num_hidden_layers"]),
        num_attention_heads=heads, num_key_value_heads=int(lc["num_key_value_heads"]),
        head_dim=int(lc.get("head_dim") or d // heads),
        intermediate_size=int(lc["intermediate_size"]),
        rope_theta=float(lc.get("rope_theta", 1e6)),
        rms_norm_eps=float(lc.get("rms_norm_eps", 1e-6)))


def _local(g: dict, config: dict, d: int) -> gpt2.GPT2Config:
    """The local block from gpt2_config with HF GPT2Config's defaults where a key is absent,
    and upstream's override of n_layer by `local_transformer_layers`."""
    kind = str(g.get("position_embedding_type", "absolute")).lower()
    if kind != "rope":
        raise ConfigError(f"Local v1.5: gpt2_config.position_embedding_type {kind!r} is not "
                          "supported (the published checkpoint uses rope)")
    n_embd = int(g.get("n_embd", d))
    return gpt2.GPT2Config(
        n_embd=n_embd, n_head=int(g.get("n_head") or max(1, n_embd // 80)),
        n_layer=int(config.get("local_transformer_layers", g.get("n_layer", 1))),
        n_inner=g.get("n_inner"), layer_norm_epsilon=float(g.get("layer_norm_epsilon", 1e-5)),
        rope_base=float(g.get("rope_base", 10000.0)),
        activation_function=g.get("activation_function", "gelu_new"))


def local_v15_config(config: dict) -> LocalV15Config:
    if "local_num_layers" in config:   # P26: V2 (Local 1.7B) has no gpt2_config
        raise ConfigError("this is a MOSS-TTS-Local-Transformer (1.7B) checkpoint: convert it "
                          "with `convert local`")
    if config.get("model_type") not in (None, "moss_tts_local") or "gpt2_config" not in config:
        raise ConfigError(f"model_type {config.get('model_type')!r} without a gpt2_config is "
                          "not MOSS-TTS-Local-Transformer-v1.5 (moss_tts_local)")
    mode = str(config.get("local_text_head_mode", "binary")).strip().lower()
    if mode not in ("binary", "full_vocab", "full", "full-vocab", "vocab"):
        raise ConfigError(f"local_text_head_mode {mode!r} is neither binary nor full_vocab")
    try:
        lc = config.get("qwen3_config") or config["language_config"]
        language = _qwen3(lc)
        n_vq = int(config.get("n_vq", 12))
        sizes = config.get("audio_codebook_sizes") or [config.get("audio_vocab_size", 1024)] * n_vq
        if len(sizes) != n_vq or len(set(sizes)) != 1:
            raise ConfigError(f"Local v1.5: audio_codebook_sizes {sizes} must be {n_vq} equal "
                              "sizes")
        pad = config.get("audio_pad_code", config.get("audio_pad_token_id"))
        ids = {k: int(config[k]) for k in LocalV15Config.__dataclass_fields__
               if k not in ("language_config", "local", "vocab_size", "n_vq",
                            "audio_vocab_size", "audio_pad_token_id") and k in config}
        if pad is not None:
            ids["audio_pad_token_id"] = int(pad)
        return LocalV15Config(language, _local(config["gpt2_config"], config, language.hidden_size),
                              vocab_size=int(lc["vocab_size"]), n_vq=n_vq,
                              audio_vocab_size=int(sizes[0]), **ids)
    except KeyError as e:
        raise ConfigError(f"config.json lacks {e.args[0]!r}") from None


def source_names(cfg: LocalV15Config) -> dict[str, str]:
    """{checkpoint name: GGUF name} of every stored tensor (the backbone under llama.cpp names,
    the rest verbatim)."""
    names = cfg.language_config.source_names(BACKBONE)
    names[f"{BACKBONE}embed_tokens.weight"] = "token_embd.weight"
    return names | {n: n for n in cfg.tensor_shapes() if not n.startswith(("blk.", "output_norm",
                                                                             "token_embd"))}


def map_tensors(ckpt, cfg: LocalV15Config) -> tuple[dict[str, Lazy], list[str]]:
    """Checkpoint → GGUF tensors, loaded only when written. Returns (tensors, unmapped keys)."""
    def accounted(name: str) -> bool:
        """Ignored by rule, or an audio head that is its table (stored once; an untied one is
        refused)."""
        if any(p.search(name) for p, _ in IGNORED):
            return True
        if m := TIED_HEAD.match(name):
            source = f"audio_embeddings.{m.group(1)}.weight"
            if source not in ckpt or not np.array_equal(ckpt[name], ckpt[source]):
                raise ModelFileError(f"{name} is not tied to {source}: this runtime needs tied "
                                     "audio heads")
            return True
        return False

    out, unmapped = renamed(ckpt, source_names(cfg), accounted)
    text = f"{BACKBONE}embed_tokens.weight"
    if DECISION_HEAD not in ckpt and text in ckpt:
        # upstream initialises the 2-way head from the (tied) text head's continue/stop rows,
        # and full_vocab mode decides with exactly those rows: a checkpoint without it means them
        rows = [cfg.audio_assistant_slot_token_id, cfg.audio_end_token_id]
        out[DECISION_HEAD] = Lazy((2, ckpt.shape(text)[1]), np.float32,
                                  lambda: ckpt[text][rows].astype(np.float32))
    return out, unmapped


def local_v15_group(name: str) -> str:
    """A Local v1.5 GGUF tensor's type group (gguf_io.group_types): the backbone's and the local
    block's linears; the 2-way head kept f32; the text and audio tables (the audio ones are the
    heads too) as tables."""
    if name == DECISION_HEAD:
        return "f32"
    return "block" if name.startswith(("blk.", f"{LOCAL}.h.")) else "embed"


def tensor_types(outtype="f32", *, embed="f32") -> TypeFor:
    return group_types(local_v15_group, outtype, embed=embed)


def convert(model: str, out: str | Path, *, outtype: str = "f32", embed_type: str = "f32",
            strict: bool = False, progress=None) -> Path:
    return convert_checkpoint(model, out, parse_config=local_v15_config,
                              find_tokenizer=find_tokenizer, map_tensors=map_tensors,
                              tokenizer_key=TOKENIZER_KEY, kind=KIND, version=FORMAT_VERSION,
                              type_for=tensor_types(outtype, embed=embed_type), strict=strict,
                              progress=progress)
