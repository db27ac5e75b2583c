"""Several Nano streams in one decode step (moss_tts/models/nano_decode.py, issue 25): a stream
decoded in a batch equals the same stream decoded alone (NanoTTS.generate / synthesize, the
one-stream loop that follows upstream's `MossTTSNanoForCausalLM` generation); a stream that
joins or leaves never changes another's output; a different seed or text does (the guard).

Exactness: a batched step runs each stream's row as its one-row step runs it: in a region of
the shared caches laid out as its own cache, attending over that region only, its matmuls
through the one-row kernels (nn/session.py SharedDecodeSession). Global hiddens and depth
logits are bit-equal (pinned below), so codes and audio are too (each request decodes its own
codes through its own codec stream, exactly as alone).
"""

import numpy as np
import pytest

from fixtures.compare import assert_close, assert_differs
from moss_tts.codec import StreamBatch
from moss_tts.errors import InputError
from moss_tts.models.batching import BatchDecoder
from moss_tts.models.nano_decode import NanoBatch
from moss_tts.nn.session import aligned
from moss_tts.sampling import SamplingOptions

from .conftest import seeded_codes
from .test_nano_tts import NEVER_STOPS, PARITY, TEXT, Reference

# A stream's batched step against its one-row step: the same kernels over the same keys, bit
# for bit (before issue 31 ggml's B-column matmul moved them by ~1e-6)
BATCHED_ATOL = 0.0
# the guard: depth rows fed in another order move the logits far past f32 rounding
LOGIT_GUARD = 1e-4
# Equal codes through the same codec stream: the same audio, bit for bit (measured 0).
AUDIO_ATOL = 0.0

TEXTS = ["Hello there, how are you today?", "A short one.",
         "The quick brown fox jumps over the lazy dog again.", "Yes, the long story."]
GREEDY = SamplingOptions().greedy()
SAMPLED = SamplingOptions()


def jobs(tts, options, frames, seeds=(7, 8, 9, 10), texts=TEXTS):
    return [(tts.prompt_rows(t), options, s, n) for t, s, n in zip(texts, seeds, frames)]


def alone(tts, job):
    rows, options, seed, max_frames = job
    return tts.generate(rows, options=options, seed=seed, max_frames=max_frames)


def job_of(family, job):
    """The batch job of a (rows, options, seed, max_frames) tuple."""
    rows, options, seed, max_frames = job
    return family.job(rows, options=options, seed=seed, max_frames=max_frames)


def run_batch(tts, job_list, max_streams):
    with BatchDecoder(NanoBatch(tts.model), max_streams=max_streams) as batch:
        made = batch.run([job_of(batch.family, job) for job in job_list])
        n_vq = tts.config.n_vq
        return [np.array(m, dtype=np.int32).reshape(len(m), n_vq) for m in made], batch.steps


@pytest.mark.parametrize("options", [GREEDY, SAMPLED], ids=["greedy", "sampled"])
@pytest.mark.parametrize("max_streams", [2, 4])
def test_streams_in_a_batch_equal_each_stream_alone(nano_tts, options, max_streams):
    """Four jobs whose streams stop on their own or at budgets of 3-14 frames; with 2 places
    two of them join only after others left (their prompts prefilled between steps)."""
    tts = nano_tts(*PARITY)
    job_list = jobs(tts, options, [14, 3, 12, 9])
    want = [alone(tts, job) for job in job_list]
    got, steps = run_batch(tts, job_list, max_streams)
    for i, (g, w) in enumerate(zip(got, want)):
        assert g.shape == w.shape and np.array_equal(g, w), f"stream {i}: batch != alone"
    lengths = [len(w) for w in want]
    assert len(set(lengths)) > 2 and sum(lengths) > 10, f"streams too alike: {lengths}"
    assert steps < sum(lengths), "no step carried two streams"


def test_joining_and_leaving_streams_never_change_another_stream(nano_tts):
    """Stream A (16 frames, sampled) beside companions that leave after 2 and 5 frames and
    others that join then, in two different line-ups: A's codes are always its codes alone."""
    tts = nano_tts(*NEVER_STOPS)
    a = jobs(tts, SAMPLED, [16], seeds=(3,))[0]
    want = alone(tts, a)
    lineups = [jobs(tts, SAMPLED, [2, 5, 4], seeds=(11, 12, 13), texts=TEXTS[1:]),
               jobs(tts, GREEDY, [5, 9, 2], seeds=(21, 22, 23), texts=TEXTS[::-1])]
    for companions in lineups:
        got, _ = run_batch(tts, [a] + companions, max_streams=3)
        assert len(want) == 16 and np.array_equal(got[0], want), "A changed beside others"


def test_a_different_seed_or_text_changes_the_stream(nano_tts):
    """Sensitivity guard: the equalities above could not hold by accident."""
    tts = nano_tts(*NEVER_STOPS)
    base, seed, text = jobs(tts, SAMPLED, [10, 10, 10], seeds=(3, 4, 3),
                            texts=[TEXTS[0], TEXTS[0], TEXTS[2]])
    got, _ = run_batch(tts, [base, seed, text], max_streams=3)
    assert (got[0] != got[1]).any(), "another seed gave the same codes"
    assert (got[0] != got[2]).any(), "another text gave the same codes"


def test_batched_steps_equal_one_row_steps_bit_for_bit(nano_tts):
    """The global step over 3 streams and the depth position 0 over them against each
    stream's one-row step: equal; the depth logits depend on the row fed."""
    tts = nano_tts(*PARITY)
    m = tts.model
    rows = [tts.prompt_rows(t) for t in TEXTS[:3]]
    frame = seeded_codes(3, seed=5).astype(np.int32)
    want_h, want_ell = [], []
    for r, codes in zip(rows, frame):
        with m.make_state(len(r) + 1) as state:
            m.prefill(state, r)
            want_h.append(m.prefill(state, m.frame_row(codes)))
            want_ell.append(m.depth_logits(state, 0, want_h[-1]))
    with m.make_state(sum(aligned(len(r) + 1) for r in rows), streams=3) as state:
        seqs = [state.global_.open(len(r) + 1) for r in rows]   # each as its state alone
        for seq, r in zip(seqs, rows):
            m.prefill_stream(state, seq, r)
        h = m.step_hidden(state, seqs, np.concatenate([m.frame_row(c) for c in frame]))
        depth = state.depth
        dseqs = [depth.open(m.config.n_vq + 1) for _ in rows]
        ell = depth.step(dseqs, m.depth_feed(0, h), variant=0)["depth.logits"]
        depth.reset()
        dseqs = [depth.open(m.config.n_vq + 1) for _ in rows]
        swapped = depth.step(dseqs, m.depth_feed(0, h[::-1]), variant=0)["depth.logits"]
    assert_close(h, np.stack(want_h), atol=BATCHED_ATOL, what="batched global step")
    assert_close(ell, np.stack(want_ell), atol=BATCHED_ATOL, what="batched depth position 0")
    assert_differs(swapped, ell, atol=LOGIT_GUARD, what="depth rows fed in another order")


def test_synthesize_many_equals_synthesize_for_each_request(nano_tts):
    """Voice clone, continuation over two text chunks (the second joins when the first ends),
    and a greedy request, decoded together: each one's audio equals `synthesize` alone."""
    tts = nano_tts(*PARITY)
    requests = [
        {"text": TEXT, "seed": 3, "max_frames": 20,
         "reference": Reference(seeded_codes(6, seed=1))},
        {"text": "Hello there. My friend hears the long story today.", "seed": 5,
         "max_frames": 12, "max_text_tokens": 8},
        {"text": TEXTS[2], "options": GREEDY, "max_frames": 15},
    ]
    got = tts.synthesize_many(requests, max_streams=2)
    assert len(got) == len(requests)
    for i, (request, (audio, sr)) in enumerate(zip(requests, got)):
        kw = dict(request)
        want, want_sr = tts.synthesize(kw.pop("text"), **kw)
        assert sr == want_sr and audio.shape[1] == 2
        assert_close(audio, want, atol=AUDIO_ATOL, what=f"request {i}: many vs alone")
    assert len(tts.plan(requests[1]["text"], max_text_tokens=8)) > 1
    # guard: the same requests with another seed for the first change its audio only
    other = tts.synthesize_many([dict(requests[0], seed=4)] + requests[1:], max_streams=3)
    assert_differs(other[0][0][:len(got[0][0])], got[0][0][:len(other[0][0])], atol=1e-6,
                   what="first request with seed 4")
    assert_close(other[2][0], got[2][0], atol=AUDIO_ATOL, what="request 2 beside a changed one")


def test_streams_in_a_batch_take_their_audio_from_one_codec_push_per_step(nano_tts,
                                                                          monkeypatch):
    """Inside decoding_together each stream's codec stream is a slot of the batch's codec
    streams, decoded with the others' in one push per step (issue 35): pushes carry several
    streams, and each request's audio still equals `synthesize` alone (a continuation over
    two chunks keeps its slot; a voice-clone request; a third request beyond the slots
    decodes through its own stream decoder)."""
    tts = nano_tts(*PARITY)
    pushed = []
    push = StreamBatch.push
    monkeypatch.setattr(StreamBatch, "push",
                        lambda self, codes: pushed.append(len(codes)) or push(self, codes))
    requests = [
        {"text": "Hello there. My friend hears the long story today.", "seed": 5,
         "max_frames": 12, "max_text_tokens": 8},
        {"text": TEXT, "seed": 3, "max_frames": 10, "reference": Reference(seeded_codes(6, seed=1))},
        {"text": TEXTS[2], "options": GREEDY, "max_frames": 7},
    ]
    got = tts.synthesize_many(requests, max_streams=2)
    assert max(pushed) == 2, f"no codec push carried two streams: {pushed}"
    monkeypatch.setattr(StreamBatch, "push", push)
    for i, (request, (audio, _)) in enumerate(zip(requests, got)):
        kw = dict(request)
        want, _ = tts.synthesize(kw.pop("text"), **kw)
        assert_close(audio, want, atol=AUDIO_ATOL, what=f"request {i}: batched codec vs alone")


def test_bad_batch_arguments_raise_input_error(nano_tts):
    tts = nano_tts(*PARITY)
    with pytest.raises(InputError, match="max_streams"):
        BatchDecoder(NanoBatch(tts.model), max_streams=0)
    with pytest.raises(InputError, match=r"requests\[1\]"):
        tts.synthesize_many([{"text": TEXT}, "just text"])
    with pytest.raises(InputError, match="max_frames"):
        tts.synthesize_many([{"text": TEXT, "max_frames": 0}])
    rows = tts.prompt_rows(TEXT)
    with BatchDecoder(NanoBatch(tts.model), max_streams=2) as batch:
        good = batch.submit(batch.family.job(rows, options=GREEDY, max_frames=4))
        bad = rows.copy()
        bad[0, 0] = 10 ** 6
        batch.submit(batch.family.job(bad, options=GREEDY, max_frames=4))
        with pytest.raises(InputError, match="text ids"):
            batch.step()
        while batch.pending:  # the good job goes on alone
            batch.step()
    assert np.array_equal(np.array(good.items), alone(tts, (rows, GREEDY, None, 4)))
