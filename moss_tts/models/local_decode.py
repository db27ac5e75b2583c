"""Several MossTTSLocal streams in one decode step (`LocalBatch`, for models/batching.py's
scheduler, issue 25): each depth position's graph carries one row per active stream, and the
backbone step one row per stream that goes on, so every weight is read once for all of them.
Each stream chooses with its own `RowChooser` (generator, options, history, budget), the one
`LocalModel.iter_rows` uses, so its rows are those it makes decoded alone."""

from __future__ import annotations

import numpy as np

from ..sampling import LocalSamplingOptions
from .batching import HiddenStateFamily, HiddenWork, StreamJob
from .local import (MAX_NEW_FRAMES, GenerationState, LocalModel, RowChooser, check_n_vq,
                    row_feed)
from .rows import check_rows


class RowWork(HiddenWork):
    """A Local stream's HiddenWork, with how many codebooks it generates (n_vq_for_inference)
    and its chooser's keywords: the chooser is made when its prompt is checked, on joining."""

    __slots__ = ("n_vq", "choices")

    def __init__(self, rows: np.ndarray, n_vq: int, choices: tuple):
        super().__init__(rows)
        self.n_vq, self.choices = n_vq, choices   # (options, seed, budget)


class LocalBatch(HiddenStateFamily):
    """LocalModel's streams decoded together: a step is one row for every stream (one depth
    graph per position over the streams that reach it) and one backbone step over those that
    go on. n_vq_for_inference is a variant of the backbone's graph (the rows embed that many
    channels), so streams of different n share every depth graph and take one backbone graph
    per n among them."""

    model: LocalModel
    BUDGET_KEYWORD = "max_new_frames"

    def start(self, rows: np.ndarray, *, options: LocalSamplingOptions = LocalSamplingOptions(),
              seed: int | None = None, max_new_frames: int = MAX_NEW_FRAMES,
              n_vq_for_inference: int | None = None) -> RowWork:
        """A stream of prompt rows → its rows [1 + n_vq], as `LocalModel.iter_rows` makes them
        (its chooser is made when the prompt joins: it reads the prompt's codes)."""
        n = check_n_vq(n_vq_for_inference, self.model.config)
        return RowWork(rows, n, (options, seed, max_new_frames))

    def prefill(self, state: GenerationState, job: StreamJob, start: int, stop: int) -> None:
        work = job.work
        if start == 0:   # the whole prompt, before any of it is appended
            work.rows = check_rows(work.rows, self.model.config)
            work.sampler = RowChooser(self.model.config, work.rows, *work.choices)
        rows = work.rows[start:stop]
        outs = state.backbone.prefill_sequence(job.seq, row_feed(rows, work.n_vq), len(rows),
                                               variant=(work.n_vq, True))
        work.h = outs[-1]["hidden"][0]

    def draw(self, state: GenerationState, jobs: list[StreamJob], hidden: np.ndarray) -> list:
        works = [job.work for job in jobs]
        return self.model.batch_rows(state, hidden, [w.n_vq for w in works],
                                     lambda i, c, logits: works[i].sampler.choose(c, logits))

    def step_hidden(self, state: GenerationState, jobs: list[StreamJob]) -> list[np.ndarray]:
        hidden = [None] * len(jobs)
        for n in sorted({job.work.n_vq for job in jobs}):   # one backbone graph per variant
            group = [i for i, job in enumerate(jobs) if job.work.n_vq == n]
            rows = np.stack([jobs[i].items[-1] for i in group])
            out = state.backbone.step([jobs[i].seq for i in group], row_feed(rows, n),
                                      variant=(n, False))["hidden"]
            for i, h in zip(group, out):
                hidden[i] = h
        return hidden
