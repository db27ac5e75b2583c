"""Several MossTTSRealtime streams in one decode step (moss_tts/models/realtime_decode.py, issue
25): a stream decoded in a batch equals the same stream decoded alone (RealtimeModel.generate,
the one-stream loop that follows upstream's inferencer); a stream that joins (its prompt
appended in chunks while others decode) or leaves never changes another's frames; a different
seed or text does (the guard); a live session inside decoding_together decodes on its own
and changes no batched stream, nor they it. The tiny steered model speaks one frame per text
id, then stops on EOS, so streams with texts of different lengths stop at different steps.

Exactness: a batched step runs each stream's row as its one-row step runs it (its own region
of the shared caches, attention over that region only, the one-row matmul kernels:
nn/session.py SharedDecodeSession), so hiddens and logits are bit-equal (pinned below), and so
are frames and audio (each request decodes its own frames through its own codec stream).
"""

import warnings

import numpy as np
import pytest

from fixtures.compare import assert_close, assert_differs
from fixtures.make_realtime import CODEBOOK, RVQ
from moss_tts.errors import InputError
from moss_tts.models.batching import BatchDecoder
from moss_tts.models.realtime_decode import RealtimeBatch
from moss_tts.sampling import RealtimeSamplingOptions
from moss_tts.models.tts import Reference

from .test_realtime import prompt_rows

# A stream's batched step against its one-row step: bit for bit (before issue 31 ggml's
# B-column matmul moved hiddens and logits by ~1e-6)
BATCHED_ATOL = 0.0
# the guard: local rows fed in another order move the logits far past f32 rounding
LOGIT_GUARD = 1e-4
# Equal frames through the same codec stream: the same audio, bit for bit.
AUDIO_ATOL = 0.0

GREEDY = RealtimeSamplingOptions(do_sample=False)   # the penalty (1.1) stays on, as upstream
SAMPLED = RealtimeSamplingOptions()
TEXT = "Hello there, quick brown foxes jump. Over lazy dogs; every day, 12345."


def job(options, n_text, seed, max_frames, prompt=3, n_rows=12):
    """(prompt rows, text ids after the lead, options, seed, budget): the steered model makes
    about n_text + 1 frames unless the budget comes first."""
    return (prompt_rows(seed=prompt, n=n_rows), list(range(311, 311 + n_text)), options, seed,
            max_frames)


def alone(model, j):
    rows, text_ids, options, seed, max_frames = j
    return model.generate(rows, text_ids, options=options, seed=seed, max_frames=max_frames)


def job_of(family, j):
    """The batch job of a (rows, text ids, options, seed, max_frames) tuple."""
    rows, text_ids, options, seed, max_frames = j
    return family.job(rows, text_ids=text_ids, options=options, seed=seed,
                      max_frames=max_frames)


def frames_of(made):
    return np.array(made, dtype=np.int64).reshape(len(made), RVQ)


def run_batch(model, jobs, max_streams, **kwargs):
    with BatchDecoder(RealtimeBatch(model), max_streams=max_streams, **kwargs) as batch:
        made = batch.run([job_of(batch.family, j) for j in jobs])
        return [frames_of(m) for m in made], batch.steps


@pytest.mark.parametrize("options", [GREEDY, SAMPLED], ids=["greedy", "sampled"])
@pytest.mark.parametrize("max_streams", [2, 4])
def test_streams_in_a_batch_equal_each_stream_alone(realtime_model, options, max_streams):
    """Four jobs whose streams stop on their own (after 1-14 frames) or at a budget of 6; with
    2 places two of them join only after others left (their prompts prefilled between
    steps)."""
    model = realtime_model(True)
    jobs = [job(options, 13, 7, 20, prompt=3), job(options, 0, 8, 20, prompt=4, n_rows=9),
            job(options, 12, 9, 6, prompt=5), job(options, 4, 10, 20, prompt=6, n_rows=15)]
    want = [alone(model, j) for j in jobs]
    got, steps = run_batch(model, jobs, max_streams)
    for i, (g, w) in enumerate(zip(got, want)):
        assert g.shape == w.shape and np.array_equal(g, w), f"stream {i}: batch != alone"
    lengths = [len(w) for w in want]
    assert len(set(lengths)) > 2 and sum(lengths) > 10, f"streams too alike: {lengths}"
    assert steps < sum(lengths), "no step carried two streams"


def test_joining_and_leaving_streams_never_change_another_stream(realtime_model):
    """Stream A (16 frames, sampled, the default model that speaks on) beside companions that
    leave after 2 and 5 frames and others that join then, in two different line-ups: A's
    frames are always its frames alone."""
    model = realtime_model(False)
    a = job(SAMPLED, 8, 3, 16)
    want = alone(model, a)
    lineups = [[job(SAMPLED, 3, 11, 2, prompt=4), job(SAMPLED, 5, 12, 5, prompt=5),
                job(SAMPLED, 0, 13, 4, prompt=6)],
               [job(GREEDY, 9, 21, 5, prompt=7), job(GREEDY, 2, 22, 9, prompt=8),
                job(GREEDY, 4, 23, 2, prompt=9)]]
    for companions in lineups:
        got, _ = run_batch(model, [a] + companions, max_streams=3)
        assert len(want) == 16 and np.array_equal(got[0], want), "A changed beside others"


def test_a_long_prompt_joining_in_chunks_while_others_decode_equals_alone(realtime_model):
    """With prefill_rows=3, a 40-row prompt joins over 14 steps while A (31 frames) decodes,
    once C (2 frames) has left its place: every stream equals its stream alone."""
    model = realtime_model(True)
    a, c = job(SAMPLED, 30, 5, 40), job(GREEDY, 1, None, 2, prompt=4)
    b = job(SAMPLED, 6, 6, 20, prompt=8, n_rows=40)
    want = [alone(model, j) for j in (a, c, b)]
    with BatchDecoder(RealtimeBatch(model), max_streams=2, prefill_rows=3) as batch:
        jobs = [batch.submit(job_of(batch.family, j)) for j in (a, c, b)]
        beside = 0          # steps in which B's prompt was appended while A decoded
        while batch.pending:
            joining = jobs[2] in batch.joining or jobs[2] in batch.queue
            batch.step()
            beside += joining and jobs[0] in batch.active and jobs[2].filled > 0
        got = [frames_of(j.items) for j in jobs]
    assert beside >= 10, f"B's prompt joined in {beside} steps beside A"
    for i, (g, w) in enumerate(zip(got, want)):
        assert g.shape == w.shape and np.array_equal(g, w), f"stream {i}: batch != alone"
    assert len(want[0]) == 31 and len(want[2]) > 3


def test_a_different_seed_or_text_changes_the_stream(realtime_model):
    """Sensitivity guard: the equalities above could not hold by accident."""
    model = realtime_model(False)
    base, seed, text = job(SAMPLED, 8, 3, 10), job(SAMPLED, 8, 4, 10), job(SAMPLED, 8, 3, 10,
                                                                          prompt=5)
    got, _ = run_batch(model, [base, seed, text], max_streams=3)
    assert got[0].shape == got[1].shape == got[2].shape == (10, RVQ)
    assert (got[0] != got[1]).any(), "another seed gave the same frames"
    assert (got[0] != got[2]).any(), "another prompt gave the same frames"


def test_batched_steps_equal_one_row_steps_bit_for_bit(realtime_model):
    """The backbone step over 3 streams and local position 0 over them against each stream's
    one-row step: equal; the local logits depend on the row fed."""
    model = realtime_model(False)
    prompts = [prompt_rows(seed=s, n=n) for s, n in ((3, 12), (4, 9), (5, 15))]
    frame = np.random.default_rng(5).integers(0, CODEBOOK, size=(3, RVQ))
    nexts = [np.concatenate([[311 + i], f])[None] for i, f in enumerate(frame)]
    want_h, want_ell = [], []
    for rows, row in zip(prompts, nexts):
        with model.stream(len(rows) + 1) as s:
            s.feed(rows)
            want_h.append(s.feed(row))
            want_ell.append(s.local.run({"local.h": want_h[-1][None]}, 1, variant=0)
                            ["local.logits"][0])
    with model.make_backbone(96, streams=3) as backbone, model.make_local(streams=3) as local:
        seqs = [backbone.open(len(rows) + 1) for rows in prompts]    # each as its stream alone
        for seq, rows in zip(seqs, prompts):
            model.prefill_stream(backbone, seq, rows)
        h = model.step_hidden(backbone, seqs, np.concatenate(nexts))
        lseqs = [local.open(RVQ) for _ in prompts]
        ell = local.step(lseqs, {"local.h": h}, variant=0)["local.logits"]
        local.reset()
        lseqs = [local.open(RVQ) for _ in prompts]
        swapped = local.step(lseqs, {"local.h": h[::-1].copy()}, variant=0)["local.logits"]
    assert_close(h, np.stack(want_h), atol=BATCHED_ATOL, what="batched backbone step")
    assert_close(ell, np.stack(want_ell), atol=BATCHED_ATOL, what="batched local position 0")
    assert_differs(swapped, ell, atol=LOGIT_GUARD, what="local rows fed in another order")


def test_synthesize_many_equals_synthesize_for_each_request(realtime_tts):
    """A voice-cloned sampled request, a greedy one, and one cut by its budget, decoded
    together: each one's audio equals `synthesize` alone."""
    tts = realtime_tts()
    voice = Reference(np.random.default_rng(1).integers(0, CODEBOOK, size=(6, RVQ)))
    requests = [{"text": TEXT, "seed": 7, "reference": voice},
                {"text": "Sure, here is another answer for you.", "options": GREEDY},
                {"text": TEXT, "seed": 9, "max_frames": 8}]
    with pytest.warns(UserWarning, match="frame budget"):
        got = tts.synthesize_many(requests, max_streams=2)
    assert len(got) == len(requests)
    for i, (request, (audio, sr)) in enumerate(zip(requests, got)):
        kw = dict(request)
        with warnings.catch_warnings(record=True) as cut:
            warnings.simplefilter("always")
            want, want_sr = tts.synthesize(kw.pop("text"), **kw)
        assert len(cut) == (i == 2), f"request {i}: budget warnings {cut}"
        assert sr == want_sr and audio.shape[1] == 1
        assert_close(audio, want, atol=AUDIO_ATOL, what=f"request {i}: many vs alone")
    assert len(got[2][0]) < len(got[0][0])
    # guard: the same requests with another seed for the first change its audio only
    other = tts.synthesize_many([dict(requests[0], seed=4)] + requests[1:2], max_streams=3)
    n = min(len(other[0][0]), len(got[0][0]))
    assert_differs(other[0][0][:n], got[0][0][:n], atol=1e-6, what="first request with seed 4")
    assert_close(other[1][0], got[1][0], atol=AUDIO_ATOL, what="request 1 beside a changed one")


def test_a_bad_job_fails_alone(realtime_model):
    """Bad rows, text ids or budget raise InputError when the job is made, while the batch
    runs; the good job goes on and equals its stream alone."""
    model = realtime_model(True)
    good = job(SAMPLED, 6, 2, 10)
    rows = good[0]
    bad_rows = rows.copy()
    bad_rows[0, 0] = 10 ** 6
    with BatchDecoder(RealtimeBatch(model), max_streams=2) as batch:
        running = batch.submit(job_of(batch.family, good))
        batch.step()
        with pytest.raises(InputError, match="text ids"):
            batch.family.job(bad_rows, text_ids=[311], options=SAMPLED, seed=1, max_frames=10)
        with pytest.raises(InputError, match="text ids"):
            batch.family.job(rows, text_ids=[311, -1], options=SAMPLED, seed=1, max_frames=10)
        with pytest.raises(InputError, match="max_frames"):
            batch.family.job(rows, text_ids=[311], options=SAMPLED, seed=1, max_frames=0)
        with pytest.raises(InputError, match="shape"):
            batch.family.job(rows[:, 1:], text_ids=[311], options=SAMPLED, seed=1, max_frames=10)
        while batch.pending:
            batch.step()
    assert np.array_equal(frames_of(running.items), alone(model, good))
    with pytest.raises(InputError, match="max_streams"):
        BatchDecoder(RealtimeBatch(model), max_streams=0)


def live_audio(tts, text: str, seed: int, between=lambda: None) -> np.ndarray:
    """A live session's audio for `text` pushed a character at a time (as an LLM's stream
    arrives), then drained; `between()` runs after each push and each drained chunk."""
    with tts.session(seed=seed) as s:
        parts = []
        for ch in text:
            parts.append(s.push_text(ch))
            between()
        s.end_text()
        for chunk in s.drain():
            parts.append(chunk)
            between()
    return np.concatenate(parts)


def test_a_live_session_inside_decoding_together_leaves_the_batch_streams_alone(realtime_tts):
    """Inside decoding_together a live session decodes on its own (its own cache, not the
    batch's): its pushes and drained chunks interleaved, in one thread, with pulls of two
    batched streams (each pull may step both), its audio equals the session's outside, and
    each stream's audio its `synthesize` alone; the streams outlast the session, so every
    session step fell between two batch steps."""
    tts = realtime_tts()
    # a frame a push: the adaptive pushes follow the clock (chunk_ladder), their sums too
    requests = [dict(text=TEXT + " " + TEXT, seed=7, chunk_frames=1),
                dict(text=TEXT[::-1] + TEXT, options=GREEDY, chunk_frames=1)]
    live_text, live_seed = "Sure, here is a live answer, arriving word by word.", 5
    want = [tts.synthesize(**r)[0] for r in requests]
    want_live = live_audio(tts, live_text, live_seed)
    with tts.decoding_together(2):
        streams = [tts.stream(**r) for r in requests]
        chunks = [[], []]

        def pull_each():
            for stream, got in zip(streams, chunks):
                got.append(next(stream))

        live = live_audio(tts, live_text, live_seed, between=pull_each)
        pulled_beside = len(chunks[0])
        for stream, got in zip(streams, chunks):
            got += list(stream)
    assert pulled_beside > 40 and all(len(c) > pulled_beside for c in chunks), \
        "the streams did not outlast the session"
    assert_close(live, want_live, atol=AUDIO_ATOL, what="live session beside the batch")
    for i, (got, w) in enumerate(zip(chunks, want)):
        assert_close(np.concatenate(got), w, atol=AUDIO_ATOL, what=f"stream {i} beside a session")
    # guard: another seed changes the session's audio
    other = live_audio(tts, live_text, live_seed + 1)
    n = min(len(other), len(live))
    assert_differs(other[:n], live[:n], atol=1e-6, what="session with another seed")
