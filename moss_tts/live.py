"""Feeding a live session (MOSS-TTS-Realtime `LiveSession`) from a text source that arrives in
arbitrary pieces — stdin for `tts --live`, WebSocket messages for the server.

A session cuts its text a character at a time, so the speech does not depend on how a pipe or a
socket split the text; the text is still pushed here one character at a time so that a long
delta (a paste) gives its first audio as soon as that is ready, not after the whole delta.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

import numpy as np

from .errors import InputError


def push_as_typed(session, text: str) -> Iterator[np.ndarray]:
    """`text` pushed character by character → the float32 audio [n] each push made ready, as
    soon as it is (empty pushes left out)."""
    for ch in text:
        audio = session.push_text(ch)
        if audio.size:
            yield audio


def live_chunks(session, deltas: Iterable[str], channels: int) -> Iterator[np.ndarray]:
    """Audio [n, channels] as the text comes: what each delta makes ready, then the drain to the
    end of speech once the text ends. The session is closed when this ends or is closed.
    No audio at all is an InputError saying why (no text came, or the model said nothing),
    never an empty output that looks like success."""
    heard = made = False
    try:
        for delta in deltas:
            heard = heard or bool(delta.strip())
            for audio in push_as_typed(session, delta):
                made = True
                yield as_frames(audio, channels)
        session.end_text()
        for chunk in session.drain():
            made = made or bool(chunk.size)
            yield as_frames(chunk, channels)
    finally:
        session.close()
    if not made:
        raise InputError("no audio was made: " + (
            "the model ended the speech before its first frame" if heard else
            "no text arrived (stdin was empty): pipe the text to speak into --live"))


def as_frames(audio, channels: int) -> np.ndarray:
    """A session's samples [n] → [n / channels, channels], the layout of every other stream."""
    return np.asarray(audio, np.float32).reshape(-1, channels)
