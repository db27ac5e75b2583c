"""Several MossTTSLocal streams in one decode step (`LocalBatch`, for models/batching.py's
scheduler, issue 25): each depth position's graph carries one row per active stream, and the
backbone step one row per stream that goes on, so every weight is read once for all of them.
Each stream chooses with its own `RowChooser` (generator, options, history, budget), the one
`LocalModel.iter_rows` uses, so its rows are those it makes decoded alone."""

from __future__ import annotations

import numpy as np

from ..errors import InputError
from ..sampling import LocalSamplingOptions, check_options, check_seed
from ..nn.session import SharedDecodeSession
from .batching import BatchFamily, StreamJob
from .delay import check_rows
from .local import (MAX_NEW_FRAMES, GenerationState, LocalModel, RowChooser, check_n_vq,
                    row_feed)


class RowWork:
    """A Local stream's own part of a batch job: its prompt rows, how many codebooks it
    generates (n_vq_for_inference), its chooser (made when its prompt is checked, on joining),
    and the backbone hidden its next row starts from."""

    __slots__ = ("rows", "n_vq", "choices", "chooser", "h")

    def __init__(self, rows: np.ndarray, n_vq: int, choices: tuple):
        self.rows, self.n_vq, self.choices = rows, n_vq, choices   # (options, seed, budget)
        self.chooser: RowChooser | None = None
        self.h = None


class LocalBatch(BatchFamily):
    """LocalModel's streams decoded together: a step is one row for every stream (one depth
    graph per position over the streams that reach it) and one backbone step over those that
    go on. n_vq_for_inference is a variant of the backbone's graph (the rows embed that many
    channels), so streams of different n share every depth graph and take one backbone graph
    per n among them."""

    model: LocalModel

    def job(self, rows, *, options: LocalSamplingOptions = LocalSamplingOptions(),
            seed: int | None = None, max_new_frames: int = MAX_NEW_FRAMES,
            n_vq_for_inference: int | None = None) -> StreamJob:
        """A stream of prompt rows → its rows [1 + n_vq], as `LocalModel.iter_rows` makes them
        (the same keywords); the prompt is checked when it joins. The cache takes its prompt
        and a whole budget of rows."""
        n = check_n_vq(n_vq_for_inference, self.model.config)
        if max_new_frames < 1:
            raise InputError(f"max_new_frames must be at least 1, got {max_new_frames}")
        options, seed = check_options(options, LocalSamplingOptions), check_seed(seed)
        rows = np.asarray(rows)
        length = len(rows) if rows.ndim else 0    # a malformed prompt fails when it joins
        return StreamJob(RowWork(rows, n, (options, seed, max_new_frames)), length,
                         length + max_new_frames)

    def sequences(self, state: GenerationState) -> SharedDecodeSession:
        return state.backbone

    def prefill(self, state: GenerationState, job: StreamJob, start: int, stop: int) -> None:
        work = job.work
        if start == 0:   # the whole prompt, before any of it is appended
            work.rows = check_rows(work.rows, self.model.config)
            work.chooser = RowChooser(self.model.config, work.rows, *work.choices)
        rows = work.rows[start:stop]
        outs = state.backbone.prefill_sequence(job.seq, row_feed(rows, work.n_vq), len(rows),
                                               variant=(work.n_vq, True))
        work.h = outs[-1]["hidden"][0]

    def advance(self, state: GenerationState, jobs: list[StreamJob]) -> list[bool]:
        works = [job.work for job in jobs]
        made = self.model.batch_rows(state, np.stack([w.h for w in works]),
                                     [w.n_vq for w in works],
                                     lambda i, c, logits: works[i].chooser.choose(c, logits))
        going = []
        for job, row in zip(jobs, made):
            job.items.append(row)
            going.append(job.work.chooser.accept(row))
        on = [job for job, g in zip(jobs, going) if g]
        for n in sorted({job.work.n_vq for job in on}):   # one backbone graph per variant
            group = [job for job in on if job.work.n_vq == n]
            rows = np.stack([job.items[-1] for job in group])
            hidden = state.backbone.step([job.seq for job in group], row_feed(rows, n),
                                         variant=(n, False))["hidden"]
            for job, h in zip(group, hidden):
                job.work.h = h
        return going

