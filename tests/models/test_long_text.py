"""Long text in the Qwen3 families (issue 22 #2): prefill in chunks (DecodeSession.prefill)
equals one-shot prefill in every family, and memory stays bounded — no prefill mask or graph
grows with the square of the prompt; Delay, Local and Local v1.5 split long text into
sentence chunks (models/long_text.py) and a one-chunk text speaks exactly as before."""

import numpy as np
import pytest

from fixtures.compare import assert_differs
from moss_tts.models import delay, local, realtime
from moss_tts.models.delay_state import de_delay
from moss_tts.nn.kv_cache import KVCache
from moss_tts.nn.session import PREFILL_ROWS, concat_rows
from moss_tts.text.chunking import pause_samples

PROMPT = 45
SMALL_CHUNK = 7      # 45 rows = six chunks of 7 and one of 3: several chunks and a ragged end
# the tiny models' difference of a changed first row, seen 40 rows later, is ~1e-2 (measured)
GUARD_ATOL = 1e-4


def random_rows(n_codes: int, code_top: int, n=PROMPT, seed=0):
    """Valid rows [n, 1 + n_codes]: text ids below the tiny vocabularies' 200, codes in range."""
    rng = np.random.default_rng(seed)
    return np.hstack([rng.integers(0, 200, (n, 1)), rng.integers(0, code_top, (n, n_codes))])


def family_sessions(delay_model, local_model, local_v15_model, realtime_model):
    """family → (model, a session maker (capacity → session), rows → its feed, the variant
    that returns every row, rows)."""
    d, lo, v15, rt = delay_model(), local_model(), local_v15_model(), realtime_model()
    return {
        "delay": (d, d.make_session, delay.row_feed, False,
                  random_rows(d.config.n_vq, d.config.audio_vocab_size)),
        "local": (lo, lambda c: lo.make_state(c), lambda r: local.row_feed(r, lo.config.n_vq),
                  (lo.config.n_vq, False),
                  random_rows(lo.config.n_vq, lo.config.audio_vocab_size)),
        "local_v15": (v15, lambda c: v15.make_state(c), v15.check_rows, False,
                      random_rows(v15.config.n_vq, v15.config.audio_vocab_size)),
        "realtime": (rt, rt.make_backbone, realtime.row_feed, False,
                     random_rows(rt.config.rvq, rt.config.codebook_size)),
    }


def backbone(owner):
    """A family's backbone session: the session itself, or the state's `backbone`."""
    return getattr(owner, "backbone", owner)


def hidden(maker, feed_of, variant, rows, max_rows=None):
    with maker(len(rows)) as owner:
        session = backbone(owner)
        if max_rows is None:    # one graph for every row: today's one-shot prefill
            return session.run(feed_of(rows), len(rows), variant=variant)["hidden"]
        return concat_rows(session.prefill(feed_of(rows), len(rows), variant=variant,
                                           max_rows=max_rows))["hidden"]


@pytest.mark.parametrize("family", ["delay", "local", "local_v15", "realtime"])
def test_chunked_prefill_equals_one_shot_prefill_in_every_qwen3_family(
        family, delay_model, local_model, local_v15_model, realtime_model):
    """Bit for bit: each chunk's rows attend over the rows the earlier chunks cached, under
    the same causal mask as in one graph (masked slots are skipped, not summed)."""
    model, maker, feed_of, variant, rows = family_sessions(
        delay_model, local_model, local_v15_model, realtime_model)[family]
    want = hidden(maker, feed_of, variant, rows)
    got = hidden(maker, feed_of, variant, rows, max_rows=SMALL_CHUNK)
    assert got.shape == want.shape == (PROMPT, want.shape[1])
    np.testing.assert_array_equal(got, want)
    # guard: the chunks share one cache — change row 0 and the last chunk's rows move
    changed = rows.copy()
    changed[0, 0] = (rows[0, 0] + 1) % 200
    moved = hidden(maker, feed_of, variant, changed, max_rows=SMALL_CHUNK)
    assert_differs(moved[-3:], want[-3:], atol=GUARD_ATOL, what="a changed first chunk")


def test_a_long_prompt_prefills_in_bounded_masks_and_generates_as_one_shot(
        delay_model, monkeypatch):
    """A prompt of 2·PREFILL_ROWS + 5 rows: every mask the cache builds has at most
    PREFILL_ROWS rows (three prefill chunks, not one (S, S) array), and greedy generation after
    it equals generation after a one-shot prefill of the same rows."""
    model = delay_model()
    n = 2 * PREFILL_ROWS + 5
    rows = random_rows(model.config.n_vq, model.config.audio_vocab_size, n=n, seed=4)
    greedy = delay.DelaySamplingOptions().greedy()
    shapes = []
    mask = KVCache.mask

    def recording(self, q_positions, **kw):
        out = mask(self, q_positions, **kw)
        shapes.append(out.shape)
        return out

    monkeypatch.setattr(KVCache, "mask", recording)
    got = model.generate(rows, options=greedy, max_new_rows=4)
    prefill = [s for s in shapes if s[0] > 1]
    assert [s[0] for s in prefill] == [PREFILL_ROWS, PREFILL_ROWS, 5]
    assert max(s[1] for s in shapes) <= n + 4 + 32     # the cache's slots, never S × S
    monkeypatch.setattr(KVCache, "mask", mask)
    # one-shot: the same rows through one graph (what every prefill was before chunking)
    one_shot = delay.DecodeSession.prefill
    monkeypatch.setattr(delay.DecodeSession, "prefill",
                        lambda self, feed, n_rows, **kw: one_shot(self, feed, n_rows, **kw,
                                                                  max_rows=n_rows))
    np.testing.assert_array_equal(got, model.generate(rows, options=greedy, max_new_rows=4))


# -- long text in sentence chunks -----------------------------------------------------------------
LONG = " ".join(f"This is sentence number {i} of a rather long text." for i in range(24))
SHORT = "Hello there, this is short."
# small frame budgets keep the tiny models quick; a fixed codec push keeps runs bit-identical
BUDGETS = {"delay": {"max_new_rows": 30}, "local": {"max_frames": 10, "chunk_frames": 4},
           "local_v15": {"max_frames": 10, "chunk_frames": 4}}


@pytest.fixture(scope="module")
def family_tts(delay_files, local_files, local_v15_files, v1_codec_gguf, v2_codec_gguf):
    """family → its TTS on the tiny checkpoint (the biases of its own TTS tests: each speaks)
    with the tiny codec of its rate."""
    from moss_tts.models.delay_tts import DelayTTS
    from moss_tts.models.local_tts import LocalTTS
    from moss_tts.models.local_v15_tts import LocalV15TTS

    v1, v2 = v1_codec_gguf, v2_codec_gguf
    made = {"delay": DelayTTS.load(delay_files(4.0)[3], codec=v1, threads=1),
            "local": LocalTTS.load(local_files(1, speech=True)[3], codec=v1, threads=1),
            "local_v15": LocalV15TTS.load(local_v15_files(6.0)[3], codec=v2, threads=1)}
    yield made
    for tts in made.values():
        tts.close()


def greedy(family):
    from moss_tts.sampling import (DelaySamplingOptions, LocalSamplingOptions,
                                   LocalV15SamplingOptions)

    return {"delay": DelaySamplingOptions().greedy(),
            "local": LocalSamplingOptions().greedy(),
            "local_v15": LocalV15SamplingOptions(do_sample=False)}[family]


def spied(tts, monkeypatch):
    """Record each `plan` call (its text and keywords) and each utterance's generation (its
    seed and generated rows or frames), by wrapping the TTS's plan and the model's generator."""
    plans, runs = [], []
    plan = tts.plan
    name = "iter_frames" if hasattr(tts.model, "iter_frames") else "iter_rows"
    generate = getattr(tts.model, name)

    def planning(text, **kw):
        rows = plan(text, **kw)
        plans.append((text, kw, len(rows)))
        return rows

    def generating(rows, **kw):
        made = []
        runs.append((kw.get("seed"), made))
        for item in generate(rows, **kw):
            made.append(item)
            yield item

    monkeypatch.setattr(tts, "plan", planning)
    monkeypatch.setattr(tts.model, name, generating)
    return plans, runs


@pytest.mark.parametrize("family", ["delay", "local", "local_v15"])
def test_a_one_chunk_text_is_one_utterance_exactly_as_before(family, family_tts, monkeypatch):
    """A text that fits one chunk is planned once, unchanged, with the caller's seed and
    prompt, and generates exactly the rows `generate(plan(text))` gives (greedy)."""
    tts, options = family_tts[family], greedy(family)
    plans, runs = spied(tts, monkeypatch)
    audio, _ = tts.synthesize(SHORT, options=options, seed=5, **BUDGETS[family])
    assert [p[0] for p in plans] == [SHORT] and [r[0] for r in runs] == [5]
    monkeypatch.undo()
    budget = {"delay": {"max_new_rows": 30}, "local": {"max_new_frames": 10},
              "local_v15": {"max_frames": 10}}[family]
    want = tts.generate(tts.plan(SHORT), options=options, seed=5, **budget)
    # Local v1.5's generator yields codes, its `generate` rows of slot + codes
    np.testing.assert_array_equal(np.array(runs[0][1]),
                                  want[:, 1:] if family == "local_v15" else want)
    assert len(audio) > 0


@pytest.mark.parametrize("family", ["delay", "local", "local_v15"])
def test_long_text_is_spoken_in_sentence_chunks_each_continuing_the_last(
        family, family_tts, monkeypatch):
    """Each sentence chunk is its own prompt, bounded in length; chunk i samples from
    seed + i and continues chunk i − 1 (its text and the frames it generated)."""
    from moss_tts.models.long_text import MAX_CHUNK_TOKENS, split_long_text

    tts = family_tts[family]
    chunks = split_long_text(LONG, tts.tokenizer)
    assert len(chunks) >= 3
    template = len(tts.plan(chunks[0])) - len(tts.tokenizer.encode(chunks[0]))
    plans, runs = spied(tts, monkeypatch)
    out = list(tts.stream(LONG, options=greedy(family), seed=5, **BUDGETS[family]))
    assert [p[0] for p in plans] == chunks
    # upstream's pause after every chunk but the last (the codec's audio is never all zero)
    assert [len(a) for a in out if len(a) and not a.any()] == \
        [pause_samples(c, tts.sample_rate) for c in chunks[:-1]]
    assert [r[0] for r in runs] == [5 + i for i in range(len(chunks))]
    assert plans[0][1]["prompt"] is None
    for i in range(1, len(chunks)):
        text, kw, n_rows = plans[i]
        assert kw["prompt_text"] == chunks[i - 1]
        made = np.array(runs[i - 1][1])
        assert len(kw["prompt"].codes) > 0
        if family == "delay":     # rows on the staircase: the frames are de-delayed codes
            if i == 1:            # (chunk 0 has no prompt staircase ahead of its rows)
                codes = de_delay(made[:, 1:])
                codes = codes[~(codes == tts.config.audio_pad_code).any(axis=1)]
                np.testing.assert_array_equal(kw["prompt"].codes, codes)
        else:
            np.testing.assert_array_equal(kw["prompt"].codes,
                                          made[:, 1:] if family == "local" else made)
        # the template, two chunks' text (this one and the transcript) and the frames carried
        assert n_rows <= template + 2 * MAX_CHUNK_TOKENS + len(made) + tts.config.n_vq + 2


def test_chunks_grow_linearly_with_the_text_and_keep_their_token_budget(family_tts):
    from moss_tts.models.long_text import MAX_CHUNK_TOKENS, split_long_text

    tok = family_tts["delay"].tokenizer
    one = split_long_text(LONG, tok)
    ten = split_long_text(" ".join([LONG] * 10), tok)
    assert 9 * len(one) <= len(ten) <= 11 * len(one)
    assert max(len(tok.encode(c)) for c in ten) <= MAX_CHUNK_TOKENS
    assert all(c[-1] == "." for c in ten)        # cut at sentence ends
    cjk = "今天天气很好。我们去公园散步吧！" * 40
    pieces = split_long_text(cjk, tok)
    assert len(pieces) > 1 and "".join(pieces) == cjk     # CJK chunks join without spaces
    assert all(p[-1] in "。！" for p in pieces)


def test_a_text_given_a_duration_stays_one_utterance(family_tts):
    """Upstream's `tokens` (or `seconds`) is the whole utterance's duration, so such a text is
    not cut (the prefill chunks still bound its memory)."""
    from moss_tts.models.long_text import split_long_text

    tok = family_tts["delay"].tokenizer
    assert len(split_long_text(LONG, tok)) > 1
    assert split_long_text(LONG, tok, fields={"tokens": 50}) == [LONG]
    assert split_long_text(LONG, tok, fields={"seconds": 4.0, "tokens": None}) == [LONG]


def test_realtime_prompts_stay_bounded_whatever_the_text(realtime_tts):
    """Realtime speaks one utterance, its text fed one token per frame after a bounded prompt
    (the system block and a 12-token lead): ten times the text, the same prompt rows."""
    tts = realtime_tts()
    rows, text_ids = tts.plan(LONG)
    rows10, text_ids10 = tts.plan(" ".join([LONG] * 10))
    assert len(rows10) == len(rows) and len(text_ids10) > 9 * len(text_ids)


def test_prefill_refuses_a_chunk_of_no_rows(delay_model):
    from moss_tts.errors import InputError

    model = delay_model()
    rows = random_rows(model.config.n_vq, model.config.audio_vocab_size, n=3)
    with model.make_session(3) as session, pytest.raises(InputError, match="max_rows"):
        session.prefill(delay.row_feed(rows), 3, variant=False, max_rows=0)
