"""Upstream's published llama.cpp layout of MOSS-TTS (`OpenMOSS-Team/MOSS-TTS-GGUF`; facts in
docs/upstream-notes.md §family-8), loaded as it is: one llama.cpp Qwen3 GGUF (the text head is its
`output`), `embeddings/emb_ext_NN.npy`, `lm_heads/lm_head_audio_NN.npy` (fp16) and
`tokenizer/tokenizer.json`. The ids are upstream's defaults, as its own pipeline hard-codes.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from ..errors import ModelFileError
from ..ggml import TensorStore, Weights, get_backend
from .delay import AUDIO_HEADS, DelayConfig, DelayModel, PublishedParts, matmul_only
from .qwen3 import ARCH, Qwen3Config

TABLE = "embeddings/emb_ext_{:02d}.npy"
HEAD = "lm_heads/lm_head_audio_{:02d}.npy"
TOKENIZER = "tokenizer/tokenizer.json"


def is_published_dir(path) -> bool:
    p = Path(path)
    return p.is_dir() and (p / "embeddings").is_dir() and (p / "lm_heads").is_dir()


def _backbone_gguf(d: Path) -> Path:
    found = sorted(d.glob("*.gguf"))
    if len(found) != 1:
        raise ModelFileError(f"{d}: expected one backbone .gguf, found {len(found)} "
                             f"({', '.join(p.name for p in found) or 'none'}) — keep one")
    return found[0]


def _count(d: Path, pattern: str) -> int:
    n = 0
    while (d / pattern.format(n)).is_file():
        n += 1
    if n == 0:
        raise ModelFileError(f"{d}: no {pattern.format(0)} — not the published MOSS-TTS layout")
    return n


def _load_npy(path: Path) -> np.ndarray:
    try:
        return np.load(path, mmap_mode="r")
    except (OSError, ValueError) as e:
        raise ModelFileError(f"{path}: not a readable .npy file ({e})") from None


def read_parts(d: Path, weights: Weights) -> PublishedParts:
    """The config (backbone keys + table sizes), the audio tensors and the tokenizer."""
    arch = weights.file.get("general.architecture")
    if arch != ARCH:
        raise ModelFileError(f"{weights.file.path}: a {arch!r} GGUF, the published MOSS-TTS "
                             f"backbone is {ARCH!r}")
    n_vq = _count(d, TABLE)
    if _count(d, HEAD) != n_vq:
        raise ModelFileError(f"{d}: {n_vq} embedding tables but {_count(d, HEAD)} audio heads")
    tables = [_load_npy(d / TABLE.format(k)) for k in range(n_vq)]
    heads = [_load_npy(d / HEAD.format(k)) for k in range(n_vq)]
    rows = tables[0].shape[0]
    vocab = weights.file.tensors["token_embd.weight"].shape[0] \
        if "token_embd.weight" in weights.file.tensors else 0
    cfg = DelayConfig(Qwen3Config.from_gguf(weights.file), vocab_size=vocab, n_vq=n_vq,
                      audio_vocab_size=rows - 1, audio_pad_code=rows - 1)
    shapes = cfg.audio_shapes()
    bad = [f"{TABLE.format(k)} {t.shape}" for k, t in enumerate(tables)
           if t.shape != shapes[f"emb_ext.{k}.weight"]]
    bad += [f"{HEAD.format(k)} {h.shape}" for k, h in enumerate(heads) if h.shape != tables[0].shape]
    if bad:
        raise ModelFileError(f"{d}: table shapes do not fit the backbone ({', '.join(bad[:4])}; "
                             f"expected {shapes['emb_ext.0.weight']})")
    tokenizer = d / TOKENIZER
    if not tokenizer.is_file():
        raise ModelFileError(f"{d}: no {TOKENIZER}")
    arrays = {f"emb_ext.{k}.weight": np.asarray(t) for k, t in enumerate(tables)}
    arrays[AUDIO_HEADS] = np.concatenate(heads)   # one matmul per step, as from the converter
    return PublishedParts(cfg, TensorStore(arrays, weights.backend),
                          tokenizer.read_text(encoding="utf-8"))


def load_published(directory, backend=None, *, repack: bool | None = None,
                   **model_options) -> DelayModel:
    """A DelayModel from the published directory (no conversion); `repack` as DelayTTS.load's,
    model_options as DelayModel's (kv_type)."""
    d = Path(directory)
    weights = Weights.load(_backbone_gguf(d), get_backend(backend), repack=matmul_only(repack))
    try:
        return DelayModel(weights, published=read_parts(d, weights), **model_options)
    except BaseException:
        weights.close()
        raise
