"""Several MossTTSDelay streams in one decode step (`DelayBatch`, for models/batching.py's
scheduler, issue 25): the streams share one KV cache (a sequence each), and a step feeds the row
each stream made last through one backbone graph, every row through the heads. Each stream
samples with its own `RowSampler` (generator, history, budget), so its rows are those it makes
decoded alone (`DelayModel.iter_rows`)."""

from __future__ import annotations

import numpy as np

from ..nn.session import SharedDecodeSession
from ..sampling import DelaySamplingOptions
from .batching import BatchFamily, StreamJob
from .delay import (FEW_TEXT_IDS, MAX_NEW_ROWS, DelayConfig, DelayModel, RowSampler, check_rows,
                    row_feed, row_logits)


def shared_text_ids(per_stream: list, cfg: DelayConfig) -> np.ndarray | None:
    """The few-ids text head's input for a step over several streams: the union of each
    stream's few ids (`RowSampler.text_ids`), padded to FEW_TEXT_IDS, when it fits (in audio
    every stream takes GEN or DELAY, P3); None, the whole vocabulary, when a stream needs it
    or the union does not fit."""
    if any(ids is None for ids in per_stream):
        return None
    union = np.unique(np.concatenate(per_stream))
    if len(union) > FEW_TEXT_IDS:
        return None
    ids = np.full(FEW_TEXT_IDS, cfg.audio_assistant_gen_slot_token_id, dtype=np.int32)
    ids[:len(union)] = union
    return ids


class RowWork:
    """A Delay stream's own part of a batch job: its prompt rows and how to sample (its
    `RowSampler`, made when its prompt is first appended), and the logits its next row is
    sampled from."""

    __slots__ = ("rows", "options", "seed", "max_new_rows", "sampler", "logits")

    def __init__(self, rows: np.ndarray, options: DelaySamplingOptions, seed: int | None,
                 max_new_rows: int):
        self.rows, self.options, self.seed, self.max_new_rows = rows, options, seed, max_new_rows
        self.sampler: RowSampler | None = None
        self.logits: tuple[np.ndarray, np.ndarray] | None = None


class DelayBatch(BatchFamily):
    """DelayModel's streams decoded together: a step is one row for every stream, one graph
    over all of them (backbone and heads)."""

    model: DelayModel
    BUDGET_KEYWORD = "max_new_rows"

    def start(self, rows: np.ndarray, *, options: DelaySamplingOptions = DelaySamplingOptions(),
              seed: int | None = None, max_new_rows: int = MAX_NEW_ROWS) -> RowWork:
        """A stream of prompt rows [S, 1 + n_vq] → its generated rows, as `iter_rows` yields
        them (its sampler is made when the prompt joins: it reads the prompt's rows)."""
        if rows.ndim != 2:
            check_rows(rows, self.model.config)      # a shapeless prompt has no length
        return RowWork(rows, options, seed, max_new_rows)

    def make_state(self, rows: int, streams: int) -> SharedDecodeSession:
        return self.model.make_session(rows, shared=True)

    def sequences(self, state: SharedDecodeSession) -> SharedDecodeSession:
        return state

    def prefill(self, state: SharedDecodeSession, job: StreamJob, start: int, stop: int) -> None:
        """Rows [start, stop) of the prompt; the last chunk's heads (on its last row, the few
        ids when the first row may take only those, as `step_run` alone) are the first
        step's logits."""
        w, cfg = job.work, self.model.config
        if start == 0:
            w.sampler = RowSampler(check_rows(w.rows, cfg), cfg, w.options, w.seed,
                                   w.max_new_rows)
        ids = w.sampler.text_ids()
        extra, variant = ({}, True) if ids is None else ({"text_ids": ids}, "few")
        out = state.append(job.seq, row_feed(w.rows[start:stop]) | extra, stop - start,
                           variant=variant)
        if stop == job.prompt_rows:
            w.logits = row_logits(out, 0, ids, cfg)

    def advance(self, state: SharedDecodeSession, jobs: list[StreamJob]) -> list[bool]:
        """Each stream's next row from its logits; then the rows of those that go on through
        one step graph, which gives each its next logits."""
        going, on = [], []
        for job in jobs:
            row, go = job.work.sampler.take(*job.work.logits)
            job.items.append(row)
            going.append(go)
            if go:
                on.append(job)
        if on:
            cfg = self.model.config
            ids = shared_text_ids([job.work.sampler.text_ids() for job in on], cfg)
            extra, variant = ({}, False) if ids is None else ({"text_ids": ids}, "rows_few")
            out = state.step([job.seq for job in on],
                             row_feed(np.stack([job.items[-1] for job in on])) | extra,
                             variant=variant)
            for i, job in enumerate(on):
                job.work.logits = row_logits(out, i, ids, cfg)
        return going

