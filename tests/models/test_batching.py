"""The scheduler every batched family shares (moss_tts/models/batching.py, issue 25): who joins
when, how a joining prompt is appended while others decode, and the family contract's
decoding_together / synthesize_many. Run on the real Nano adaptor over a tiny model (the
family's own equality tests are in test_nano_decode.py and beside each family); the recording
subclass only notes the calls the scheduler makes, each still runs the real prefill."""

import numpy as np
import pytest

from moss_tts.errors import InputError
from moss_tts.models.batching import BatchDecoder, StreamJob
from moss_tts.models.nano_decode import NanoBatch
from moss_tts.sampling import SamplingOptions
from moss_tts.models.tts import CodecTTS

from .test_nano_decode import TEXTS, alone
from .test_nano_tts import NEVER_STOPS

GREEDY = SamplingOptions().greedy()


class Recorded(NanoBatch):
    """NanoBatch noting each prefill chunk (job name, start, stop) and the streams each step
    carried, in the order the scheduler asked for them."""

    def __init__(self, model):
        super().__init__(model)
        self.events, self.names = [], {}

    @property
    def chunks(self):
        return [e for e in self.events if isinstance(e, tuple)]

    @property
    def widths(self):
        return [e for e in self.events if isinstance(e, list)]

    def prefill(self, state, job: StreamJob, start: int, stop: int) -> None:
        self.events.append((self.names[id(job)], start, stop))
        super().prefill(state, job, start, stop)

    def advance(self, state, jobs):
        self.events.append([self.names[id(j)] for j in jobs])
        return super().advance(state, jobs)


def named(family: Recorded, name: str, job: StreamJob) -> StreamJob:
    family.names[id(job)] = name
    return job


def test_a_prompt_joining_running_streams_is_appended_in_chunks_between_their_steps(nano_tts):
    """A and B start together (idle: each prompt whole before the first step, chunk after
    chunk); C queues for the place A leaves after 3 frames, then its prompt goes in chunks of
    prefill_rows, one per step of B, so B never waits for C's whole prompt; C's codes still
    equal its codes alone."""
    tts = nano_tts(*NEVER_STOPS)
    rows = [tts.prompt_rows(t) for t in TEXTS[:3]]
    long_rows = rows[2]                                # a prompt of several chunks
    family = Recorded(tts.model)
    with BatchDecoder(family, max_streams=2, prefill_rows=32) as batch:
        a = named(family, "A", family.job(rows[0], options=GREEDY, seed=1, max_frames=3))
        b = named(family, "B", family.job(rows[1], options=GREEDY, seed=2, max_frames=20))
        c = named(family, "C", family.job(long_rows, options=GREEDY, seed=3, max_frames=6))
        batch.run([a, b, c])
    first_step = next(i for i, e in enumerate(family.events) if isinstance(e, list))
    assert family.events[:first_step] == [
        (name, s, min(len(r), s + 32)) for name, r in (("A", rows[0]), ("B", rows[1]))
        for s in range(0, len(r), 32)]
    c_chunks = [(s, e) for name, s, e in family.chunks if name == "C"]
    n = len(long_rows)
    assert n > 3 * 32 and c_chunks == [(s, min(n, s + 32)) for s in range(0, n, 32)], c_chunks
    # while C's prompt goes in, one chunk of it between two steps of B alone
    c_at = [i for i, e in enumerate(family.events) if isinstance(e, tuple) and e[0] == "C"]
    assert all(family.events[i + 1] == ["B"] for i in c_at[:-1])
    assert ["B", "C"] in family.widths, "C never decoded beside B"
    want = alone(tts, (long_rows, GREEDY, 3, 6))
    assert np.array_equal(np.array(c.items), want), "C's codes changed by its chunked prompt"
    assert np.array_equal(np.array(b.items), alone(tts, (rows[1], GREEDY, 2, 20)))


def test_a_job_waits_in_the_queue_for_a_place_and_room(nano_tts):
    tts = nano_tts(*NEVER_STOPS)
    rows = tts.prompt_rows(TEXTS[1])
    family = Recorded(tts.model)
    with BatchDecoder(family, max_streams=1) as batch:
        jobs = [named(family, k, family.job(rows, options=GREEDY, seed=s, max_frames=n))
                for k, s, n in (("A", 1, 2), ("B", 2, 3))]
        batch.run(jobs)
    assert family.widths == [["A"]] * 2 + [["B"]] * 3


def test_bad_scheduler_arguments_raise_input_error(nano_tts):
    tts = nano_tts(*NEVER_STOPS)
    for bad in (0, -1, 1.5, True, "4"):
        with pytest.raises(InputError, match="max_streams"):
            BatchDecoder(NanoBatch(tts.model), max_streams=bad)
        with pytest.raises(InputError, match="prefill_rows"):
            BatchDecoder(NanoBatch(tts.model), prefill_rows=bad)


def test_decoding_together_is_one_at_a_time_and_only_for_batched_families(nano_tts):
    tts = nano_tts(*NEVER_STOPS)
    with tts.decoding_together(2):
        with pytest.raises(InputError, match="already decoding together"):
            with tts.decoding_together(2):
                pass
    assert tts._batch is None                      # left: streams decode alone again

    class OneAtATime(CodecTTS):                    # a family that declares no BatchFamily
        NAME = "one-at-a-time"
        model = object()

    with pytest.raises(InputError, match="one-at-a-time decodes one stream at a time"):
        with OneAtATime().decoding_together(2):
            pass
    with pytest.raises(InputError, match="one-at-a-time decodes one stream at a time"):
        OneAtATime().synthesize_many([{"text": "x"}])
