"""MossTTSDelay prompts built by ids (docs/upstream-notes.md §family-2.4; upstream
`processing_moss_tts.py`): the user template with its fields, the references' audio blocks with
their delayed codes, the chat wrapping without a system prompt. A generation prompt ends at
`assistant\n`, as the Hugging Face processor's `mode="generation"` (the model samples
AUDIO_START itself); MossTTSLocal's processor appends an AUDIO_START row (`start_audio`).
"""

from __future__ import annotations

import numpy as np

from moss_tts.errors import InputError
from moss_tts.text.normalize import normalize_delay_text
from moss_tts.text.qwen_tokenizer import QwenTokenizer
from moss_tts.text.template import (ASSISTANT_ROLE, ASSISTANT_TURN_SEPARATOR, NO_REFERENCE,
                                    REFERENCE_OPENER, TEXT_LABEL, USER_CLOSER, USER_ROLE,
                                    PromptIds, check_fields, field_lines)


def delay(codes: np.ndarray, pad: int) -> np.ndarray:
    """codes [T, N] → the staircase [T + N − 1, N] with grid[t + k, k] = codes[t, k], pad
    elsewhere (§family-2.5): the layout of audio in prompts and in generated rows alike."""
    t, n = codes.shape
    grid = np.full((t + n - 1, n), pad, dtype=codes.dtype)
    for k in range(n):
        grid[k:k + t, k] = codes[:, k]
    return grid


def block_rows(frames: int, n_vq: int, delayed: bool) -> int:
    """Slot rows of a user audio block of `frames` frames: the staircase's T + n_vq − 1, or T
    undelayed (an empty block has none)."""
    return frames + n_vq - 1 if delayed and frames else frames


def user_pieces(text: str, references, fields: dict) -> list:
    """The user content as text pieces and reference code arrays, in template order; text
    between two audio items is one piece, tokenized at once as upstream's string is."""
    refs = [(i, r) for i, r in enumerate(references or []) if r is not None]
    if not refs:
        pieces = [REFERENCE_OPENER + NO_REFERENCE]
    else:      # numbering counts references left as None too
        pieces = [REFERENCE_OPENER]
        for j, (i, codes) in enumerate(refs):
            pieces += [("\n" if j else "") + f"[S{i + 1}]:\n", codes]
    merged = []
    for piece in pieces + [f"{field_lines(fields)}{TEXT_LABEL}{text}{USER_CLOSER}"]:
        if isinstance(piece, str) and merged and isinstance(merged[-1], str):
            merged[-1] += piece
        else:
            merged.append(piece)
    return merged


def build_generation_rows(tokenizer: QwenTokenizer, ids: PromptIds, text: str, *,
                          references=None, prompt_codes=None, normalize: bool = True,
                          start_audio: bool = False, delayed: bool = True,
                          **fields) -> np.ndarray:
    """The prompt rows [S, 1 + n_vq] of one request: `<|im_start|>user\\n{content}<|im_end|>\\n
    <|im_start|>assistant\\n`, where upstream's Delay processor ends a generation prompt (its
    `generate` then samples AUDIO_START under the step-0 masks, §family-2.6); with start_audio
    the AUDIO_START row follows (MossTTSLocal's processor, §family-3.5). references: a list of
    codes [T, n_vq] (or None entries); fields: instruction, tokens, quality, sound_event,
    ambient_sound, language. text None is written as the word None, as upstream's template
    writes a user message without text (MOSS-SoundEffect's).

    Continuation (P28, `prompt_codes` [T, n_vq], the text then holding the prompt's transcript
    and the new text): the assistant turn carries that audio and is cut after its T-th GEN
    row, so the staircase is incomplete — generation re-samples its tail.

    `delayed` False is MossTTSLocal's layout (§family-3.5): an audio block of T frames is T slot
    rows carrying the codes row for row, no staircase (a continuation then ends on its last frame);
    MossTTSLocal also passes normalize=False (its processor does not normalize)."""
    check_fields(fields)
    if text is not None and (not isinstance(text, str) or not text.strip()):
        raise InputError("text is empty")
    if normalize and text is not None:   # upstream's build_user_message normalizes the
        text = normalize_delay_text(text)  # text field only (§family-7), with Delay's copy:
        # tags such as [pause 3.2s] stay; no text is the word None
    n = ids.n_vq
    text_ids, blocks = [ids.im_start], []
    pieces = user_pieces(text, references, fields)
    pieces[0] = USER_ROLE + pieces[0]
    for piece in pieces:
        if isinstance(piece, str):
            text_ids += tokenizer.encode(piece)
            continue
        codes = _check_codes(piece, n)
        text_ids.append(ids.audio_start)
        blocks.append((len(text_ids), codes))      # the staircase starts after AUDIO_START
        text_ids += [ids.user_slot] * block_rows(len(codes), n, delayed)
        text_ids.append(ids.audio_end)
    text_ids += [ids.im_end] + tokenizer.encode(ASSISTANT_TURN_SEPARATOR) + [ids.im_start] + \
        tokenizer.encode(ASSISTANT_ROLE)
    if prompt_codes is not None:
        prompt_codes = _check_codes(prompt_codes, n)
        text_ids.append(ids.audio_start)
        blocks.append((len(text_ids), prompt_codes))
        text_ids += [ids.gen_slot] * len(prompt_codes)
    elif start_audio:
        text_ids.append(ids.audio_start)
    rows = np.full((len(text_ids), 1 + n), ids.audio_pad, dtype=np.int64)
    rows[:, 0] = text_ids
    for at, codes in blocks:
        laid = delay(codes, ids.audio_pad) if delayed else codes
        laid = laid[:len(rows) - at]                # a continuation's staircase is cut (P28)
        rows[at:at + len(laid), 1:] = laid
    return rows


def _check_codes(codes, n: int) -> np.ndarray:
    codes = np.asarray(codes)
    if codes.ndim != 2 or codes.shape[1] != n or codes.dtype.kind not in "iu":
        raise InputError(f"audio codes must be integers [frames, {n}], got "
                         f"{codes.dtype} {codes.shape}")
    return codes
