"""MossTTSRealtime streams decoded together (`RealtimeBatch`, for models/batching.py's scheduler,
issue 25): each backbone step and each local position's graph carries one row per active
stream, so every weight is read once for all of them. Each stream draws with its own
`TurnSampler` (generator, options, penalty window, text ids, budget) — the one its one-stream
loop (`RealtimeModel.iter_frames`) uses — so its frames are those it makes decoded alone."""

from __future__ import annotations

import numpy as np

from ..ggml.backend import released_on_error
from ..nn.session import SessionsOwner, SharedDecodeSession
from ..sampling import RealtimeSamplingOptions, check_options, check_seed
from .batching import BatchFamily, StreamJob
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


class TurnWork:
    """A Realtime stream's own part of a batch job: its prompt rows, its turn's sampler, and
    the backbone hidden its next frame starts from."""

    __slots__ = ("rows", "turn", "h")

    def __init__(self, rows: np.ndarray, turn: TurnSampler):
        self.rows, self.turn, self.h = rows, turn, None


class RealtimeBatch(BatchFamily):
    """RealtimeModel's offline turns decoded together: a step is one frame for every stream (one
    local graph per position over all of them), then one backbone step over the rows
    [next text id, that frame] of those that go on."""

    model: RealtimeModel

    def job(self, rows, text_ids=(), options: RealtimeSamplingOptions = RealtimeSamplingOptions(),
            seed: int | None = None, max_frames: int = MAX_FRAMES) -> StreamJob:
        """`RealtimeModel.iter_frames(rows, text_ids, ...)` as a batch job → its frames [rvq]
        (the EOS frame not among them); rows, text ids and budget are checked here, so a bad
        job fails on its own before it joins. The cache takes its prompt and whole budget."""
        options, seed = check_options(options, RealtimeSamplingOptions), check_seed(seed)
        rows = check_rows(rows, self.model.config)
        turn = TurnSampler(self.model.config, options, np.random.default_rng(seed), text_ids,
                           max_frames)
        return StreamJob(TurnWork(rows, turn), len(rows), len(rows) + max_frames)

    def make_state(self, rows: int, streams: int) -> BatchState:
        return BatchState(self.model, rows, streams)

    def sequences(self, state: BatchState) -> SharedDecodeSession:
        return state.backbone

    def prefill(self, state: BatchState, job: StreamJob, start: int, stop: int) -> None:
        job.work.h = self.model.prefill_stream(state.backbone, job.seq, job.work.rows[start:stop])

    def advance(self, state: BatchState, jobs: list[StreamJob]) -> list[bool]:
        m, turns = self.model, [job.work.turn for job in jobs]
        frames = m.batch_frames(state.local, np.stack([job.work.h for job in jobs]), turns)
        for job, turn, frame in zip(jobs, turns, frames):
            turn.frames.append(frame)
            if not turn.finished:        # the EOS frame ends the turn unreturned, as alone
                job.items.append(frame)
        on = [job for job, turn in zip(jobs, turns) if turn.going]
        if on:
            rows = np.concatenate([job.work.turn.row(job.work.turn.next_text()) for job in on])
            for job, h in zip(on, m.step_hidden(state.backbone, [job.seq for job in on], rows)):
                job.work.h = h
        return [turn.going for turn in turns]

