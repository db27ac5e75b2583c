"""Several MossTTSLocal and Local v1.5 streams in one decode step (moss_tts/models/
local_decode.py, local_v15_decode.py; issue 25): a stream decoded in a batch equals the same
stream decoded alone (`LocalModel.generate` / `LocalV15Model.iter_frames`, and `synthesize`
for `synthesize_many`); a stream that joins or leaves never changes another's output; a
different seed does (the guard).

Exactness: a batched step runs each stream's row as its one-row step runs it (its own region
of the shared caches, attention over that region only, the one-row matmul kernels:
nn/session.py SharedDecodeSession), so rows and audio are bit-equal; pinned here with f32 KV
caches, and with the default f16 ones users get in tests/models/test_batch_equivalence.py.
"""

from dataclasses import dataclass

import numpy as np
import pytest

from fixtures.compare import assert_close, assert_differs
from moss_tts.errors import InputError
from moss_tts.ggml import F32
from moss_tts.models.batching import BatchDecoder
from moss_tts.models.local_decode import LocalBatch
from moss_tts.models.local_tts import LocalTTS
from moss_tts.models.local_v15_decode import LocalV15Batch
from moss_tts.models.local_v15_tts import LocalV15TTS
from moss_tts.models.long_text import split_long_text
from moss_tts.sampling import LocalSamplingOptions, LocalV15SamplingOptions
from moss_tts.models.tts import Reference

from .local_fixtures import THREADS
from .test_local import prompt_rows as local_prompt
from .test_local_v15 import prompt_rows as v15_prompt

AUDIO_ATOL = 0.0   # equal codes through the same codec stream: the same audio, bit for bit


@dataclass(frozen=True)
class Family:
    """One family's batch and its one-stream loop, as the tests drive them."""

    name: str
    batch: type
    prompt: object            # prompt_rows(seed, reference) of the family's model tests
    budget: str               # the job's (and alone loop's) budget keyword
    greedy: object
    sampled: object
    greedy_model: tuple       # fixture key of the model of the greedy streams
    sampled_model: tuple      # ... whose sampled streams do
    endless_model: tuple      # ... whose streams run to their budget

    def alone(self, model, rows, **kw) -> np.ndarray:
        """The stream decoded by itself, as the batch's items [items, width]."""
        if self.batch is LocalBatch:
            return model.generate(rows, **kw)
        frames = list(model.iter_frames(rows, **kw))
        return np.array(frames, dtype=np.int64).reshape(len(frames), model.config.n_vq)


LOCAL = Family("local", LocalBatch, local_prompt, "max_new_frames",
               LocalSamplingOptions().greedy(), LocalSamplingOptions(), (0, False), (2, True),
               (0, False))
V15 = Family("local_v15", LocalV15Batch, v15_prompt, "max_frames",
             LocalV15SamplingOptions(do_sample=False), LocalV15SamplingOptions(), (1.5,), (2.0,),
             (6.0,))


@pytest.fixture(params=[LOCAL, V15], ids=lambda f: f.name)
def family(request):
    return request.param


@pytest.fixture
def model_of(family, local_model, local_v15_model):
    """fixture key → the family's tiny model (f32 KV caches)."""
    return lambda key: (local_model if family is LOCAL else local_v15_model)(*key)


def job_list(family, options, budgets, seeds=(0, 1, 2, 3), prompts=(3, 4, 5, 6)):
    return [(family.prompt(p, reference=True), {"options": options, "seed": s, family.budget: b})
            for p, s, b in zip(prompts, seeds, budgets)]


def run_batch(family, model, jobs, max_streams, **kw):
    with BatchDecoder(family.batch(model), max_streams=max_streams, **kw) as batch:
        made = batch.run([batch.family.job(rows, **job) for rows, job in jobs])
        return [np.array(m, dtype=np.int64).reshape(len(m), -1) for m in made], batch.steps


def assert_each_alone(family, model, jobs, got):
    for i, ((rows, job), g) in enumerate(zip(jobs, got)):
        want = family.alone(model, rows, **job)
        assert g.shape == want.shape and np.array_equal(g, want), f"stream {i}: batch != alone"


@pytest.mark.parametrize("sampled", [False, True], ids=["greedy", "sampled"])
@pytest.mark.parametrize("max_streams", [2, 4])
def test_streams_in_a_batch_equal_each_stream_alone(family, model_of, sampled, max_streams):
    """Four jobs whose streams stop on their own or at budgets of 3-14 frames; with 2 places
    two of them join only after others left (their prompts prefilled between steps)."""
    model = model_of(family.sampled_model if sampled else family.greedy_model)
    jobs = job_list(family, family.sampled if sampled else family.greedy, [14, 3, 12, 9])
    got, steps = run_batch(family, model, jobs, max_streams)
    assert_each_alone(family, model, jobs, got)
    lengths = [len(g) for g in got]
    assert len(set(lengths)) > 2 and sum(lengths) > 10, f"streams too alike: {lengths}"
    assert steps < sum(lengths), "no step carried two streams"


def test_joining_and_leaving_streams_never_change_another_stream(family, model_of):
    """Stream A (16 frames, sampled) beside companions that leave after 2 and 5 frames and
    others that join then, in two different line-ups: A's output is always its output alone."""
    model = model_of(family.endless_model)
    a = job_list(family, family.sampled, [16], seeds=(3,))[0]
    want = family.alone(model, a[0], **a[1])
    lineups = [job_list(family, family.sampled, [2, 5, 4], seeds=(11, 12, 13), prompts=(4, 5, 6)),
               job_list(family, family.greedy, [5, 9, 2], seeds=(21, 22, 23), prompts=(7, 8, 9))]
    for companions in lineups:
        got, _ = run_batch(family, model, [a] + companions, max_streams=3)
        assert len(want) == 16 and np.array_equal(got[0], want), "A changed beside others"
        assert_each_alone(family, model, companions, got[1:])


def test_a_long_prompt_joins_in_chunks_while_others_decode(family, model_of):
    """BatchDecoder(prefill_rows=3): a prompt of 20+ rows submitted while two streams decode is
    appended 3 rows per step, the two going on meanwhile; all three equal their runs alone."""
    model = model_of(family.endless_model)
    early = job_list(family, family.sampled, [12, 10], seeds=(5, 6), prompts=(3, 4))
    late = (family.prompt(9, reference=True), {"options": family.sampled, "seed": 7,
                                               family.budget: 8})
    assert len(late[0]) > 12
    with BatchDecoder(family.batch(model), max_streams=3, prefill_rows=3) as batch:
        running = [batch.submit(batch.family.job(rows, **job)) for rows, job in early]
        batch.step()
        joining = batch.submit(batch.family.job(late[0], **late[1]))
        made, steps = sum(len(job.items) for job in running), 0
        while not joining.joined:
            batch.step()
            steps += 1
        assert steps == -(-len(late[0]) // 3)
        assert sum(len(job.items) for job in running) - made == 2 * steps, "others waited"
        while batch.pending:
            batch.step()
    got = [np.array(job.items, dtype=np.int64) for job in running + [joining]]
    assert_each_alone(family, model, early + [late], got)


def test_a_different_seed_changes_the_stream(family, model_of):
    """Sensitivity guard: the equalities above could not hold by accident."""
    model = model_of(family.endless_model)
    jobs = job_list(family, family.sampled, [10, 10], seeds=(3, 4), prompts=(3, 3))
    got, _ = run_batch(family, model, jobs, max_streams=2)
    assert got[0].shape == got[1].shape and (got[0] != got[1]).any(), "another seed, same output"


def test_a_bad_prompt_fails_its_job_alone(family, model_of):
    model = model_of(family.endless_model)
    rows, job = job_list(family, family.greedy, [4])[0]
    bad = rows.copy()
    bad[0, 0] = 10 ** 6
    with BatchDecoder(family.batch(model), max_streams=2) as batch:
        good = batch.submit(batch.family.job(rows, **job))
        batch.submit(batch.family.job(bad, **job))
        with pytest.raises(InputError, match="text ids"):
            batch.step()
        while batch.pending:  # the good job goes on alone
            batch.step()
    assert np.array_equal(np.array(good.items), family.alone(model, rows, **job))
    with pytest.raises(InputError, match=family.budget):
        family.batch(model).job(rows, **dict(job, **{family.budget: 0}))


def test_local_streams_of_different_n_vq_share_a_batch(local_model):
    """n_vq_for_inference is a backbone graph variant: streams of 1, 2 and all 4 codebooks
    decode together (one backbone graph per n, every depth graph shared), each equal alone."""
    model = local_model(*LOCAL.endless_model)
    jobs = [(rows, dict(job, n_vq_for_inference=n)) for (rows, job), n in
            zip(job_list(LOCAL, LOCAL.sampled, [9, 12, 7, 10]), [2, None, 1, 2])]
    got, steps = run_batch(LOCAL, model, jobs, max_streams=4)
    assert_each_alone(LOCAL, model, jobs, got)
    assert (got[2][:, 2:] == 0).all() and got[1][:, 2:].any()
    assert steps < sum(len(g) for g in got), "no step carried two streams"
    with pytest.raises(InputError, match="n_vq_for_inference"):
        LocalBatch(model).job(jobs[0][0], n_vq_for_inference=9)


# -- synthesize_many ---------------------------------------------------------------------------
@pytest.fixture(scope="module")
def local_tts(local_files, v1_codec_gguf):
    with LocalTTS.load(local_files(2, speech=True)[3], codec=v1_codec_gguf, threads=THREADS,
                       kv_type=F32) as tts:
        yield tts


@pytest.fixture(scope="module")
def v15_tts(local_v15_files, v2_codec_gguf):
    with LocalV15TTS.load(local_v15_files(2.0)[3], codec=v2_codec_gguf, threads=THREADS,
                          kv_type=F32) as tts:
        yield tts


LONG_TEXT = " ".join(["Hello there, my friend, the long story goes on today."] * 14)


def requests_for(tts):
    """Voice clone, a continuation, a long text cut in chunks (each next chunk joins when its
    last ends), and a greedy request."""
    n_vq = tts.config.n_vq
    codes = np.random.default_rng(1).integers(0, 64, (6, n_vq))
    return [
        {"text": "Hello there, how are you?", "seed": 7, "max_frames": 20,
         "reference": Reference(codes)},
        {"text": "And then the next part.", "seed": 6, "max_frames": 12,
         "prompt": Reference(codes[::-1].copy()), "prompt_text": "Earlier words."},
        {"text": LONG_TEXT, "seed": 9, "max_frames": 6},
        {"text": "The quick brown fox.", "options": tts.OPTIONS().greedy(), "max_frames": 15},
    ]


@pytest.mark.parametrize("which", ["local", "local_v15"])
def test_synthesize_many_equals_synthesize_for_each_request(which, local_tts, v15_tts):
    tts = local_tts if which == "local" else v15_tts
    requests = requests_for(tts)
    for request in requests:
        request["chunk_frames"] = 3   # fixed codec pushes: the same floats on every run
    if which == "local":
        requests[3]["n_vq_for_inference"] = 2
    got = tts.synthesize_many(requests, max_streams=2)
    assert len(got) == len(requests)
    for i, (request, (audio, sr)) in enumerate(zip(requests, got)):
        kw = dict(request)
        want, want_sr = tts.synthesize(kw.pop("text"), **kw)
        assert sr == want_sr and audio.shape[1] == tts.channels and len(audio)
        assert_close(audio, want, atol=AUDIO_ATOL, what=f"request {i}: many vs alone")
    assert len(split_long_text(LONG_TEXT, tts.tokenizer)) > 1
    # guard: the same requests with another seed for the first change its audio only
    other = tts.synthesize_many([dict(requests[0], seed=8)] + requests[1:], max_streams=3)
    assert_differs(other[0][0][:len(got[0][0])], got[0][0][:len(other[0][0])], atol=1e-6,
                   what="first request with seed 8")
    assert_close(other[3][0], got[3][0], atol=AUDIO_ATOL, what="request 3 beside a changed one")
