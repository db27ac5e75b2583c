"""When a stream hands its generated frames to the codec (docs/upstream-notes.md §family-4.7):
upstream's adaptive ladder, shared by the families that decode through the 24 kHz and v2 codecs,
and one rule of ours for hosts where a codec push costs more than the audio it makes.

Streaming decode is exact however frames are grouped (bit for bit through an f32, f16 or q8_0
decoder; to the kernels' summation order through a K-quant one: codec/codec.py), so the grouping
changes only when audio arrives and what it costs: one push reads all the decoder's weights
whatever its frames, so on a CPU a one-frame push of the 24 kHz codec costs more than its 80 ms
of audio while eight frames cost a fraction each (docs/performance.md, "Streaming through the
codecs")."""

from __future__ import annotations

import time
from collections.abc import Iterator

import numpy as np

from ..codec.codec import STREAM_PUSH_FRAMES
from ..errors import whole_number

FIRST_CHUNK_FRAMES = 4     # 320 ms: a one-frame first packet underruns playback (§family-4.7)
# (generation lead in s, frames per codec push) once audio flows: short pushes while generation
# barely keeps up, longer ones (fewer codec calls) once it is ahead (upstream streaming.py)
LEAD_LADDER = ((0.16, 2), (0.32, 3), (0.64, 4), (1.0, 6))
MAX_CHUNK_FRAMES = STREAM_PUSH_FRAMES   # the ladder's top: the codec stream's largest push
# the `stream` keywords of whole audio (a family's `WHOLE`, models/tts.py): no first chunk to
# wait for, fixed pushes of the ladder's top — fewer codec calls, the same floats on every run
WHOLE_PUSHES = {"chunk_frames": MAX_CHUNK_FRAMES}


def ladder_frames(lead_seconds: float | None, *, first: int = FIRST_CHUNK_FRAMES,
                  steps=LEAD_LADDER, longest: int = MAX_CHUNK_FRAMES) -> int:
    """Frames the next codec push waits for: `first` before any audio (lead None), then by
    the generation lead (≤ 0 → 1, < 0.16 → 2, < 0.32 → 3, < 0.64 → 4, < 1 → 6, else 8)."""
    if lead_seconds is None:
        return first
    if lead_seconds <= 0.0:
        return 1
    return next((frames for bound, frames in steps if lead_seconds < bound), longest)


def chunk_frames_of(value) -> int:
    """The `chunk_frames` keyword of a family's `stream`: 0 (the adaptive ladder) or a fixed
    number of frames per codec push."""
    return whole_number(value, "chunk_frames (0 = adaptive)", 0)


class ChunkLadder:
    """When to push pending frames to the codec: a fixed chunk (`fixed` > 0), or upstream's
    adaptive ladder, whose lead is the audio generated since the first push minus the wall time
    since then (upstream's `_generation_lead_seconds`; the codec runs inline here, so no decode
    queue builds), with a catch-up rule of ours: a push that took more than half the time of
    the audio it made (the codec alone leaves generation less than half of real time) makes a
    stream that is behind wait for twice as many frames before its next push, up to
    MAX_CHUNK_FRAMES — the frames pile up and one push decodes them all, each for a fraction of
    a one-frame push's cost (one push reads all the decoder's weights); the size is kept while
    pushes take a quarter to a half of their audio's time and halved below a quarter. Where the
    codec is cheap (a GPU, the Nano codec) this is upstream's ladder unchanged. `first`,
    `steps`, `longest`: the ladder's shape (Realtime's is one frame a push, as upstream's
    streaming bridge)."""

    def __init__(self, frame_rate: float, *, fixed: int = 0, first: int = FIRST_CHUNK_FRAMES,
                 steps=LEAD_LADDER, longest: int = MAX_CHUNK_FRAMES, clock=time.perf_counter):
        self.frame_rate, self.fixed, self.clock = frame_rate, fixed, clock
        self.shape = {"first": first, "steps": steps, "longest": longest}
        self.first_at = None
        self.frames_since_first = 0
        self.catch_up = 0          # frames the next push waits for while behind (0: the ladder)

    def lead(self) -> float | None:
        if self.first_at is None:
            return None
        return self.frames_since_first / self.frame_rate - (self.clock() - self.first_at)

    def wanted(self) -> int:
        """Frames the next push waits for, now."""
        if self.fixed:
            return self.fixed
        lead = self.lead()
        if self.catch_up and lead is not None and lead <= 0.0:
            return self.catch_up
        return ladder_frames(lead, **self.shape)

    def ready(self, n_pending: int) -> bool:
        """Called after each generated frame with the frames waiting: push them now?"""
        if self.first_at is not None:
            self.frames_since_first += 1
        return n_pending >= self.wanted()

    def audio(self, decoder, frames) -> Iterator[np.ndarray]:
        """Frames (each [n_q], as generated) through `decoder`, pushed as the ladder says; the
        last ones when the frames end."""
        pending = []
        for frame in frames:
            pending.append(frame)
            if self.ready(len(pending)):
                yield self.push(decoder, pending)
                pending = []
        if pending:
            yield self.push(decoder, pending)

    def push(self, decoder, frames: list) -> np.ndarray:
        """frames (each [n_q]) through `decoder` in one push → its audio; the push is timed."""
        started = self.clock()
        audio = decoder.push(np.array(frames).T)
        self.pushed(len(frames), self.clock() - started)
        return audio

    def pushed(self, frames: int = 1, seconds: float = 0.0) -> None:
        """A push of `frames` frames took `seconds`."""
        if self.first_at is None:
            self.first_at = self.clock()
        spent = seconds * self.frame_rate                  # in frames of audio
        if 2 * spent > frames:                             # over half the real-time budget
            self.catch_up = min(MAX_CHUNK_FRAMES, 2 * frames)
        elif 4 * spent < frames:                           # cheap: back toward the ladder
            self.catch_up //= 2
