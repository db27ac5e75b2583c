"""MOSS-TTS-Nano frame decoding: one utterance's sampler (`FrameSampler`), and several streams
decoded together (`NanoBatch`, for models/batching.py's scheduler, issue 25): each global step
and each local position's depth graph carries one row per active stream, so every weight is read
once for all of them. Each stream samples with its own generator, options and budget, so its
codes are those it makes decoded alone."""

from __future__ import annotations

import logging

import numpy as np

from ..codec import StreamBatch
from ..sampling import (SamplingOptions, check_finite, choose_rows_each, decide_continue,
                        sample_audio_code)
from ..nn.session import SharedDecodeSession
from .batching import HiddenStateFamily, HiddenWork, StreamJob
from .nano import GenerationState, NanoModel

logger = logging.getLogger(__name__)

STALL_FRAMES = 50          # 4 s of one identical frame is a runaway, not speech


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


def choose_codes(samplers: list[FrameSampler]):
    """A batch step's `choose_codes(channel, streams, logits)` over these jobs: the rows of the
    streams whose options set that channel alike are filtered in one numpy pass
    (`choose_rows_each`: each row bit-equal to its one-row result), each drawing from its own
    generator over its own history — the codes FrameSampler.choose_code gives alone, without
    one Python sampler call per stream and channel (docs/performance.md "Several streams")."""
    channels = [s.options.audio_channel for s in samplers]

    def choose(c: int, streams: list[int], logits: np.ndarray) -> np.ndarray:
        if len(streams) == 1:    # a batch of one draws as the one-stream loop does, no grouping
            return np.array([samplers[streams[0]].choose_code(c, logits[0])], dtype=np.int32)
        check_finite(logits, "audio")
        groups: dict = {}
        for j, i in enumerate(streams):
            groups.setdefault(channels[i], []).append(j)
        out = np.empty(len(streams), dtype=np.int32)
        for channel, rows in groups.items():
            group = [samplers[streams[j]] for j in rows]
            seen = np.stack([s.seen[c] for s in group])
            out[rows] = choose_rows_each(logits[rows], [s.rng for s in group], channel, seen)
        return out
    return choose


class NanoWork(HiddenWork):
    """A Nano stream's work, and the slot of the batch's codec streams its frames are decoded
    through (None: the stream decodes its frames itself)."""

    __slots__ = ("codec_slot",)

    def __init__(self, rows: np.ndarray, sampler: FrameSampler, codec_slot: int | None):
        super().__init__(rows, sampler)
        self.codec_slot = codec_slot


class NanoBatch(HiddenStateFamily):
    """NanoModel's streams decoded together: a step is one frame for every stream (one depth
    graph per local position over all of them) and one global step over those that go on;
    with `codec_streams`, then one codec push that decodes every new frame of the streams
    holding a slot of it (`decode`)."""

    model: NanoModel

    def __init__(self, model: NanoModel, codec_streams: StreamBatch | None = None):
        super().__init__(model)
        self.codec_streams = codec_streams

    def start(self, rows: np.ndarray, *, options: SamplingOptions = SamplingOptions(),
              seed: int | None = None, max_frames: int,
              codec_slot: int | None = None) -> NanoWork:
        """A stream of prompt rows → its frames [n_vq], as `NanoTTS.iter_frames` makes them
        (its budget has no default: its text sets it, nano_tts.frame_budget); with
        `codec_slot`, each frame's audio too (`StreamJob.decoded`)."""
        return NanoWork(rows, FrameSampler(self.model.config, options, seed, max_frames),
                        codec_slot)

    def decode(self, jobs: list[StreamJob]) -> None:
        """The frame each job holding a codec slot made in this step, all through one codec
        push: each one's audio is what its own stream decoder gives (codec/stream_batch.py)."""
        new = [job for job in jobs
               if job.work.codec_slot is not None and len(job.decoded) < len(job.items)]
        if not new:
            return
        audio = self.codec_streams.push({job.work.codec_slot: job.items[-1][:, None]
                                         for job in new})
        for job in new:
            job.decoded.append(audio[job.work.codec_slot])

    def close(self) -> None:
        if self.codec_streams is not None:
            self.codec_streams.close()
            self.codec_streams = None

    def sequences(self, state: GenerationState) -> SharedDecodeSession:
        return state.global_

    def prefill(self, state: GenerationState, job: StreamJob, start: int, stop: int) -> None:
        job.work.h = self.model.prefill_stream(state, job.seq, job.work.rows[start:stop])

    def draw(self, state: GenerationState, jobs: list[StreamJob], hidden: np.ndarray) -> list:
        samplers = [job.work.sampler for job in jobs]
        return self.model.batch_frames(state, hidden, choose_codes(samplers),
                                       lambda i, a, b: samplers[i].decide(a, b))

    def step_hidden(self, state: GenerationState, jobs: list[StreamJob]) -> list[np.ndarray]:
        rows = np.concatenate([self.model.frame_row(job.items[-1]) for job in jobs])
        return self.model.step_hidden(state, [job.seq for job in jobs], rows)

    def report_end(self, job: StreamJob) -> None:
        job.work.sampler.report_end()
