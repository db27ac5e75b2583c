"""MOSS-TTS-Nano prompt rows (docs/upstream-notes.md §nano-5.1-5.3).

Follows upstream HF `prompting.py` (template segments, each encoded on its own) and
`modeling_moss_tts_nano.py` `build_inference_input_ids` / `_resolve_inference_mode` (row layouts,
mode rules). A row is `[text id, c0..c15]`: text rows carry the audio pad in every code column,
audio rows carry a slot id (8 = reference / user, 9 = assistant) in the text column.
"""

from dataclasses import dataclass

import numpy as np

from moss_tts.errors import ConfigError, InputError
from moss_tts.text.template import (ASSISTANT_ROLE, ASSISTANT_TURN_SEPARATOR, NO_REFERENCE,
                                    REFERENCE_OPENER, TEXT_LABEL, USER_CLOSER, USER_ROLE,
                                    field_lines)

# The template segments (text/template.py; docs/upstream-notes.md §nano-5.1) are encoded one by
# one: the tokenizer folds the newlines into spaces and gives each segment its own leading `▁`,
# so segment boundaries change the ids. Nano's template leaves every field None.
AFTER_REFERENCE = field_lines({}) + TEXT_LABEL

MODES = ("voice_clone", "continuation")


@dataclass(frozen=True)
class NanoPromptIds:
    """Special ids of the prompt; field names and real values of the upstream `config.json`."""

    im_start_token_id: int = 4
    im_end_token_id: int = 5
    audio_start_token_id: int = 6
    audio_end_token_id: int = 7
    audio_user_slot_token_id: int = 8
    audio_assistant_slot_token_id: int = 9
    audio_pad_token_id: int = 1024
    n_vq: int = 16

    def __post_init__(self):
        if self.n_vq < 1:
            raise ConfigError(f"n_vq must be >= 1, got {self.n_vq}")


def _encode(tokenizer, segment):
    return [int(i) for i in tokenizer.encode(segment)]


def _encode_user_text(tokenizer, text):
    # Control-token spellings in user text never become control ids (text/specials.py).
    return [int(i) for i in tokenizer.encode(text, sanitize_specials=True)]


def user_prefix_ids(tokenizer, ids=NanoPromptIds(), *, onnx_manifest_form=False):
    """P_user: [<|im_start|>] + enc("user⏎") + enc("<user_inst>⏎- Reference(s):⏎").

    The official ONNX manifest's pre-tokenized prefix lacks the leading <|im_start|>; the HF
    builder and the training data have it, so that form is canonical (docs/upstream-notes.md
    §nano-5.2).
    """
    lead = [] if onnx_manifest_form else [ids.im_start_token_id]
    return lead + _encode(tokenizer, USER_ROLE) + _encode(tokenizer, REFERENCE_OPENER)


def after_reference_ids(tokenizer):
    """P_after: enc("⏎- Instruction:⏎None⏎ … - Text:⏎")."""
    return _encode(tokenizer, AFTER_REFERENCE)


def assistant_prefix_ids(tokenizer, ids=NanoPromptIds()):
    """P_asst: enc("⏎</user_inst>") + [<|im_end|>] + enc("⏎") + [<|im_start|>] + enc("assistant⏎").

    enc("⏎") is empty with the real tokenizer; it is still encoded, as upstream does.
    """
    return (
        _encode(tokenizer, USER_CLOSER)
        + [ids.im_end_token_id]
        + _encode(tokenizer, ASSISTANT_TURN_SEPARATOR)
        + [ids.im_start_token_id]
        + _encode(tokenizer, ASSISTANT_ROLE)
    )


def text_rows(token_ids, ids=NanoPromptIds()):
    """[L, n_vq + 1] int32: each id in column 0, the audio pad in every code column."""
    rows = np.full((len(token_ids), ids.n_vq + 1), ids.audio_pad_token_id, dtype=np.int32)
    rows[:, 0] = np.asarray(token_ids, dtype=np.int64)
    return rows


def audio_rows(codes, slot_token_id, ids=NanoPromptIds()):
    """[F, n_vq + 1] int32: the slot id in column 0, the frame's codes after it."""
    rows = np.empty((codes.shape[0], ids.n_vq + 1), dtype=np.int32)
    rows[:, 0] = slot_token_id
    rows[:, 1:] = codes
    return rows


def _check_codes(codes, what, ids):
    try:
        array = np.asarray(codes)
    except (TypeError, ValueError) as exc:
        raise InputError(f"{what} are not an array of integer codes: {exc}") from exc
    if array.ndim != 2 or array.shape[1] != ids.n_vq or array.shape[0] < 1:
        raise InputError(
            f"{what} must have shape [frames >= 1, {ids.n_vq}], got {list(array.shape)}"
        )
    if not np.issubdtype(array.dtype, np.integer):
        raise InputError(f"{what} must be integers, got dtype {array.dtype}")
    low, high = int(array.min()), int(array.max())
    if low < 0 or high > ids.audio_pad_token_id:  # the pad itself marks an unused codebook
        raise InputError(
            f"{what} must lie in [0, {ids.audio_pad_token_id}], got values in [{low}, {high}]"
        )
    return array


def check_mode(mode, *, has_reference, has_prompt_text, has_prompt_codes):
    """Upstream's mode rules, with one-line `InputError`s."""
    if mode not in MODES:
        raise InputError(f"unknown mode {mode!r}; expected one of {', '.join(MODES)}")
    if mode == "voice_clone":
        if not has_reference:
            raise InputError("voice_clone mode needs reference codes (a reference recording)")
        if has_prompt_text or has_prompt_codes:
            raise InputError(
                "voice_clone mode takes no prompt text or prompt codes; use continuation"
            )
        return
    if has_reference:
        raise InputError("continuation mode takes prompt codes, not reference codes")
    if has_prompt_text != has_prompt_codes:
        raise InputError(
            "continuation mode takes prompt text and prompt codes together, or neither"
        )


def build_rows(
    tokenizer,
    text,
    *,
    mode="voice_clone",
    reference_codes=None,
    prompt_text=None,
    prompt_codes=None,
    ids=NanoPromptIds(),
    onnx_manifest_form=False,
):
    """Prompt rows [L, n_vq + 1] int32 for one utterance; generation continues after the last row.

    - voice_clone:  T(P_user + [6]) ; A(reference, 8) ; T([7] + P_after + enc(text) + P_asst + [6])
    - continuation: T(P_user + enc("None") + P_after + enc(text) + P_asst) ; T([6])
    - continuation with a prompt: as above with enc(prompt_text + text) (no separator), then
      A(prompt_codes, 9) after the [6] row.

    Special pieces are always stripped from `text` / `prompt_text` (never from the template),
    unlike upstream; `onnx_manifest_form` drops the leading <|im_start|> as the ONNX manifest does.

    >>> rows = build_rows(tok, "Hello.", reference_codes=codes)  # doctest: +SKIP
    >>> rows[-1].tolist() == [6] + [1024] * 16  # doctest: +SKIP
    True
    """
    if not isinstance(text, str) or not text.strip():
        raise InputError("text is empty")
    if prompt_text is not None and (not isinstance(prompt_text, str) or not prompt_text.strip()):
        raise InputError("prompt text is empty; pass None for continuation without a prompt")
    check_mode(
        mode,
        has_reference=reference_codes is not None,
        has_prompt_text=prompt_text is not None,
        has_prompt_codes=prompt_codes is not None,
    )

    if mode == "voice_clone":
        reference = _check_codes(reference_codes, "reference codes", ids)
        head = user_prefix_ids(tokenizer, ids, onnx_manifest_form=onnx_manifest_form) + [
            ids.audio_start_token_id
        ]
        tail = (
            [ids.audio_end_token_id]
            + after_reference_ids(tokenizer)
            + _encode_user_text(tokenizer, text)
            + assistant_prefix_ids(tokenizer, ids)
            + [ids.audio_start_token_id]
        )
        sections = [
            text_rows(head, ids),
            audio_rows(reference, ids.audio_user_slot_token_id, ids),
            text_rows(tail, ids),
        ]
    else:
        spoken = text if prompt_text is None else prompt_text + text  # upstream joins with no space
        prompt = (
            user_prefix_ids(tokenizer, ids, onnx_manifest_form=onnx_manifest_form)
            + _encode(tokenizer, NO_REFERENCE)
            + after_reference_ids(tokenizer)
            + _encode_user_text(tokenizer, spoken)
            + assistant_prefix_ids(tokenizer, ids)
        )
        sections = [text_rows(prompt, ids), text_rows([ids.audio_start_token_id], ids)]
        if prompt_codes is not None:
            codes = _check_codes(prompt_codes, "prompt codes", ids)
            sections.append(audio_rows(codes, ids.audio_assistant_slot_token_id, ids))
    return np.concatenate(sections, axis=0)
