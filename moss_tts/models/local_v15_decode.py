"""Several MOSS-TTS-Local-Transformer-v1.5 streams in one decode step (`LocalV15Batch`, for
models/batching.py's scheduler, issue 25): each local position's graph carries one row per
active stream, and the backbone step one row per stream that goes on, so every weight is read
once for all of them. Each stream chooses with its own `FrameChooser` (generator, options,
history, budget), the one `LocalV15Model.iter_frames` uses, so its frames are those it makes
decoded alone."""

from __future__ import annotations

import numpy as np

from ..sampling import LocalV15SamplingOptions
from .batching import HiddenStateFamily, HiddenWork, StreamJob
from .local_v15 import MAX_FRAMES, FrameChooser, GenerationState, LocalV15Model


class LocalV15Batch(HiddenStateFamily):
    """LocalV15Model's streams decoded together: a step is one frame for every stream (one
    graph per local position over the streams that go on) and one backbone step over those
    whose budget is not spent."""

    model: LocalV15Model

    def start(self, rows: np.ndarray, *,
              options: LocalV15SamplingOptions = LocalV15SamplingOptions(),
              seed: int | None = None, max_frames: int = MAX_FRAMES) -> HiddenWork:
        """A stream of prompt rows → its frames [n_vq], as `LocalV15Model.iter_frames` makes
        them (the prompt is checked when it joins)."""
        return HiddenWork(rows, FrameChooser(self.model.config, options, seed, max_frames))

    def prefill(self, state: GenerationState, job: StreamJob, start: int, stop: int) -> None:
        work = job.work
        if start == 0:   # the whole prompt, before any of it is appended
            self.model.check_rows(work.rows)
        feed = self.model.check_rows(work.rows[start:stop])
        outs = state.backbone.prefill_sequence(job.seq, feed, stop - start, variant=True)
        work.h = outs[-1]["hidden"][0]

    def draw(self, state: GenerationState, jobs: list[StreamJob], hidden: np.ndarray) -> list:
        choosers = [job.work.sampler for job in jobs]
        return self.model.batch_frames(state, hidden,
                                       lambda i, decision: choosers[i].goes_on(decision),
                                       lambda i, c, logits: choosers[i].choose_code(c, logits))

    def step_hidden(self, state: GenerationState, jobs: list[StreamJob]) -> list[np.ndarray]:
        m = self.model
        rows = np.concatenate([m.frame_row(job.items[-1]) for job in jobs])
        return state.backbone.step([job.seq for job in jobs], m.check_rows(rows),
                                   variant=False)["hidden"]
