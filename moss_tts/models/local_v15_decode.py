"""Several MOSS-TTS-Local-Transformer-v1.5 streams in one decode step (`LocalV15Batch`, for
models/batching.py's scheduler, issue 25): each local position's graph carries one row per
active stream, and the backbone step one row per stream that goes on, so every weight is read
once for all of them. Each stream chooses with its own `FrameChooser` (generator, options,
history, budget), the one `LocalV15Model.iter_frames` uses, so its frames are those it makes
decoded alone."""

from __future__ import annotations

import numpy as np

from ..errors import whole_number
from ..sampling import LocalV15SamplingOptions, check_options, check_seed
from ..nn.session import SharedDecodeSession
from .batching import BatchFamily, StreamJob
from .local_v15 import MAX_FRAMES, FrameChooser, GenerationState, LocalV15Model


class FrameWork:
    """A v1.5 stream's own part of a batch job: its prompt rows, its chooser, and the backbone
    hidden its next frame starts from."""

    __slots__ = ("rows", "chooser", "h")

    def __init__(self, rows: np.ndarray, chooser: FrameChooser):
        self.rows, self.chooser, self.h = rows, chooser, None


class LocalV15Batch(BatchFamily):
    """LocalV15Model's streams decoded together: a step is one frame for every stream (one
    graph per local position over the streams that go on) and one backbone step over those
    whose budget is not spent."""

    model: LocalV15Model

    def job(self, rows, *, options: LocalV15SamplingOptions = LocalV15SamplingOptions(),
            seed: int | None = None, max_frames: int = MAX_FRAMES) -> StreamJob:
        """A stream of prompt rows → its frames [n_vq], as `LocalV15Model.iter_frames` makes
        them (the same keywords, checked here; the prompt is checked when it joins). The cache
        takes its prompt and a whole budget of frames."""
        options = check_options(options, LocalV15SamplingOptions)
        max_frames = whole_number(max_frames, "max_frames", 1)
        seed = check_seed(seed)
        rows = np.asarray(rows)
        length = len(rows) if rows.ndim else 0    # a malformed prompt fails when it joins
        chooser = FrameChooser(self.model.config, options, seed, max_frames)
        return StreamJob(FrameWork(rows, chooser), length, length + max_frames)

    def sequences(self, state: GenerationState) -> SharedDecodeSession:
        return state.backbone

    def prefill(self, state: GenerationState, job: StreamJob, start: int, stop: int) -> None:
        work = job.work
        if start == 0:   # the whole prompt, before any of it is appended
            self.model.check_rows(work.rows)
        feed = self.model.check_rows(work.rows[start:stop])
        outs = state.backbone.prefill_sequence(job.seq, feed, stop - start, variant=True)
        work.h = outs[-1]["hidden"][0]

    def advance(self, state: GenerationState, jobs: list[StreamJob]) -> list[bool]:
        m, choosers = self.model, [job.work.chooser for job in jobs]
        made = m.batch_frames(state, np.stack([job.work.h for job in jobs]),
                              lambda i, decision: choosers[i].goes_on(decision),
                              lambda i, c, logits: choosers[i].choose_code(c, logits))
        going = []
        for job, codes in zip(jobs, made):
            if codes is not None:
                job.items.append(codes)
            going.append(codes is not None and job.work.chooser.accept(codes))
        on = [job for job, g in zip(jobs, going) if g]
        if on:
            rows = np.concatenate([m.frame_row(job.items[-1]) for job in on])
            hidden = state.backbone.step([job.seq for job in on], m.check_rows(rows),
                                         variant=False)["hidden"]
            for job, h in zip(on, hidden):
                job.work.h = h
        return going

