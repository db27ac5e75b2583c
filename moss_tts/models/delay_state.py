"""MossTTSDelay's generation state machine and de-delay (docs/upstream-notes.md §family-2.5-2.6;
upstream `modeling_moss_tts.py::generate`, `llama_cpp/delay_state.py`): which text token is forced
or allowed, which codebooks are sampled on a row, and how the state moves on. The staircase
itself (`delay`) lives with the prompts (text/delay_prompts.py), which lay audio out in it."""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np


@dataclass(frozen=True)
class DelayIds:
    """The ids the state machine reads (§family-1.2); the model config provides them."""

    n_vq: int
    pad_token_id: int
    im_end_token_id: int
    audio_start_token_id: int
    audio_end_token_id: int
    audio_assistant_gen_slot_token_id: int
    audio_assistant_delay_slot_token_id: int
    audio_pad_code: int


def de_delay(grid: np.ndarray) -> np.ndarray:
    """The staircase [R, N] → codes [R − N + 1, N] with codes[t, k] = grid[t + k, k] (no frame
    when R < N)."""
    r, n = grid.shape
    t = max(0, r - n + 1)
    codes = np.empty((t, n), dtype=grid.dtype)
    for k in range(n):
        codes[:, k] = grid[k:k + t, k]
    return codes


def audio_segments(codes: np.ndarray, pad: int) -> list[np.ndarray]:
    """De-delayed codes [T, N] split at frames that are entirely pad (§family-2.8)."""
    keep = ~(codes == pad).all(axis=1)
    edges = np.flatnonzero(np.diff(np.concatenate([[False], keep, [False]]).astype(np.int8)))
    return [codes[a:b] for a, b in zip(edges[::2], edges[1::2])]


@dataclass(frozen=True)
class DelayState:
    """Per-sequence state (§family-2.6): rows since the current AUDIO_START (counting it), rows
    since the first DELAY (None while not flushing), in audio, stopping, generated rows."""

    audio_len: int = 0
    delayed: int | None = None
    is_audio: bool = False
    stopping: bool = False
    step: int = 0

    @classmethod
    def from_prompt(cls, text_ids: np.ndarray, ids: DelayIds) -> "DelayState":
        """A prompt ending in AUDIO_START or a GEN slot continues that audio item; any other
        prompt starts outside audio."""
        text_ids = np.asarray(text_ids)
        starts = np.flatnonzero(text_ids == ids.audio_start_token_id)
        last = int(text_ids[-1])
        if starts.size and last in (ids.audio_start_token_id,
                                    ids.audio_assistant_gen_slot_token_id):
            return cls(audio_len=len(text_ids) - int(starts[-1]), is_audio=True)
        return cls()


def forced_text(state: DelayState, ids: DelayIds) -> int | None:
    """The text token the flush forces (no sampling, no RNG draw, P3), or None."""
    if state.delayed is not None and state.delayed < ids.n_vq:
        return ids.audio_assistant_delay_slot_token_id
    if state.delayed == ids.n_vq:
        return ids.audio_end_token_id
    return None


def text_allowed(state: DelayState, ids: DelayIds, vocab: int) -> np.ndarray:
    """bool [vocab]: the text ids the model may sample now (P3)."""
    if state.is_audio:
        ok = np.zeros(vocab, dtype=bool)
        ok[[ids.audio_assistant_gen_slot_token_id, ids.audio_assistant_delay_slot_token_id]] = True
    else:
        ok = np.ones(vocab, dtype=bool)
        ok[[ids.pad_token_id, ids.audio_assistant_gen_slot_token_id,
            ids.audio_assistant_delay_slot_token_id, ids.audio_end_token_id]] = False
    if state.step == 0:
        ok[ids.audio_assistant_delay_slot_token_id] = False
    if state.step <= ids.n_vq:
        ok[ids.im_end_token_id] = False
    return ok


def audio_channels(state: DelayState, ids: DelayIds) -> np.ndarray:
    """bool [n_vq]: codebook k is sampled on this row iff k < audio_len and, while flushing,
    k ≥ delayed (read before this row's update)."""
    k = np.arange(ids.n_vq)
    on = k < state.audio_len
    return on if state.delayed is None else on & (k >= state.delayed)


def advance(state: DelayState, token: int, ids: DelayIds) -> DelayState:
    """The state after a row whose text token is `token`."""
    audio_len, delayed = state.audio_len, state.delayed
    if token in (ids.audio_start_token_id, ids.audio_assistant_gen_slot_token_id,
                 ids.audio_assistant_delay_slot_token_id):
        audio_len += 1
    elif token == ids.audio_end_token_id:
        audio_len = 0
    if delayed is None and token == ids.audio_assistant_delay_slot_token_id:
        delayed = 0
    if delayed is not None:
        delayed = None if delayed + 1 > ids.n_vq else delayed + 1
    is_audio = (state.is_audio or token == ids.audio_start_token_id) \
        and token != ids.audio_end_token_id
    return replace(state, audio_len=audio_len, delayed=delayed, is_audio=is_audio,
                   stopping=state.stopping or token == ids.im_end_token_id, step=state.step + 1)
