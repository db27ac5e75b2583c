"""Several MossTTSDelay streams in one decode step (moss_tts/models/delay_decode.py, issue 25): a
stream decoded in a batch makes the rows it makes alone (DelayModel.generate, the one-stream loop
tests/models/test_delay.py pins against the float64 reference), whoever joins or leaves beside
it; so DelayTTS.synthesize_many, and each published checkpoint's, equals synthesize.

Exactness: a batched step runs each stream's row as its one-row step runs it (its own region
of the shared cache, attention over that region only, the one-row matmul kernels:
nn/session.py SharedDecodeSession), so rows and audio are bit-equal, with the default f16 KV
cache too. A joining prompt is appended in the chunks a one-stream session uses
(models/batching.py PREFILL_ROWS): a prompt appended in other chunks (a smaller prefill_rows)
moves the logits by f16 rounding, measured 3e-3 on the tiny model's 67-row prompts, as it
does appended so in a DecodeSession alone: a sampled draw can then flip (seen with 32-row
chunks: the continuation request below made other rows than alone; pinned below with
prefill_rows=3).
"""

import functools

import numpy as np
import pytest

from fixtures.compare import assert_close, assert_differs

from moss_tts.errors import InputError
from moss_tts.ggml import F16, F32, Weights, get_backend
from moss_tts.models import delay_tts as delay_tts_module
from moss_tts.models.batching import BatchDecoder
from moss_tts.models.delay import DelayModel, RowSampler, step_run
from moss_tts.models.delay_decode import DelayBatch, shared_text_ids
from moss_tts.models.delay_tts import DelayTTS
from moss_tts.models.local_tts import LocalTTS
from moss_tts.nn.session import PREFILL_ROWS, SharedDecodeSession  # alone's prompt chunk
from moss_tts.reference import Reference
from moss_tts.sampling import DelaySamplingOptions

from .conftest import THREADS
from .test_delay import DELAY, END, F16_KV_ATOL, GEN, IM_END, prompt_rows

GREEDY = DelaySamplingOptions().greedy()
SAMPLED = DelaySamplingOptions()
# The tiny model with GEN favoured a little (+1) and <|im_end|> strongly (+8): streams stay in
# audio a while, then end on their own once allowed (greedy: after 7-30 rows or never, by
# prompt; sampled: after 7-17), so streams stop at different times, some at their budget.
ENDING = (1.0, 8.0)
# f32 rounding of one-row vs R-row kernels through 2 blocks (measured ≤ 2e-6), as test_delay.py
LOGIT_ATOL = 1e-4


@pytest.fixture(scope="module")
def ending_model(tmp_path_factory):
    """KV type → the tiny Delay checkpoint (seed 0) with the ENDING text-head biases, through
    the real converter (--strict) and loader."""
    from converters.delay import convert
    from fixtures.make_delay import make_state, make_tiny_delay_checkpoint, tiny_config

    cfg = tiny_config()
    state = make_state(cfg, 0, ENDING[0], steady=False)
    state["lm_heads.0.weight"][cfg["im_end_token_id"], 0] += ENDING[1]
    root = tmp_path_factory.mktemp("delay_ending")
    gguf = convert(str(make_tiny_delay_checkpoint(root / "hf", config=cfg, state=state)),
                   root / "delay.gguf", strict=True)
    made = {}

    def get(kv_type=F32):
        if kv_type not in made:
            made[kv_type] = DelayModel(Weights.load(gguf, get_backend(None, THREADS)),
                                       kv_type=kv_type)
        return made[kv_type]

    yield get
    for model in made.values():
        model.close()


# (prompt seed, with a reference block, budget): greedy, these end after 9 (<|im_end|>), 30
# (<|im_end|>), 14 (the budget) and 7 (<|im_end|>) rows
PROMPTS = [(4, True, 40), (7, True, 40), (3, True, 14), (6, False, 40)]


def jobs(options, seeds=(7, 8, 9, 10), prompts=PROMPTS):
    return [(prompt_rows(seed=p, reference=ref), options, seed, budget)
            for (p, ref, budget), seed in zip(prompts, seeds)]


def alone(model, job):
    rows, options, seed, budget = job
    return model.generate(rows, options=options, seed=seed, max_new_rows=budget)


def as_rows(items, model):
    return np.array(items, dtype=np.int64).reshape(-1, model.config.n_vq + 1)


def job_of(family, job):
    """The batch job of a (rows, options, seed, max_new_rows) tuple."""
    rows, options, seed, max_new_rows = job
    return family.job(rows, options=options, seed=seed, max_new_rows=max_new_rows)


def run_batch(model, job_list, max_streams, prefill_rows=3):
    """Each job's rows decoded in one BatchDecoder, and its number of steps."""
    with BatchDecoder(DelayBatch(model), max_streams=max_streams,
                      prefill_rows=prefill_rows) as batch:
        made = batch.run([job_of(batch.family, job) for job in job_list])
        return [as_rows(m, model) for m in made], batch.steps


@pytest.mark.parametrize("kv_type, prefill_rows", [(F32, 3), (F16, PREFILL_ROWS)],
                         ids=["f32_kv_prompts_in_chunks", "f16_kv_prompts_whole"])
@pytest.mark.parametrize("options", [GREEDY, SAMPLED], ids=["greedy", "sampled"])
@pytest.mark.parametrize("max_streams", [2, 4])
def test_streams_in_a_batch_equal_each_stream_alone(ending_model, options, max_streams,
                                                    kv_type, prefill_rows):
    """Four jobs with their own seeds and budgets, ending on <|im_end|> or at the budget; with
    2 places two of them join only after others left (f32: prompts appended 3 rows a step)."""
    model = ending_model(kv_type)
    job_list = jobs(options)
    want = [alone(model, job) for job in job_list]
    got, steps = run_batch(model, job_list, max_streams, prefill_rows)
    for i, (g, w) in enumerate(zip(got, want)):
        assert g.shape == w.shape and np.array_equal(g, w), f"stream {i}: batch != alone"
    lengths = [len(w) for w in want]
    ended = [w[-1, 0] == IM_END for w in want]
    assert len(set(lengths)) > 2 and any(ended), f"streams too alike: {lengths} {ended}"
    assert steps < sum(lengths), "no step carried two streams"


@pytest.mark.parametrize("kv_type, prefill_rows, atol", [
    (F32, 3, LOGIT_ATOL), (F16, PREFILL_ROWS, LOGIT_ATOL), (F16, 3, F16_KV_ATOL)],
    ids=["f32_kv_in_chunks", "f16_kv_whole", "f16_kv_in_chunks"])
def test_a_prompt_joining_beside_a_decoding_stream_gives_its_first_logits_alone(
        ending_model, kv_type, prefill_rows, atol):
    """The first step's logits of a prompt appended while another stream decodes, against
    `step_run` alone: f32 rounding, except an f16 cache filled in other chunks than alone's,
    which moves them by f16 rounding (more than f32's: the guard that the check can fail)."""
    model = ending_model(kv_type)
    rows = np.vstack([prompt_rows(seed=9)[:-1], prompt_rows(seed=7)[:-1], prompt_rows(seed=5)])
    assert len(rows) == 67          # in the f16 cache, chunks of prompts under ~64 rows agree
    sampler = RowSampler(rows, model.config, GREEDY, None, 1)
    with model.make_session(len(rows)) as session:
        want = step_run(session, rows, sampler.state, model.config)
    first = {}

    class Recording(DelayBatch):       # the logits the prompt's last chunk leaves
        def prefill(self, state, job, start, stop):
            super().prefill(state, job, start, stop)
            if stop == job.prompt_rows:
                first[id(job)] = job.work.logits

    with BatchDecoder(Recording(model), max_streams=2, prefill_rows=prefill_rows) as batch:
        batch.submit(job_of(batch.family, jobs(GREEDY, seeds=(None, None))[1]))   # 30 rows
        batch.step()
        late = batch.submit(batch.family.job(rows, options=GREEDY, max_new_rows=4))
        while id(late) not in first:
            batch.step()
        assert batch.active[0] is not late, "nobody decoded beside the joining prompt"
        got = first[id(late)]
    few = np.isfinite(want[0])               # the few ids' text logits, −inf elsewhere
    assert few.sum() >= 1 and np.array_equal(np.isfinite(got[0]), few)
    assert_close(got[0][few], want[0][few], atol=atol, what="text logits of the joining prompt")
    assert_close(got[1], want[1], atol=atol, what="audio logits of the joining prompt")
    if atol != LOGIT_ATOL:
        assert_differs(got[1], want[1], atol=LOGIT_ATOL, what="f16 cache filled in 3-row chunks")


def test_a_stream_joining_after_another_left_equals_it_alone(ending_model):
    """Two places: A (40 rows) and B (6) start; C joins when B has left, while A decodes."""
    model = ending_model()
    a, b, c = jobs(SAMPLED, seeds=(1, 2, 3),
                   prompts=[(5, True, 40), (6, False, 6), (8, False, 20)])
    with BatchDecoder(DelayBatch(model), max_streams=2) as batch:
        ja, jb, jc = (batch.submit(job_of(batch.family, job)) for job in (a, b, c))
        joined = None
        while batch.pending:
            batch.step()
            if joined is None and jc in batch.active:
                joined = (jb.done, ja.done, len(ja.items))
    assert joined[0] and not joined[1] and joined[2] >= 6, f"C did not join mid-decode: {joined}"
    for job, want in ((ja, alone(model, a)), (jb, alone(model, b)), (jc, alone(model, c))):
        assert np.array_equal(as_rows(job.items, model), want)


def test_a_long_prompt_appended_in_chunks_while_others_decode_equals_it_alone(ending_model):
    """The joining prompt (two reference blocks, 45 rows) goes in 3 rows per step beside
    decoding streams: it spends ≥ 14 steps joining, and its rows are still its rows alone."""
    model = ending_model()
    first = jobs(GREEDY, seeds=(None, None), prompts=[(7, True, 40), (6, False, 40)])
    rows = np.vstack([prompt_rows(seed=9)[:-1], prompt_rows(seed=5)])
    long = (rows, SAMPLED, 4, 30)
    assert len(rows) == 45
    with BatchDecoder(DelayBatch(model), max_streams=3, prefill_rows=3) as batch:
        started = [batch.submit(job_of(batch.family, job)) for job in first]
        batch.step()
        batch.step()
        late = batch.submit(job_of(batch.family, long))
        joining_steps = 0
        while batch.pending:
            batch.step()
            joining_steps += late in batch.joining and bool(batch.active)
    assert joining_steps >= 14, joining_steps
    assert np.array_equal(as_rows(late.items, model), alone(model, long))
    for job, want in zip(started, first):
        assert np.array_equal(as_rows(job.items, model), alone(model, want))


def test_a_different_seed_or_prompt_changes_the_stream(ending_model):
    """Sensitivity guard: the equalities above could not hold by accident."""
    model = ending_model()
    base, seed, prompt = jobs(SAMPLED, seeds=(3, 4, 3),
                              prompts=[(4, True, 12), (4, True, 12), (5, True, 12)])
    got, _ = run_batch(model, [base, seed, prompt], max_streams=3)
    assert not np.array_equal(got[0], got[1]), "another seed gave the same rows"
    assert not np.array_equal(got[0], got[2]), "another prompt gave the same rows"


def test_a_step_reads_the_few_text_ids_while_every_stream_is_in_audio(ending_model,
                                                                      monkeypatch):
    """In audio every stream takes GEN or DELAY (or a forced row: none), so their union fits
    the few-ids head; once one stream is in text the step computes the whole vocabulary."""
    cfg = ending_model().config
    assert list(shared_text_ids([np.array([GEN, GEN]), np.array([GEN, DELAY])], cfg)) \
        == [GEN, DELAY]
    assert shared_text_ids([np.array([GEN, DELAY]), None], cfg) is None
    assert shared_text_ids([np.array([GEN, GEN]), np.array([END, DELAY])], cfg) is None
    variants = []
    real = SharedDecodeSession.step

    def spy(self, seqs, feed, *, variant=None):
        variants.append((len(seqs), variant))
        return real(self, seqs, feed, variant=variant)

    monkeypatch.setattr(SharedDecodeSession, "step", spy)
    run_batch(ending_model(), jobs(GREEDY), max_streams=4)
    assert (4, "rows_few") in variants and (4, False) in variants, variants


def test_a_bad_job_fails_alone_and_the_others_go_on(ending_model):
    model = ending_model()
    good = jobs(GREEDY, seeds=(None,))[0]
    bad = good[0].copy()
    bad[0, 0] = 10 ** 6
    with BatchDecoder(DelayBatch(model), max_streams=2) as batch:
        with pytest.raises(InputError, match="max_new_rows must be at least 1"):
            batch.family.job(good[0], options=GREEDY, max_new_rows=0)
        kept = batch.submit(job_of(batch.family, good))
        batch.submit(batch.family.job(bad, options=GREEDY, max_new_rows=4))
        with pytest.raises(InputError, match="text ids"):
            batch.step()
        while batch.pending:
            batch.step()
    assert np.array_equal(as_rows(kept.items, model), alone(model, good))


# -- the TTS classes: synthesize_many == synthesize ------------------------------------------
@pytest.fixture(scope="module")
def delay_tts(delay_files, v1_codec_gguf):
    """DelayTTS with its default f16 KV cache (a joining prompt goes into the cache in the chunks
    it takes alone, so even f16 rounding is the same), on the tiny long-audio model."""
    t = DelayTTS.load(delay_files(4.0)[3], codec=v1_codec_gguf, threads=THREADS)
    yield t
    t.close()


def assert_many_equals_each(tts, requests, max_streams=2):
    got = tts.synthesize_many(requests, max_streams=max_streams)
    assert len(got) == len(requests)
    for i, (request, (audio, sr)) in enumerate(zip(requests, got)):
        kw = dict(request)
        want, want_sr = tts.synthesize(kw.pop("text", None), **kw)
        assert sr == want_sr and audio.shape == want.shape, f"request {i}: {audio.shape}"
        assert np.array_equal(audio, want), f"request {i}: many != alone"
    return got


def codes(frames, n_vq, seed):
    return np.random.default_rng(seed).integers(0, 64, size=(frames, n_vq))


@pytest.mark.filterwarnings("ignore::moss_tts.errors.BudgetWarning")
def test_delay_synthesize_many_equals_synthesize_for_each_request(delay_tts, monkeypatch):
    """A voice clone, a continuation whose text is cut in two chunks (the second joins the
    batch when the first ends, its prompt appended in chunks beside the others), and a greedy
    request, decoded together."""
    n_vq = delay_tts.config.n_vq
    monkeypatch.setattr(delay_tts_module, "split_long_text",
                        functools.partial(delay_tts_module.split_long_text, max_tokens=8))
    requests = [
        {"text": "Hello there.", "seed": 3, "max_new_rows": 24,
         "reference": Reference(codes(6, n_vq, 1))},
        {"text": "My friend hears the long story. It is told today.", "seed": 5,
         "max_new_rows": 14, "prompt": Reference(codes(5, n_vq, 2)), "prompt_text": "Hi."},
        {"text": "A quick one.", "options": GREEDY, "max_new_rows": 18},
    ]
    assert len(delay_tts_module.split_long_text(requests[1]["text"], delay_tts.tokenizer)) > 1
    got = assert_many_equals_each(delay_tts, requests)
    # guard: another seed for the first changes its audio only
    other = delay_tts.synthesize_many([dict(requests[0], seed=4)] + requests[1:],
                                      max_streams=3)
    assert not np.array_equal(other[0][0], got[0][0]), "seed 4 gave seed 3's audio"
    assert np.array_equal(other[2][0], got[2][0])


def published_requests(kind, n_vq):
    """Three requests of each published checkpoint: sampled and greedy, with their own
    budgets (MOSS-TTSD: cloned speakers, then generation mode)."""
    if kind == "ttsd":
        return [{"text": "[S1] Hello there. [S2] Fine.", "seed": 2, "max_new_rows": 20,
                 "speakers": [(codes(6, n_vq, 3), "Hi."), (codes(5, n_vq, 4), "Yes.")]},
                {"text": "[S1] Good day. [S2] Thanks.", "options": GREEDY, "max_new_rows": 16},
                {"text": "[S2] Well. [S1] Right.", "seed": 9, "max_new_rows": 12}]
    if kind == "voicegen":
        return [{"text": "Hello there.", "instruction": "A calm voice.", "seed": 2,
                 "max_new_rows": 20},
                {"text": "Good day.", "instruction": "A bright voice.", "options": GREEDY,
                 "max_new_rows": 16},
                {"text": "Well, right.", "instruction": "A low voice.", "seed": 9,
                 "max_new_rows": 12}]
    return [{"sound": "Rain on a roof.", "tokens": 12, "seed": 1, "max_new_rows": 24},
            {"sound": "A door creaks.", "seconds": 1.0, "options": GREEDY, "max_new_rows": 20},
            {"sound": "Wind in the trees.", "seed": 2, "max_new_rows": 12}]


@pytest.mark.filterwarnings("ignore::moss_tts.errors.BudgetWarning")
@pytest.mark.parametrize("kind", ["ttsd", "voicegen", "sfx"])
def test_published_checkpoints_synthesize_many_equal_synthesize(published_tts, kind):
    """Each published checkpoint's requests decoded in a batch (two places, so the third
    joins when one has left) as alone."""
    tts = published_tts(kind)
    assert type(tts).BATCHED is DelayBatch
    assert_many_equals_each(tts, published_requests(kind, tts.config.n_vq))


def test_local_tts_does_not_take_delays_batch():
    """MossTTSLocal's rows are whole frames: DelayBatch is not its batch (it has its own)."""
    assert DelayTTS.BATCHED is DelayBatch and LocalTTS.BATCHED is not DelayBatch
