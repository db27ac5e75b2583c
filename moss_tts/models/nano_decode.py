"""MOSS-TTS-Nano frame decoding: one utterance's sampler (`FrameSampler`), and several streams
decoded together (`BatchDecoder`, issue 25): each global step and each local position's depth
graph carries one row per active stream, so every weight is read once for all of them. Streams
join (their prompt prefilled between steps) and leave (their cache slots freed) as they come and
finish; each samples with its own generator, options and budget, so its codes are those it
makes decoded alone."""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Iterator

import numpy as np

from ..errors import InputError
from ..ggml.backend import NativeResource
from ..sampling import (SamplingOptions, check_finite, choose_rows_each, decide_continue,
                        sample_audio_code)
from .nano import GenerationState, NanoModel

logger = logging.getLogger(__name__)

STALL_FRAMES = 50          # 4 s of one identical frame is a runaway, not speech
# Generation states are sized in steps of this many rows (per stream), so the next utterance can
# usually reuse the last one (caches allocated and graphs built): the step graph attends over
# every slot, but masked slots cost flash attention next to nothing
STATE_ROWS_STEP = 256
# Streams per batch unless asked otherwise: on two cores 4 streams make 2.8-2.9× one stream's
# audio per second in f32, 2.1-2.3× in q8_0 (bench/streams.py, docs/performance.md)
MAX_STREAMS = 4


class FrameSampler:
    """One utterance's choices (docs/upstream-notes.md §nano-4.1-4.2): its own generator (seeded
    per utterance), the per-channel repetition history, and when it ends: the model's stop, a
    stall of STALL_FRAMES identical frames, or its frame budget. Shared by the one-stream loop
    and the batched one, so a stream makes the same draws alone or among others."""

    def __init__(self, cfg, options: SamplingOptions, seed: int | None, max_frames: int):
        self.options, self.max_frames = options, max_frames
        self.rng = np.random.default_rng(seed) if options.do_sample else None
        self.seen = np.zeros((cfg.n_vq, cfg.audio_vocab_size), dtype=bool)
        self.n_frames, self.same, self.last = 0, 0, None
        self.stalled = False

    def decide(self, logit_continue: float, logit_stop: float) -> bool:
        return decide_continue(logit_continue, logit_stop, self.rng, self.options)

    def choose_code(self, channel: int, logits: np.ndarray) -> int:
        return sample_audio_code(logits, self.seen[channel], self.rng, self.options)

    def accept(self, codes: np.ndarray) -> bool:
        """Record a generated frame; False when the utterance ends with it (a stall or the
        budget)."""
        self.seen[np.arange(len(codes)), codes] = True
        self.n_frames += 1
        self.same = self.same + 1 if self.last is not None and np.array_equal(codes, self.last) else 0
        self.last = codes
        if self.same >= STALL_FRAMES:
            self.stalled = True
            return False
        if self.n_frames >= self.max_frames:
            logger.info("frame budget of %d reached", self.max_frames)
            return False
        return True

    def report_end(self) -> None:
        """Warn of a stall once the utterance's frames are all out, from the generator that
        yields them: in a batch the step that stops a stream runs in another stream's pull,
        so a warning there would be heard as the other request's (batch/work.py)."""
        if self.stalled:
            logger.warning("stopping: %d identical frames in a row", self.same)


def choose_codes(jobs: list["FrameJob"]):
    """A batch step's `choose_codes(channel, streams, logits)` over these jobs: the rows of the
    streams whose options set that channel alike are filtered in one numpy pass
    (`choose_rows_each`: each row bit-equal to its one-row result), each drawing from its own
    generator over its own history — the codes FrameSampler.choose_code gives alone, without
    one Python sampler call per stream and channel (docs/performance.md "Several streams")."""
    channels = [j.sampler.options.audio_channel for j in jobs]

    def choose(c: int, streams: list[int], logits: np.ndarray) -> np.ndarray:
        check_finite(logits, "audio")
        groups: dict = {}
        for j, i in enumerate(streams):
            groups.setdefault(channels[i], []).append(j)
        out = np.empty(len(streams), dtype=np.int32)
        for channel, rows in groups.items():
            samplers = [jobs[streams[j]].sampler for j in rows]
            seen = np.stack([s.seen[c] for s in samplers])
            out[rows] = choose_rows_each(logits[rows], [s.rng for s in samplers], channel, seen)
        return out
    return choose


class FrameJob:
    """One utterance in a batch: its prompt rows, its sampler, and the frames made so far."""

    __slots__ = ("rows", "sampler", "seq", "h", "frames", "done")

    def __init__(self, rows: np.ndarray, sampler: FrameSampler):
        self.rows, self.sampler = rows, sampler
        self.seq, self.h, self.frames, self.done = None, None, [], False

    @property
    def need(self) -> int:
        """The most cache rows it can take: its prompt and a full budget of frames."""
        return len(self.rows) + self.sampler.max_frames


class BatchDecoder(NativeResource):
    """Decodes frame jobs of one NanoModel together, up to `max_streams` at a time, on one
    shared generation state (grown, when idle, for a job that does not fit).

    >>> with BatchDecoder(tts.model) as batch:                            # doctest: +SKIP
    ...     codes = batch.run([(rows_a, SamplingOptions(), 1, 200), (rows_b, ...)])
    """

    def __init__(self, model: NanoModel, *, max_streams: int = MAX_STREAMS):
        if isinstance(max_streams, bool) or not isinstance(max_streams, int) or max_streams < 1:
            raise InputError(f"max_streams must be a whole number ≥ 1, got {max_streams!r}")
        self.model, self.max_streams = model, max_streams
        self.state: GenerationState | None = None
        self.active: list[FrameJob] = []
        self.queue: deque[FrameJob] = deque()
        self.reserved = 0          # rows the active jobs may still take, at most
        self.steps = 0

    def submit(self, rows: np.ndarray, options: SamplingOptions, seed: int | None,
               max_frames: int) -> FrameJob:
        """Queue a job; it joins the batch at the next step with room for it."""
        job = FrameJob(np.asarray(rows), FrameSampler(self.model.config, options, seed, max_frames))
        self.queue.append(job)
        return job

    def cancel(self, job: FrameJob) -> None:
        """Drop a job that is no longer wanted (its frames so far stay readable)."""
        if job in self.queue:
            self.queue.remove(job)
            job.done = True
        elif job in self.active:
            self.active.remove(job)
            self._finish(job)

    def step(self) -> None:
        """Admit queued jobs (prefill each), then one frame for every active job: one depth
        loop over all of them, then one global step over those that go on."""
        self._admit()
        if not self.active:
            return
        jobs, m = self.active, self.model
        made = m.batch_frames(self.state, np.stack([j.h for j in jobs]), choose_codes(jobs),
                              lambda i, a, b: jobs[i].sampler.decide(a, b))
        going = []
        for job, codes in zip(jobs, made):
            if codes is not None:
                job.frames.append(codes)
            if codes is not None and job.sampler.accept(codes):
                going.append(job)
            else:
                self._finish(job)
        if going:
            rows = np.concatenate([m.frame_row(j.frames[-1]) for j in going])
            for job, h in zip(going, m.step_hidden(self.state, [j.seq for j in going], rows)):
                job.h = h
        self.active = going
        self.steps += 1

    def frames(self, rows, options: SamplingOptions, seed: int | None,
               max_frames: int) -> Iterator[np.ndarray]:
        """A job's frames as they are made (NanoTTS's frame source in a batch): pulling one
        runs batch steps, which advance every other active job too."""
        job = self.submit(rows, options, seed, max_frames)
        try:
            i = 0
            while True:
                while i == len(job.frames) and not job.done:
                    self.step()
                if i == len(job.frames):
                    job.sampler.report_end()
                    return
                yield job.frames[i]
                i += 1
        finally:
            self.cancel(job)

    def run(self, jobs) -> list[np.ndarray]:
        """(rows, options, seed, max_frames) for each job → each one's codes [frames, n_vq]."""
        made = [self.submit(*job) for job in jobs]
        while self.queue or self.active:
            self.step()
        for job in made:
            job.sampler.report_end()
        n_vq = self.model.config.n_vq
        return [np.array(j.frames, dtype=np.int32).reshape(len(j.frames), n_vq) for j in made]

    def _admit(self) -> None:
        while self.queue and len(self.active) < self.max_streams:
            job = self.queue[0]
            if self.state is None or self.reserved + job.need > self.state.capacity:
                if self.active:
                    return        # it joins when enough of the running ones have left
                self._grow(job.need)
            self.queue.popleft()
            job.seq = self.state.global_.open()
            self.reserved += job.need
            self.active.append(job)
            try:
                job.h = self.model.prefill_stream(self.state, job.seq, job.rows)
            except BaseException:
                self.cancel(job)    # bad rows fail this job alone, before any step
                raise

    def _grow(self, need: int) -> None:
        """A new (empty) shared state with room for max_streams jobs of `need` rows."""
        if self.state is not None:
            self.state.close()
            self.state = None
        per_stream = -(-need // STATE_ROWS_STEP) * STATE_ROWS_STEP
        self.state = self.model.make_state(per_stream * self.max_streams,
                                           streams=self.max_streams)

    def _finish(self, job: FrameJob) -> None:
        job.done = True
        if job.seq is not None:
            self.state.global_.release(job.seq)
            self.reserved -= job.need
            job.seq = None

    def close(self) -> None:
        if getattr(self, "state", None) is not None:
            self.state.close()
            self.state = None
