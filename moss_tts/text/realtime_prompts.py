"""MossTTSRealtime prompts built by ids (docs/upstream-notes.md §family-5.4; upstream
`moss_tts_realtime/mossttsrealtime/processing_mossttsrealtime.py`, `inferencer.py`,
`finetuning/dataset.py`): the system block, the optional voice-clone context block, user
turns with text and optional user audio, the assistant prefix, and the 12-token text lead
with BOS on codebook 0 of its last row.

Layout choice (P17): the training layout of `finetuning/dataset.py` — the first turn after
the system block opens with `<|im_start|>{role}\\n`, later turns with
`<|im_end|>\\n<|im_start|>{role}\\n` (closing the previous turn). The demo apps put
`<|im_end|>\\n` before the first user turn too (a doubled `<|im_end|>\\n` after the system
block); the single-turn inferencer agrees with the training layout, and so do we.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from moss_tts.errors import InputError
from moss_tts.text.qwen_tokenizer import QwenTokenizer

# The system block's text between `<|im_start|>` and `<|im_end|>` (upstream spelling, the
# space before the first newline included)
SYSTEM = ("system\nYou are a highly expressive text-to-speech (TTS) engine developed by Mosi "
          "Intelligence. \nYou possess natural language understanding, emotional modeling, and "
          "multi-style speech generation capabilities, allowing you to generate the "
          "corresponding speech based on the text given in the assistant.")
VOICE = "context\nThe assistant section should be synthesized using the following voice timbre:"


@dataclass(frozen=True)
class RealtimePromptIds:
    """The ids a prompt is made of (§family-1.2, §family-5.1); the model config provides them."""

    rvq: int
    im_start: int
    im_end: int
    reference_audio_pad: int     # <|audio_pad|>: a row carrying a reference frame
    text_pad: int                # <|text_pad|>: the text channel once the text is spent
    audio_pad: int               # the pad code of every audio channel
    audio_bos: int
    audio_eos: int
    lead: int = 12               # text tokens ahead of the first frame (delay_tokens_len)


def text_rows(text_ids, ids: RealtimePromptIds) -> np.ndarray:
    """Text-only rows [len, 1 + rvq]: the ids on channel 0, pad codes elsewhere."""
    text_ids = np.asarray(text_ids, dtype=np.int64).reshape(-1)
    rows = np.full((len(text_ids), 1 + ids.rvq), ids.audio_pad, dtype=np.int64)
    rows[:, 0] = text_ids
    return rows


def check_codes(codes, ids: RealtimePromptIds, what: str) -> np.ndarray:
    """Codec codes [frames, ≥ rvq] → their first rvq codebooks, checked."""
    codes = np.asarray(codes)
    if codes.ndim != 2 or codes.shape[1] < ids.rvq or codes.dtype.kind not in "iu":
        raise InputError(f"{what} must be integer codes [frames, {ids.rvq}], got "
                         f"{codes.dtype} {codes.shape}")
    codes = codes[:, :ids.rvq].astype(np.int64)
    if codes.size and (codes.min() < 0 or codes.max() >= ids.audio_pad):
        raise InputError(f"{what} codes must lie in [0, {ids.audio_pad})")
    return codes


def system_rows(tokenizer: QwenTokenizer, ids: RealtimePromptIds, voice=None) -> np.ndarray:
    """The system block, then (voice codes [T, ≥ rvq]) the context block whose T
    `<|audio_pad|>` rows carry the reference frames (first rvq codebooks)."""
    nl = tokenizer.encode("\n")
    text = [ids.im_start] + tokenizer.encode(SYSTEM) + [ids.im_end] + nl
    rows = text_rows(text, ids)
    if voice is None:
        return rows
    codes = check_codes(voice, ids, "the voice reference")
    head = [ids.im_start] + tokenizer.encode(VOICE)
    block = text_rows(head + [ids.reference_audio_pad] * len(codes) + [ids.im_end] + nl, ids)
    block[len(head):len(head) + len(codes), 1:] = codes
    return np.vstack([rows, block])


def turn_prefix(tokenizer: QwenTokenizer, ids: RealtimePromptIds, role: str,
                first: bool) -> list[int]:
    """`<|im_start|>{role}\\n`, after `<|im_end|>\\n` unless this is the first turn (P17)."""
    start = [ids.im_start] + tokenizer.encode(f"{role}\n")
    return start if first else [ids.im_end] + tokenizer.encode("\n") + start


def lead_rows(text_ids, ids: RealtimePromptIds) -> np.ndarray:
    """The first (≤ lead) text tokens of an assistant turn as rows, BOS on codebook 0 of the
    last one: the first frame follows it (P15)."""
    if len(text_ids) == 0:
        raise InputError("an assistant turn needs at least one text token")
    rows = text_rows(text_ids, ids)
    rows[-1, 1] = ids.audio_bos
    return rows


def eos_row(ids: RealtimePromptIds) -> np.ndarray:
    """The row closing a turn's audio: `<|text_pad|>`, EOS on codebook 0, pad elsewhere."""
    row = text_rows([ids.text_pad], ids)
    row[0, 1] = ids.audio_eos
    return row


def user_turn_rows(tokenizer: QwenTokenizer, ids: RealtimePromptIds, text: str, audio=None, *,
                   first: bool) -> np.ndarray:
    """A user turn. With user audio (codes [T, ≥ rvq]) as training's `_build_turn`: the text,
    `<|text_pad|>` fillers, BOS on codebook 0 of row P+lead−1 (or the last text row when the
    text is shorter than the lead), the frames after it, EOS on the row after them. Without
    audio, plain text rows, as upstream's apps send text-only user turns."""
    prefix = turn_prefix(tokenizer, ids, "user", first)
    words = tokenizer.encode(text) if text else []
    if audio is None:
        if not words:
            raise InputError("a user turn needs text or audio")
        return text_rows(prefix + words, ids)
    codes = check_codes(audio, ids, "the user audio")
    start = len(prefix) + min(len(words), ids.lead)     # the first frame's row
    n_rows = max(len(prefix) + len(words), start + len(codes) + 1)
    text = prefix + words + [ids.text_pad] * (n_rows - len(prefix) - len(words))
    rows = text_rows(text, ids)
    rows[start - 1, 1] = ids.audio_bos
    rows[start:start + len(codes), 1:] = codes
    rows[start + len(codes), 1] = ids.audio_eos
    return rows


def assistant_prefix_rows(tokenizer: QwenTokenizer, ids: RealtimePromptIds, *,
                          first: bool) -> np.ndarray:
    return text_rows(turn_prefix(tokenizer, ids, "assistant", first), ids)


def build_generation_rows(tokenizer: QwenTokenizer, ids: RealtimePromptIds, text: str, *,
                          voice=None) -> tuple[np.ndarray, list[int]]:
    """One assistant turn as upstream's inferencer: (prompt rows = system [+ context] +
    `<|im_start|>assistant\\n` + the lead rows, the text ids still to feed one per frame)."""
    if not isinstance(text, str) or not text.strip():
        raise InputError("text is empty")
    words = tokenizer.encode(text)
    rows = np.vstack([system_rows(tokenizer, ids, voice),
                      assistant_prefix_rows(tokenizer, ids, first=True),
                      lead_rows(words[:ids.lead], ids)])
    return rows, words[ids.lead:]
