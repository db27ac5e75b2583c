"""The batched samplers of a several-stream decode (issue 25) against the one-row path each
stream takes alone (moss_tts.sampling.choose_rows, itself tested against upstream's
`_sample_next_token` order in tests/test_sampling.py): every row's filtered probabilities must be
bit-equal, and every row's id equal for the same generator state, so a stream's codes in a batch
are its codes alone."""

from __future__ import annotations

import numpy as np
import pytest

from moss_tts.sampling import (Channel, apply_repetition_penalty, apply_temperature,
                               choose_rows, choose_rows_each, filtered_probs_each, softmax,
                               top_k_filter, top_p_filter)

V = 1024
CHANNELS = [
    Channel(False, 0.8, 25, 0.95, 1.2),     # Nano's defaults
    Channel(False, 1.7, 25, 0.8, 1.0),      # Local v1.5's
    Channel(False, 1.0, 0, 0.9, 1.1),       # top-p over the whole vocabulary
    Channel(False, 0.5, 50, 1.0, 1.3),      # top-k only
    Channel(False, 1.0, 0, 1.0, 1.0),       # no filter at all
    Channel(True, 1.0, 25, 0.95, 1.2),      # greedy keeps the penalty
]


def _one_row_probs(row, channel, seen_row):
    """The per-stream pipeline, written out step by step (upstream's processor order)."""
    s = apply_repetition_penalty(row[None], seen_row, channel.repetition_penalty)
    return softmax(top_p_filter(top_k_filter(apply_temperature(s, channel.temperature),
                                             channel.top_k), channel.top_p))[0]


def _batch(seed, rows, ties):
    rng = np.random.default_rng(seed)
    logits = (rng.standard_normal((rows, V)) * 3).astype(np.float32)
    if ties:   # coarse values: many rows tie at the top-k threshold, so rows keep different counts
        logits = np.round(logits * 2) / 2
    seen = rng.random((rows, V)) < rng.random((rows, 1)) * 0.1
    seen[0] = False                    # a stream's first frame: no history
    return logits, seen


@pytest.mark.parametrize("ties", [False, True])
@pytest.mark.parametrize("channel", [c for c in CHANNELS if not c.greedy])  # greedy: no probs
def test_batched_probabilities_equal_each_row_alone(channel, ties):
    for seed in range(4):
        logits, seen = _batch(seed, 5, ties)
        probs = filtered_probs_each(logits, channel, seen)
        for j in range(len(logits)):
            assert np.array_equal(probs[j], _one_row_probs(logits[j], channel, seen[j])), (seed, j)


@pytest.mark.parametrize("ties", [False, True])
@pytest.mark.parametrize("channel", CHANNELS)
def test_batched_draws_equal_each_row_alone(channel, ties):
    for seed in range(6):
        logits, seen = _batch(100 + seed, 4, ties)
        alone = [None if channel.greedy else np.random.default_rng([seed, j]) for j in range(4)]
        together = [None if channel.greedy else np.random.default_rng([seed, j])
                    for j in range(4)]
        expect = [int(choose_rows(logits[j:j + 1], alone[j], channel, seen[j])[0])
                  for j in range(4)]
        assert choose_rows_each(logits, together, channel, seen).tolist() == expect
        if not channel.greedy:   # and each generator moved exactly as alone
            assert [r.random() for r in together] == [r.random() for r in alone]


def test_rows_with_unequal_survivor_counts_are_filtered_apart():
    """Row 0 keeps 3 tied top scores after top-k 2 and row 1 keeps 2 (top-p sorts each group of
    equal counts at its own width): each row still equals its one-row result."""
    logits = np.full((2, 8), -5.0, np.float32)
    logits[0, :3] = 1.0
    logits[1, :3] = [1.0, 0.9, 0.1]
    channel = Channel(False, 1.0, 2, 0.99, 1.0)
    probs = filtered_probs_each(logits, channel, np.zeros((2, 8), bool))
    assert np.count_nonzero(probs[0]) == 3 and np.count_nonzero(probs[1]) == 2
    for j in range(2):
        assert np.array_equal(probs[j], _one_row_probs(logits[j], channel, np.zeros(8, bool)))
