"""MOSS-TTS-Local-Transformer-v1.5 prompts built by ids (docs/upstream-notes.md §family-4.5;
upstream `moss_tts_local_v1.5/processing_moss_tts.py`, its direct path for `build_user_message`).

Each template segment is tokenized on its own and the ids concatenated, so BPE never merges
across a boundary (P14); audio_start / audio_end are this model's 151669 / 151670 (P13); the
reference block has no `[S1]:` label; the text is not normalized.
"""

from __future__ import annotations

import numpy as np

from moss_tts.errors import InputError
from moss_tts.text.qwen_tokenizer import QwenTokenizer
from moss_tts.text.template import (ASSISTANT_ROLE, ASSISTANT_TURN_SEPARATOR, NO_REFERENCE,
                                    REFERENCE_OPENER, TEXT_LABEL, USER_CLOSER, USER_ROLE,
                                    PromptIds, check_fields, field_lines)


def field_value(value) -> str:
    """A template field as upstream writes it: None, empty or blank → "None", else stripped."""
    return "None" if value is None else str(value).strip() or "None"


def after_reference(fields: dict) -> str:
    """The template from the line after the references to "- Text:\\n"."""
    return field_lines(fields, field_value) + TEXT_LABEL


def build_prompt_rows(tokenizer: QwenTokenizer, ids: PromptIds, text: str, *,
                      references=None, prompt_codes=None, **fields) -> np.ndarray:
    """The prompt rows [S, 1 + n_vq] of one request, ending with the audio_start row that
    generation follows (or, continuation, the prompt audio's assistant-slot rows after it).

    references: a list of codes [T, n_vq] (None entries skipped), each written as [start],
    T rows [user_slot, codes], [end]; fields: instruction, tokens, quality, sound_event,
    ambient_sound, language. Continuation (`prompt_codes` [T, n_vq]): `text` holds the prompt
    audio's transcript and then the new text, and the references must be None (upstream)."""
    check_fields(fields)
    if not isinstance(text, str) or not text.strip():
        raise InputError("text is empty")
    refs = [_check_codes(r, ids.n_vq) for r in references or [] if r is not None]
    if refs and prompt_codes is not None:
        raise InputError("a continuation prompt cannot be combined with references: give one")
    enc = tokenizer.encode
    parts = [_text_rows([ids.im_start] + enc(USER_ROLE) + enc(REFERENCE_OPENER), ids)]
    for codes in refs:
        parts += [_text_rows([ids.audio_start], ids), _audio_rows(codes, ids.user_slot, ids),
                  _text_rows([ids.audio_end], ids)]
    tail = [] if refs else enc(NO_REFERENCE)
    tail += enc(after_reference(fields)) + enc(text) + enc(USER_CLOSER) + [ids.im_end] + \
        enc(ASSISTANT_TURN_SEPARATOR) + [ids.im_start] + enc(ASSISTANT_ROLE) + [ids.audio_start]
    parts.append(_text_rows(tail, ids))
    if prompt_codes is not None:
        parts.append(_audio_rows(_check_codes(prompt_codes, ids.n_vq), ids.gen_slot, ids))
    return np.vstack(parts)


def _text_rows(token_ids: list[int], ids: PromptIds) -> np.ndarray:
    rows = np.full((len(token_ids), 1 + ids.n_vq), ids.audio_pad, dtype=np.int64)
    rows[:, 0] = token_ids
    return rows


def _audio_rows(codes: np.ndarray, slot: int, ids: PromptIds) -> np.ndarray:
    return np.column_stack([np.full(len(codes), slot, dtype=np.int64), codes])


def _check_codes(codes, n: int) -> np.ndarray:
    codes = np.asarray(codes)
    if codes.ndim != 2 or codes.shape[1] != n or codes.dtype.kind not in "iu" or not len(codes):
        raise InputError(f"audio codes must be integers [frames ≥ 1, {n}], got "
                         f"{codes.dtype} {list(codes.shape)}")
    return codes.astype(np.int64)
