"""The rows every family's backbone reads, [text id, code_0 … code_{N−1}], checked and turned into
graph inputs: `row_feed` where every code has a row in its audio table (Delay, Local,
Realtime: the pad's too), `masked_row_feed` where the pad code has none and is masked out
(Nano, Local v1.5); and `check_ids`, the special ids of a MossTTSDelayConfig-style config.
"""

from __future__ import annotations

from dataclasses import fields

import numpy as np

from ..errors import ConfigError, InputError


def check_ids(cfg, family: str) -> None:
    """The pad code inside the audio tables and every `*_token_id` inside the text vocabulary
    of a config with MossTTSDelayConfig's fields (Delay's, Local's)."""
    if not 0 <= cfg.audio_pad_code <= cfg.audio_vocab_size:
        raise ConfigError(f"{family}: audio_pad_code {cfg.audio_pad_code} is outside the "
                          f"{cfg.audio_vocab_size + 1} rows of each audio table")
    top = max(getattr(cfg, f.name) for f in fields(cfg) if f.name.endswith("_token_id"))
    if top >= cfg.vocab_size:
        raise ConfigError(f"{family}: special id {top} lies outside the text vocabulary of "
                          f"{cfg.vocab_size}")


def check_rows(rows, cfg) -> np.ndarray:
    """rows int [S, 1 + cfg.n_vq] with text ids in the vocabulary (cfg.vocab_size) and codes in
    the tables (cfg.audio_rows, the pad code's row and any other special code's included)."""
    rows = np.asarray(rows)
    if rows.dtype.kind not in "iu":
        raise InputError(f"rows must be integers, got dtype {rows.dtype}")
    if rows.ndim != 2 or rows.shape[1] != cfg.n_vq + 1 or rows.shape[0] == 0:
        raise InputError(f"rows must have shape [S, {cfg.n_vq + 1}], got {rows.shape}")
    if rows[:, 0].min() < 0 or rows[:, 0].max() >= cfg.vocab_size:
        raise InputError(f"text ids must lie in [0, {cfg.vocab_size})")
    if rows[:, 1:].min() < 0 or rows[:, 1:].max() >= cfg.audio_rows:
        raise InputError(f"audio codes must lie in [0, {cfg.audio_rows}) (the pad code "
                         "included)")
    return rows


def row_feed(rows: np.ndarray) -> dict[str, np.ndarray]:
    """Checked rows → the graph inputs "rows.text" and "rows.code.<k>" (int32 [S] each)."""
    rows = rows.astype(np.int32)
    return {"rows.text": rows[:, 0]} | {f"rows.code.{k}": rows[:, k + 1]
                                        for k in range(rows.shape[1] - 1)}


def masked_row_feed(rows, cfg) -> dict[str, np.ndarray]:
    """rows int [L, n_vq + 1] → graph inputs: text ids, and per channel safe code ids plus a 0/1
    mask "rows.mask.<k>" (the pad id lies outside every table, so it is looked up as 0 and
    masked out). cfg: n_vq, vocab_size, audio_vocab_size, audio_pad_token_id."""
    rows = np.asarray(rows)
    if rows.dtype.kind not in "iu":
        raise InputError(f"prompt rows must be integers, got dtype {rows.dtype}")
    if rows.ndim != 2 or rows.shape[1] != cfg.n_vq + 1 or rows.shape[0] == 0:
        raise InputError(f"prompt rows must have shape [L, {cfg.n_vq + 1}], got {rows.shape}")
    text, codes = rows[:, 0], rows[:, 1:]
    if text.min() < 0 or text.max() >= cfg.vocab_size:
        raise InputError(f"text ids must lie in [0, {cfg.vocab_size})")
    pad = codes == cfg.audio_pad_token_id
    if ((codes < 0) | ((codes >= cfg.audio_vocab_size) & ~pad)).any():
        raise InputError(f"audio codes must lie in [0, {cfg.audio_vocab_size}) or be the pad "
                         f"id {cfg.audio_pad_token_id}")
    feed = {"rows.text": text.astype(np.int32)}
    for c in range(cfg.n_vq):
        feed[f"rows.code.{c}"] = np.where(pad[:, c], 0, codes[:, c]).astype(np.int32)
        feed[f"rows.mask.{c}"] = (~pad[:, c]).astype(np.float32)[:, None]
    return feed
