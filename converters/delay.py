"""MossTTSDelay checkpoint (MOSS-TTS v1.0 / v1.5, MOSS-TTSD, MOSS-VoiceGenerator,
MOSS-SoundEffect) → one GGUF holding the weights, the config, the tokenizer.json text and the
name of the published checkpoint it is (design §4; docs/upstream-notes.md §family-2.1-2.2,
§family-9).

    python -m moss_tts convert delay|ttsd|voicegen|sfx --model DIR_OR_REPO --out delay.gguf
        [--outtype q4_K] [--head-type q8_0] [--embed-type f16]

Sharded bf16 safetensors are read one tensor at a time. The backbone takes llama.cpp's Qwen3
names (as upstream's own llama.cpp converter does), the audio tables keep upstream names.
A type per group: block linears --outtype; text + audio heads --head-type (default: outtype,
but q8_0 when outtype is below it, P21); embedding tables --embed-type (default f32).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from moss_tts.errors import ConfigError, ModelFileError
from moss_tts.models.delay import (AUDIO_HEADS, FORMAT_VERSION, KIND, TEXT_HEAD, TOKENIZER_KEY,
                                   DelayConfig)
from moss_tts.models.qwen3 import Qwen3Config

from .gguf_io import Lazy, TypeFor, group_types, renamed
from .registry import convert_checkpoint

BACKBONE = "language_model."
# Keys the runtime never reads, each with the reason (C21: nothing is dropped silently).
IGNORED = {"language_model.rotary_emb.inv_freq": "RoPE frequencies are recomputed"}


def qwen3_config(c: dict) -> Qwen3Config:
    """A Qwen3 config dict of config.json → Qwen3Config. transformers 5 writes the RoPE base
    inside `rope_parameters` (and `rope_theta: null`); older ones write `rope_theta`. A
    scaled RoPE (factor ≠ 1) is not what these models use and is refused."""
    c = {k: v for k, v in c.items() if v is not None}
    rope = c.get("rope_parameters") or {}
    if float(rope.get("factor", 1.0)) != 1.0:
        raise ConfigError(f"RoPE scaling {rope} is not supported (the MOSS-TTS models use none)")
    return Qwen3Config(
        hidden_size=int(c["hidden_size"]), num_hidden_layers=int(c["num_hidden_layers"]),
        num_attention_heads=int(c["num_attention_heads"]),
        num_key_value_heads=int(c["num_key_value_heads"]), head_dim=int(c["head_dim"]),
        intermediate_size=int(c["intermediate_size"]),
        rope_theta=float(c["rope_theta"] if "rope_theta" in c else rope["rope_theta"]),
        rms_norm_eps=float(c.get("rms_norm_eps", 1e-6)))


def delay_config(config: dict) -> DelayConfig:
    if config.get("model_type") not in (None, "moss_tts_delay"):
        raise ConfigError(f"model_type {config.get('model_type')!r} is not moss_tts_delay")
    if "local_num_layers" in config or "gpt2_config" in config:   # P26: V2 / V2b say the same
        raise ConfigError("this checkpoint has a local transformer (MOSS-TTS-Local), not the "
                          "MossTTSDelay layout")
    return with_language_config(DelayConfig, config)


def with_language_config(cls, config: dict):
    """A model config `cls` from config.json: the Qwen3 `language_config`, its vocab_size, and
    every other field of `cls` that config.json sets (the rest keep upstream's defaults)."""
    try:
        lc = config["language_config"]
        language = qwen3_config(lc)
        ids = {k: int(config[k]) for k in cls.__dataclass_fields__
               if k not in ("language_config", "vocab_size") and k in config}
        return cls(language, vocab_size=int(lc["vocab_size"]), **ids)
    except KeyError as e:
        raise ConfigError(f"config.json lacks {e.args[0]!r}") from None


def find_tokenizer(model_dir: Path) -> str:
    path = model_dir / "tokenizer.json"
    if not path.is_file():
        raise ModelFileError(f"{model_dir}: no tokenizer.json (the Qwen BPE tokenizer is "
                             "embedded in the GGUF)")
    return path.read_text(encoding="utf-8")


def source_names(cfg: DelayConfig) -> dict[str, str]:
    """{checkpoint name: GGUF name} of every tensor but the audio heads."""
    names = cfg.language_config.source_names(BACKBONE)
    names |= {f"{BACKBONE}embed_tokens.weight": "token_embd.weight",
              "lm_heads.0.weight": TEXT_HEAD}     # llama.cpp's `output`, as upstream converts it
    return names | {f"emb_ext.{k}.weight": f"emb_ext.{k}.weight" for k in range(cfg.n_vq)}


def map_tensors(ckpt, cfg: DelayConfig) -> tuple[dict[str, Lazy], list[str]]:
    """Checkpoint → GGUF tensors, loaded only when written. Returns (tensors, unmapped keys)."""
    heads = [f"lm_heads.{k + 1}.weight" for k in range(cfg.n_vq)]
    out, unmapped = renamed(ckpt, source_names(cfg), lambda n: n in heads or n in IGNORED)
    if all(h in ckpt for h in heads):
        # the n_vq audio heads stacked into one matrix: one matmul per step (design §3)
        shapes = {ckpt.shape(h) for h in heads}
        rows, d = shapes.pop() if len(shapes) == 1 else (0, 0)
        out[AUDIO_HEADS] = Lazy((len(heads) * rows, d), np.float32, lambda: np.concatenate(
            [ckpt[h].astype(np.float32, copy=False) for h in heads]))
    return out, unmapped


def delay_group(name: str) -> str:
    """A Delay GGUF tensor's type group (gguf_io.group_types): block linears, the text and
    stacked audio heads, else embedding tables."""
    if name.startswith("blk."):
        return "block"
    return "head" if name in (TEXT_HEAD, AUDIO_HEADS) else "embed"


def tensor_types(outtype="f32", *, head=None, embed="f32") -> TypeFor:
    """Delay's types per group (`delay_group`)."""
    return group_types(delay_group, outtype, head=head, embed=embed)


def checkpoint_of(model_dir: Path, given=None, *, source: str | None = None):
    """Which published checkpoint `model_dir` is (a registry row): the one asked for (`given`,
    from `convert ttsd`, ...) if it may be that one, else an error naming the one it is;
    without one asked for, the one its names or shape say (naming.checkpoint_candidates)."""
    from .naming import checked_checkpoint, family_of_checkpoint

    if given is None:
        return family_of_checkpoint(model_dir, source=source)
    return checked_checkpoint(given, model_dir, source=source)


def convert(model: str, out: str | Path, *, outtype: str = "f32", head_type: str | None = None,
            embed_type: str = "f32", strict: bool = False, progress=None,
            checkpoint=None) -> Path:
    """`checkpoint`: the registry row of the published checkpoint being converted (default:
    recognized from the checkpoint, `checkpoint_of`); its name goes into the GGUF."""
    from moss_tts.models.registry import CHECKPOINT_KEY

    from .checkpoint import resolve_model_dir

    model_dir = resolve_model_dir(model)
    row = checkpoint_of(model_dir, checkpoint, source=model)
    return convert_checkpoint(str(model_dir), out, parse_config=delay_config,
                              find_tokenizer=find_tokenizer, map_tensors=map_tensors,
                              tokenizer_key=TOKENIZER_KEY, kind=KIND, version=FORMAT_VERSION,
                              strict=strict, progress=progress,
                              type_for=tensor_types(outtype, head=head_type, embed=embed_type),
                              meta={CHECKPOINT_KEY: row.checkpoint})
