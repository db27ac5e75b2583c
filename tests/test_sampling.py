"""moss_tts/sampling.py against the HF-semantics reference in fixtures/reference/nano.py
(docs/upstream-notes.md §nano-4.2): repetition penalty, top-k, top-p, the sampled distributions
(empirically, with fixed seeds and stated bounds), greedy ties, and SamplingOptions validation."""

import numpy as np
import pytest

from fixtures.reference import nano as ref
from moss_tts.errors import InputError
from moss_tts.sampling import (
    SamplingOptions,
    apply_repetition_penalty,
    decide_continue,
    draw_rows,
    greedy_token,
    sample_audio_code,
    sample_rows,
    sample_token,
    seen_per_head,
    seen_pooled,
    seen_windowed,
    softmax,
    top_k_filter,
    top_p_filter,
)

DRAWS = 20_000
# Total-variation bound for DRAWS draws over ≤ 12 categories:
# E[TV] ≈ ½ Σ √(2p(1−p)/(πN)) ≲ 0.01 (uniform over 12: 0.0093; measured 0.003-0.010 for the
# cases below) and its spread is a fraction of that, so 0.03 is ≥ 3× the expectation. A wrong
# filter order, temperature or cut moves TV by ≥ 0.06 on these logits (the guards below).
TV_BOUND = 0.03


def tv(counts, probs):
    return 0.5 * float(np.abs(counts / counts.sum() - probs).sum())


def seen_mask(ids, size):
    mask = np.zeros(size, dtype=bool)
    mask[list(ids)] = True
    return mask


# --- repetition penalty -----------------------------------------------------------------------


def test_repetition_penalty_divides_positive_and_multiplies_negative_seen_logits():
    logits = np.array([2.0, -2.0, 3.0, -1.0, 0.0, 4.0])
    seen = seen_mask([0, 1, 4], logits.size)
    got = apply_repetition_penalty(logits, seen, 2.0)
    np.testing.assert_array_equal(got, [1.0, -4.0, 3.0, -1.0, 0.0, 4.0])
    np.testing.assert_array_equal(logits, [2.0, -2.0, 3.0, -1.0, 0.0, 4.0])  # input untouched


@pytest.mark.parametrize("penalty", [0.7, 1.2, 3.0])
def test_repetition_penalty_matches_reference(rng, penalty):
    for _ in range(50):
        logits = rng.normal(0, 3, size=64)
        history = rng.integers(0, 64, size=rng.integers(1, 30))
        got = apply_repetition_penalty(logits, seen_mask(history, 64), penalty)
        np.testing.assert_array_equal(got, ref.apply_repetition_penalty(logits, history, penalty))


def test_repetition_penalty_of_one_or_without_history_changes_nothing(rng):
    logits = rng.normal(size=16)
    seen = seen_mask([1, 2], 16)
    np.testing.assert_array_equal(apply_repetition_penalty(logits, seen, 1.0), logits)
    np.testing.assert_array_equal(apply_repetition_penalty(logits, np.zeros(16, bool), 1.5), logits)


# --- top-k / top-p -----------------------------------------------------------------------------


def test_top_k_keeps_ties_at_the_threshold():
    scores = np.array([1.0, 3.0, 2.0, 3.0, 2.0, 0.5])
    got = top_k_filter(scores, 1)
    np.testing.assert_array_equal(got, [-np.inf, 3.0, -np.inf, 3.0, -np.inf, -np.inf])
    got = top_k_filter(scores, 3)  # threshold 2.0: both 2.0 survive, 4 tokens kept
    np.testing.assert_array_equal(np.isfinite(got), [False, True, True, True, True, False])


@pytest.mark.parametrize("k", [0, 1, 5, 25, 64, 100])
def test_top_k_matches_reference(rng, k):
    for _ in range(30):
        scores = np.round(rng.normal(0, 2, size=64), 1)  # rounded: ties happen
        np.testing.assert_array_equal(top_k_filter(scores, k), ref.top_k_filter(scores, k))


def test_top_p_keeps_the_token_that_crosses_p_and_the_top_token():
    scores = np.log(np.array([0.2, 0.5, 0.3]))
    np.testing.assert_array_equal(np.isfinite(top_p_filter(scores, 0.6)), [False, True, True])
    np.testing.assert_array_equal(np.isfinite(top_p_filter(scores, 0.4)), [False, True, False])
    np.testing.assert_array_equal(np.isfinite(top_p_filter(scores, 1e-6)), [False, True, False])
    np.testing.assert_array_equal(top_p_filter(scores, 1.0), scores)


@pytest.mark.parametrize("p", [0.05, 0.5, 0.8, 0.95, 1.0])
def test_top_p_matches_reference(rng, p):
    for _ in range(30):
        scores = rng.normal(0, 2, size=40)
        np.testing.assert_array_equal(top_p_filter(scores, p), ref.top_p_filter(scores, p))


# --- sampled distributions ------------------------------------------------------------------------

LOGITS = np.array([2.0, 1.6, 1.5, 0.9, 0.3, -0.2, -1.0, 1.2, 0.0, -3.0, 0.8, 1.9])


@pytest.mark.parametrize("temperature, top_k, top_p", [
    (1.0, 0, 1.0), (0.8, 5, 1.0), (0.8, 0, 0.7), (0.8, 6, 0.9), (1.7, 4, 0.8),
], ids=["plain", "top_k", "top_p", "top_k_top_p", "hot"])
def test_sample_token_frequencies_match_reference_probabilities(temperature, top_k, top_p):
    rng = np.random.default_rng(20240531)
    draws = [sample_token(LOGITS, rng, temperature=temperature, top_k=top_k, top_p=top_p)
             for _ in range(DRAWS)]
    counts = np.bincount(draws, minlength=LOGITS.size).astype(float)
    probs = ref.sampling_probs(LOGITS, temperature=temperature, top_k=top_k, top_p=top_p)
    assert not counts[probs == 0].any(), "a filtered-out token was drawn"
    assert tv(counts, probs) <= TV_BOUND, (tv(counts, probs), counts / DRAWS, probs)
    # guard: the bound separates these knobs from the plain softmax
    if (temperature, top_k, top_p) != (1.0, 0, 1.0):
        assert tv(counts, ref.sampling_probs(LOGITS, temperature=1.0)) > 2 * TV_BOUND


def test_sample_audio_code_samples_the_penalized_distribution():
    opts = SamplingOptions(audio_temperature=0.8, audio_top_k=6, audio_top_p=0.9,
                           audio_repetition_penalty=1.5)
    history = [0, 11, 5]
    rng = np.random.default_rng(7)
    seen = seen_mask(history, LOGITS.size)
    counts = np.bincount([sample_audio_code(LOGITS, seen, rng, opts) for _ in range(DRAWS)],
                         minlength=LOGITS.size).astype(float)
    probs = ref.sampling_probs(LOGITS, temperature=0.8, top_k=6, top_p=0.9, history=history,
                               repetition_penalty=1.5)
    assert not counts[probs == 0].any()
    assert tv(counts, probs) <= TV_BOUND
    unpenalized = ref.sampling_probs(LOGITS, temperature=0.8, top_k=6, top_p=0.9)
    assert tv(counts, unpenalized) > 2 * TV_BOUND  # guard: the penalty is applied


@pytest.mark.parametrize("l_continue, l_stop, temperature", [
    (0.7, -0.4, 1.0), (0.7, -0.4, 1.5), (-1.0, 0.5, 1.0), (3.0, 3.0, 0.8),
])
def test_decide_continue_frequency_matches_reference_probability(l_continue, l_stop, temperature):
    opts = SamplingOptions(text_temperature=temperature)
    rng = np.random.default_rng(99)
    hits = sum(decide_continue(l_continue, l_stop, rng, opts) for _ in range(DRAWS))
    p = ref.decision_continue_prob(l_continue, l_stop, temperature=temperature)
    # 5 binomial standard deviations (two-sided false alarm < 1e-6 for a fixed seed anyway)
    assert abs(hits / DRAWS - p) <= 5 * np.sqrt(p * (1 - p) / DRAWS), (hits / DRAWS, p)


def test_sampling_is_reproducible_for_a_seed():
    a = [sample_token(LOGITS, np.random.default_rng(3), temperature=0.8, top_k=25, top_p=0.95)
         for _ in range(5)]
    rng1, rng2 = np.random.default_rng(3), np.random.default_rng(3)
    s1 = [sample_token(LOGITS, rng1, temperature=0.8) for _ in range(50)]
    s2 = [sample_token(LOGITS, rng2, temperature=0.8) for _ in range(50)]
    assert s1 == s2 and len(set(a)) == 1


# --- greedy -----------------------------------------------------------------------------------


def test_greedy_token_takes_the_first_of_tied_maxima():
    assert greedy_token(np.array([0.1, 2.0, -1.0, 2.0])) == 1
    assert greedy_token(np.array([5.0, 5.0])) == 0


def test_greedy_decision_continues_on_a_tie():
    greedy = SamplingOptions(do_sample=False)
    assert decide_continue(1.25, 1.25, None, greedy) is True
    assert decide_continue(1.25, 1.5, None, greedy) is False
    assert decide_continue(2.0, -2.0, None, greedy) is True


def test_greedy_audio_code_is_the_argmax_of_the_penalized_logits():
    logits = np.array([1.0, 3.0, 2.9, -1.0])
    greedy = SamplingOptions(do_sample=False, audio_repetition_penalty=1.2)
    assert sample_audio_code(logits, seen_mask([], 4), None, greedy) == 1
    # 3.0 / 1.2 = 2.5 < 2.9: the penalty moves the argmax, no rng needed
    assert sample_audio_code(logits, seen_mask([1], 4), None, greedy) == 2
    assert sample_audio_code(logits, seen_mask([1], 4), None, greedy) == \
        ref.greedy_code(logits, [1], 1.2)


# --- options ------------------------------------------------------------------------------------


def test_sampling_options_defaults_are_upstream_user_facing_values():
    o = SamplingOptions()
    assert (o.do_sample, o.text_temperature, o.audio_temperature, o.audio_top_k, o.audio_top_p,
            o.audio_repetition_penalty) == (True, 1.0, 0.8, 25, 0.95, 1.2)


@pytest.mark.parametrize("kwargs, match", [
    ({"text_temperature": 0.0}, "text_temperature"),
    ({"audio_temperature": -0.5}, "audio_temperature"),
    ({"audio_temperature": float("nan")}, "audio_temperature"),
    ({"audio_top_k": -1}, "audio_top_k"),
    ({"audio_top_k": 2.5}, "audio_top_k"),   # accepted today; sampling then dies in np.partition
    ({"audio_top_p": 0.0}, "audio_top_p"),
    ({"audio_top_p": 1.5}, "audio_top_p"),
    ({"audio_repetition_penalty": 0.0}, "audio_repetition_penalty"),
    ({"audio_repetition_penalty": -1.2}, "audio_repetition_penalty"),
    # issue 11: these were tracebacks (TypeError / ValueError) or accepted
    ({"audio_temperature": float("inf")}, "audio_temperature"),
    ({"text_temperature": "1.0"}, "text_temperature must be a number"),
    ({"audio_top_k": "25"}, "audio_top_k must be a number"),
    ({"audio_top_k": float("inf")}, "audio_top_k"),
    ({"audio_top_p": None}, "audio_top_p must be a number"),
    ({"audio_repetition_penalty": float("inf")}, "audio_repetition_penalty"),
    ({"audio_top_k": True}, "audio_top_k must be a number"),
    ({"do_sample": "no"}, "do_sample must be True or False"),
])
def test_sampling_options_reject_invalid_values(kwargs, match):
    with pytest.raises(InputError, match=match) as e:
        SamplingOptions(**kwargs)
    assert "\n" not in str(e.value)


def test_greedy_options_accept_zero_temperatures():
    o = SamplingOptions(do_sample=False, text_temperature=0.0, audio_temperature=0.0)
    assert o.do_sample is False


# --- row-wise filters and seen-sets -------------------------------------------------------------


def test_row_wise_filters_equal_the_reference_applied_to_each_row(rng):
    """[rows, V] at once == the 1-D reference row by row (each row its own k-th value, its own
    nucleus, its own seen-set)."""
    logits = rng.standard_normal((6, 40)) * 2.0
    logits[2, :5] = 1.5                              # ties at a top-k threshold
    seen = rng.random((6, 40)) < 0.2
    got_pen = apply_repetition_penalty(logits, seen, 1.3)
    got_k = top_k_filter(logits, 7)
    got_p = top_p_filter(logits, 0.6)
    for r in range(6):
        np.testing.assert_array_equal(
            got_pen[r], ref.apply_repetition_penalty(logits[r], np.flatnonzero(seen[r]), 1.3))
        np.testing.assert_array_equal(got_k[r], ref.top_k_filter(logits[r], 7))
        np.testing.assert_array_equal(got_p[r], ref.top_p_filter(logits[r], 0.6))
    # guard: a filter over the whole matrix (one threshold for all rows) is not row-wise
    flat = ref.top_k_filter(logits.reshape(-1), 7).reshape(logits.shape)
    assert not np.array_equal(np.isfinite(got_k), np.isfinite(flat))


def test_draw_rows_draws_what_rng_choice_draws_from_the_same_stream(rng):
    probs = softmax(rng.standard_normal((300, 25)) * 3)
    got = draw_rows(probs, np.random.default_rng(5))
    rng_b = np.random.default_rng(5)
    want = [rng_b.choice(25, p=row) for row in probs]
    np.testing.assert_array_equal(got, want)
    assert len(set(got.tolist())) > 5


def test_sample_rows_draws_each_row_from_its_own_distribution():
    logits = np.stack([LOGITS, LOGITS[::-1]])
    rng = np.random.default_rng(8)
    draws = np.array([sample_rows(logits, rng, temperature=0.8, top_k=6, top_p=0.9)
                      for _ in range(DRAWS // 2)])
    for r, row in enumerate(logits):
        counts = np.bincount(draws[:, r], minlength=LOGITS.size).astype(float)
        probs = ref.sampling_probs(row, temperature=0.8, top_k=6, top_p=0.9)
        assert tv(counts, probs) <= 1.5 * TV_BOUND   # half the draws: √2 the spread
    assert tv(np.bincount(draws[:, 1], minlength=12).astype(float),
              ref.sampling_probs(LOGITS, temperature=0.8, top_k=6, top_p=0.9)) > 3 * TV_BOUND


def test_seen_sets_per_head_pooled_and_windowed():
    history = np.array([[1, 5, 1024], [3, 5, 2], [0, 7, 9]])   # [frames, heads], 1024 = pad
    vocab = 10
    per = seen_per_head(history, vocab)
    assert per.shape == (3, 10)
    assert [np.flatnonzero(r).tolist() for r in per] == [[0, 1, 3], [5, 7], [2, 9]]
    pooled = seen_pooled(history[:, 1:], vocab)
    assert pooled.shape == (1, 10) and np.flatnonzero(pooled[0]).tolist() == [2, 5, 7, 9]
    window = seen_windowed(history, vocab, 2)
    assert [np.flatnonzero(r).tolist() for r in window] == [[0, 3], [5, 7], [2, 9]]
    last = seen_windowed(history, vocab, 1)
    assert [np.flatnonzero(r).tolist() for r in last] == [[0], [7], [9]]
    # a pooled seen-set penalizes an id for every head, a per-head one only for its own
    logits = np.full((2, vocab), 2.0)
    assert (apply_repetition_penalty(logits, pooled, 2.0)[:, 5] == 1.0).all()
    assert apply_repetition_penalty(logits, per[1:], 2.0)[1, 5] == 2.0


def test_top_p_after_top_k_matches_the_reference_row_by_row_with_ties():
    """top_p sorts only each batch's finite candidates (the widest row's count) — rows of
    different widths, tied scores and every k must keep exactly the reference's set."""
    rng = np.random.default_rng(11)
    checked = 0
    for case in range(400):
        vocab, rows = int(rng.integers(2, 200)), int(rng.integers(1, 6))
        logits = rng.normal(size=(rows, vocab))
        if case % 2:
            logits = np.round(logits * 2) / 2            # many ties, some at the cut
        ks = rng.integers(0, vocab + 1, size=rows)
        p = float(rng.uniform(0.05, 0.99))
        filtered = np.stack([top_k_filter(row, int(k)) for row, k in zip(logits, ks)])
        want = np.stack([ref.top_p_filter(ref.top_k_filter(row, int(k)), p)
                         for row, k in zip(logits, ks)])
        sums = [np.cumsum(np.sort(ref._softmax(r))[::-1]) for r in filtered]
        if min(np.abs(s - p).min() for s in sums) < 1e-9:
            continue                                     # a cut within rounding of p
        np.testing.assert_array_equal(top_p_filter(filtered, p), want)
        checked += 1
    assert checked > 300
