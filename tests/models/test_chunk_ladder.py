"""models/chunk_ladder.py: upstream's adaptive ladder (streaming.py's steps, §family-4.7) and the
catch-up rule (a stream behind with a codec slower than real time waits for more frames per
push), on a clock the test moves: never a wall time."""

import numpy as np

from moss_tts.models.chunk_ladder import MAX_CHUNK_FRAMES, ChunkLadder, ladder_frames

RATE = 12.5                      # frames per second of the 24 kHz and v2 codecs
FRAME_S = 1 / RATE


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


class TimedDecoder:
    """A codec stream whose push of k frames takes `fixed + per_frame·k` seconds on `clock`
    and returns k rows of the frames' first code (so the test can tell what went where)."""

    def __init__(self, clock, fixed, per_frame=0.0):
        self.clock, self.fixed, self.per_frame = clock, fixed, per_frame
        self.pushes = []

    def push(self, codes):
        k = codes.shape[1]
        self.pushes.append(k)
        self.clock.now += self.fixed + self.per_frame * k
        return codes[0].astype(np.float32)[:, None]


def run(ladder, decoder, clock, n_frames, generate_s):
    """n_frames generated `generate_s` apart through the ladder → the audio chunks."""
    def frames():
        for i in range(n_frames):
            clock.now += generate_s
            yield np.array([i, 0])
    return list(ladder.audio(decoder, frames()))


def test_ladder_follows_upstream_steps():
    assert [ladder_frames(x) for x in (None, -0.5, 0.0, 0.1, 0.2, 0.5, 0.9, 1.0, 3.0)] == \
        [4, 1, 1, 2, 3, 4, 6, 8, 8]
    clock = Clock()
    ladder = ChunkLadder(RATE, clock=clock)
    assert [ladder.ready(n) for n in (1, 2, 3, 4)] == [False, False, False, True]
    ladder.pushed()                       # first audio at t = 0
    clock.now = 0.5                       # 1 frame (80 ms) made in 0.5 s: lead < 0 → 1 frame
    assert ladder.ready(1)
    ladder.pushed()
    fast = ChunkLadder(RATE, clock=clock)
    fast.pushed()      # first audio at 0.5 s, then frames made in no time: the lead grows 80 ms
    sizes, pending = [], 0                # a frame, so pushes grow along the ladder
    for _ in range(23):
        pending += 1
        if fast.ready(pending):
            sizes.append(pending)
            pending = 0
    assert sizes == [3, 4, 8, 8]


def test_a_codec_that_keeps_up_gets_upstreams_ladder():
    """Pushes cheaper than their audio never trigger the catch-up: a stream generated slower
    than real time gets upstream's one-frame pushes after its first four."""
    clock = Clock()
    decoder = TimedDecoder(clock, fixed=0.01)
    chunks = run(ChunkLadder(RATE, clock=clock), decoder, clock, 12, generate_s=0.1)
    assert decoder.pushes == [4] + [1] * 8
    assert np.concatenate(chunks)[:, 0].tolist() == list(range(12))


def test_a_slow_codec_makes_a_stream_behind_push_piled_up_frames():
    """A push costs 0.2 s + 0.02 s a frame (a one-frame push 2.75x its 80 ms of audio, eight
    frames 0.56x), frames come 50 ms apart: behind, each costly push doubles the next one's
    frames up to the codec's largest push; every frame is decoded once, in order, in under half
    the time of one-frame pushes (what upstream's ladder does behind)."""
    clock = Clock()
    decoder = TimedDecoder(clock, fixed=0.2, per_frame=0.02)
    chunks = run(ChunkLadder(RATE, clock=clock), decoder, clock, 40, generate_s=0.05)
    assert decoder.pushes[:4] == [4, 2, 4, 8]
    assert set(decoder.pushes[3:-1]) == {MAX_CHUNK_FRAMES}
    assert np.concatenate(chunks)[:, 0].tolist() == list(range(40))
    one_at_a_time = Clock()               # what upstream's ladder does behind: one a push
    run(ChunkLadder(RATE, fixed=1, clock=one_at_a_time),
        TimedDecoder(one_at_a_time, fixed=0.2, per_frame=0.02), one_at_a_time, 40, 0.05)
    assert clock.now < 0.5 * one_at_a_time.now   # the same 40 frames in under half the time


def test_the_catch_up_halves_back_when_pushes_get_cheap():
    clock = Clock()
    ladder = ChunkLadder(RATE, clock=clock)
    ladder.pushed(1, 0.05)                # over half of 80 ms: behind, wait for 2
    assert ladder.catch_up == 2
    ladder.pushed(2, 0.1)                 # over half of 160 ms: 4
    ladder.pushed(4, 0.2)                 # over half of 320 ms: 8
    assert ladder.catch_up == 8
    ladder.pushed(8, 0.3)                 # 640 ms of audio in 0.3 s, over a quarter: stays
    assert ladder.catch_up == 8
    ladder.pushed(8, 0.15)                # under a quarter of its audio's time: halves
    assert ladder.catch_up == 4
    clock.now = 10.0                      # far behind: the catch-up size, not one frame
    assert ladder.wanted() == 4


def test_fixed_chunks_ignore_the_clock():
    clock = Clock()
    decoder = TimedDecoder(clock, fixed=1.0)
    run(ChunkLadder(RATE, fixed=3, clock=clock), decoder, clock, 10, generate_s=0.0)
    assert decoder.pushes == [3, 3, 3, 1]


def test_realtimes_shape_is_one_frame_a_push_until_the_codec_falls_behind():
    shape = dict(first=1, steps=(), longest=1)
    clock = Clock()
    fast = TimedDecoder(clock, fixed=0.01)
    run(ChunkLadder(RATE, clock=clock, **shape), fast, clock, 6, generate_s=0.01)
    assert fast.pushes == [1] * 6
    clock = Clock()
    slow = TimedDecoder(clock, fixed=0.15)
    run(ChunkLadder(RATE, clock=clock, **shape), slow, clock, 12, generate_s=0.01)
    assert slow.pushes[0] == 1 and max(slow.pushes) > 1 and sum(slow.pushes) == 12
