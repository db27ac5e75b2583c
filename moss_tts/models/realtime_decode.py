"""MossTTSRealtime streams decoded together (`RealtimeBatch`, for models/batching.py's scheduler,
issue 25): each backbone step and each local position's graph carries one row per active
stream, so every weight is read once for all of them. Each stream draws with its own
`TurnSampler` (generator, options, penalty window, text ids, budget) — the one its one-stream
loop (`RealtimeModel.iter_frames`) uses — so its frames are those it makes decoded alone."""

from __future__ import annotations

import numpy as np

from ..ggml.backend import released_on_error
from ..nn.session import SessionsOwner
from ..sampling import RealtimeSamplingOptions
from .batching import HiddenStateFamily, HiddenWork, StreamJob
from .realtime import MAX_FRAMES, RealtimeModel, TurnSampler, check_rows


class BatchState(SessionsOwner):
    """The shared state of a batch: the backbone's cache of `capacity` rows and the local
    session (rvq slots per stream, emptied every frame), each shared by up to `streams`
    streams."""

    SESSIONS = ("backbone", "local")

    def __init__(self, model: RealtimeModel, capacity: int, streams: int):
        self.capacity = capacity
        self.backbone = model.make_backbone(capacity, streams=streams)
        with released_on_error(self.backbone):
            self.local = model.make_local(streams=streams)


class RealtimeBatch(HiddenStateFamily):
    """RealtimeModel's offline turns decoded together: a step is one frame for every stream (one
    local graph per position over all of them), then one backbone step over the rows
    [next text id, that frame] of those that go on."""

    model: RealtimeModel

    def start(self, rows: np.ndarray, *, text_ids=(),
              options: RealtimeSamplingOptions = RealtimeSamplingOptions(),
              seed: int | None = None, max_frames: int = MAX_FRAMES) -> HiddenWork:
        """`RealtimeModel.iter_frames(rows, text_ids, ...)` as a batch job → its frames [rvq]
        (the EOS frame not among them); rows and text ids are checked here, so a bad job
        fails on its own before it joins."""
        rows = check_rows(rows, self.model.config)
        turn = TurnSampler(self.model.config, options, np.random.default_rng(seed), text_ids,
                           max_frames)
        return HiddenWork(rows, turn)

    def make_state(self, rows: int, streams: int) -> BatchState:
        return BatchState(self.model, rows, streams)

    def prefill(self, state: BatchState, job: StreamJob, start: int, stop: int) -> None:
        job.work.h = self.model.prefill_stream(state.backbone, job.seq, job.work.rows[start:stop])

    def draw(self, state: BatchState, jobs: list[StreamJob], hidden: np.ndarray) -> list:
        return self.model.batch_frames(state.local, hidden, [job.work.sampler for job in jobs])

    def accept(self, job: StreamJob, frame: np.ndarray) -> bool:
        turn = job.work.sampler
        turn.frames.append(frame)
        if not turn.finished:        # the EOS frame ends the turn unreturned, as alone
            job.items.append(frame)
        return turn.going

    def step_hidden(self, state: BatchState, jobs: list[StreamJob]) -> list[np.ndarray]:
        turns = [job.work.sampler for job in jobs]
        rows = np.concatenate([turn.row(turn.next_text()) for turn in turns])
        return self.model.step_hidden(state.backbone, [job.seq for job in jobs], rows)
