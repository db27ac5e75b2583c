"""MOSS-TTS-Nano checkpoint → one GGUF holding the weights, the config and the SentencePiece
model (design §4; docs/upstream-notes.md §nano-1, §nano-6).

    python -m moss_tts convert nano --model DIR_OR_REPO --out nano.gguf [--outtype q8_0] [--strict]

Heads are tied (text head = transformer.wte, audio head c = audio_embeddings.c) and stored once;
the runtime uses the embeddings.
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np

from moss_tts.errors import ConfigError, ModelFileError
from moss_tts.models import gpt2
from moss_tts.models.nano import FORMAT_VERSION, KIND, TOKENIZER_KEY, NanoConfig

from .gguf_io import Lazy, matmul_types
from .registry import convert_checkpoint

TOKENIZER_FILES = ("tokenizer.model", "sentencepiece/mossttsnano_spm_bpe.model")
# Keys the runtime never reads, each with the reason (C21: nothing is dropped silently).
IGNORED = (
    (re.compile(r"^local_transformer\.wte\.weight$"), "stale: the local input is an identity"),
    (re.compile(r"^(transformer|local_transformer)\.h\.\d+\.attn\.(bias|masked_bias)$"),
     "GPT-2 causal-mask buffers, not weights"),
    (re.compile(r"(^|\.)rotary[^.]*\.inv_freq$|\.inv_freq$"), "RoPE frequencies are recomputed"),
)
TIED = (re.compile(r"^text_lm_head\.weight$"), re.compile(r"^audio_lm_heads\.(\d+)\.weight$"))


def nano_config(config: dict) -> NanoConfig:
    if config.get("model_type") not in (None, "moss_tts_nano"):
        raise ConfigError(f"model_type {config.get('model_type')!r} is not moss_tts_nano")
    try:
        g = config["gpt2_config"]
        if g.get("position_embedding_type", "rope") != "rope":
            raise ConfigError("Nano: only RoPE position embeddings are supported")
        common = dict(n_embd=int(g["n_embd"]), n_head=int(g["n_head"]), n_inner=g.get("n_inner"),
                      layer_norm_epsilon=float(g.get("layer_norm_epsilon", 1e-5)),
                      rope_base=float(g.get("rope_base", 10000.0)),
                      activation_function=g.get("activation_function", "gelu_new"))
        n_vq = int(config["n_vq"])
        sizes = config.get("audio_codebook_sizes") or [config["audio_vocab_size"]] * n_vq
        if len(sizes) != n_vq or len(set(sizes)) != 1:
            raise ConfigError(f"Nano: audio_codebook_sizes {sizes} must be {n_vq} equal sizes")
        return NanoConfig(
            backbone=gpt2.GPT2Config(n_layer=int(g["n_layer"]), **common),
            local=gpt2.GPT2Config(n_layer=int(config.get("local_transformer_layers", 1)), **common),
            vocab_size=int(g["vocab_size"]), n_vq=n_vq, audio_vocab_size=int(sizes[0]),
            audio_pad_token_id=int(config["audio_pad_token_id"]),
            pad_token_id=int(config["pad_token_id"]),
            im_start_token_id=int(config["im_start_token_id"]),
            im_end_token_id=int(config["im_end_token_id"]),
            audio_start_token_id=int(config["audio_start_token_id"]),
            audio_end_token_id=int(config["audio_end_token_id"]),
            audio_user_slot_token_id=int(config["audio_user_slot_token_id"]),
            audio_assistant_slot_token_id=int(config["audio_assistant_slot_token_id"]),
            sample_rate=int(config.get("audio_tokenizer_sample_rate", 48000)))
    except KeyError as e:
        raise ConfigError(f"config.json lacks {e.args[0]!r}") from None


def find_tokenizer(model_dir: Path) -> bytes:
    for name in TOKENIZER_FILES:
        if (model_dir / name).is_file():
            return (model_dir / name).read_bytes()
    raise ModelFileError(f"{model_dir}: no SentencePiece model ({' or '.join(TOKENIZER_FILES)})")


def map_tensors(ckpt, cfg: NanoConfig) -> tuple[dict[str, Lazy], list[str]]:
    """Checkpoint → GGUF tensors (upstream names verbatim), loaded only when written.
    Returns (tensors, unmapped keys)."""
    expected = cfg.tensor_shapes()
    out, unmapped = {}, []
    for name in ckpt.keys():
        if name in expected:
            out[name] = Lazy(ckpt.shape(name), np.float32,
                             lambda n=name: ckpt[n].astype(np.float32, copy=False))
        elif any(p.search(name) for p, _ in IGNORED):
            continue
        elif TIED[0].match(name) or TIED[1].match(name):
            m = TIED[1].match(name)
            source = f"audio_embeddings.{m.group(1)}.weight" if m else "transformer.wte.weight"
            if source not in ckpt or not np.array_equal(ckpt[name], ckpt[source]):
                raise ModelFileError(f"{name} is not tied to {source}: this runtime needs tied heads")
        else:
            unmapped.append(name)
    return out, unmapped


def is_matmul(name: str, spec) -> bool:
    """Block linear weights may be quantized; embeddings (also the tied heads) and norms stay f32."""
    return spec.ndim == 2 and ".h." in name and not name.split(".")[-2].startswith("ln_")


def convert(model: str, out: str | Path, *, outtype: str = "f32", strict: bool = False,
            progress=None) -> Path:
    return convert_checkpoint(model, out, parse_config=nano_config, find_tokenizer=find_tokenizer,
                              map_tensors=map_tensors, tokenizer_key=TOKENIZER_KEY, kind=KIND,
                              version=FORMAT_VERSION, type_for=matmul_types(outtype, is_matmul),
                              strict=strict, progress=progress)
