"""NanoModel (moss_tts/models/nano.py) against the float64 reference fixtures/reference/nano.py:
the global KV cache (one-shot, chunked and single-row prefill, decode step, prefix reuse), the
depth transformer (greedy frame, per-frame local reset, tied heads), the row embedding (pad
masking, range checks), each with a sensitivity guard (style C28).

Ported from a KV-cache parity tool of another engine (moss_tts_nano_kv_cache_parity): its claims
(chunked prefill = one shot, decode step = prefill, single-row chain = one shot, prefix reuse =
fresh prefill, identical local frames, codes in range, nothing non-finite, cached row count) and
its guards (the prompt must matter; a wrong cached prefix must change the result).
"""

import numpy as np
import pytest

from fixtures.compare import assert_close, assert_differs
from fixtures.reference import nano as ref
from moss_tts.errors import InputError
from moss_tts.ggml import Graph
from moss_tts.models.nano import embed_rows
from moss_tts.models.rows import masked_row_feed

from .conftest import AUDIO_VOCAB, N_VQ

# f32 ggml vs the float64 reference through 2 global blocks + ln_f (|h| ≲ 4, dots of 32-64
# terms). Attention is ggml's flash kernel with f32 K/V (no f16 rounding of K/V; the f16 mask
# holds only 0 / −inf, exactly representable). Measured ≤ 1.3e-6; 2e-5 leaves room for another
# summation order (other thread counts or CPU kernels).
HIDDEN_ATOL = 2e-5
# Logits are hidden · table rows (|logit| ≲ 15, 32-term dots) after one more local block:
# measured ≤ 3e-6.
LOGIT_ATOL = 1e-4
# Embedding rows are sums of ≤ 5 f32 table rows (|x| ≲ 3): ≤ 5 roundings of ~2.4e-7 each;
# measured 1.5e-7.
EMBED_ATOL = 2e-6

PAD = AUDIO_VOCAB                      # audio_pad_token_id of the tiny config
USER_SLOT, ASSISTANT_SLOT = 8, 9
AUDIO_START, AUDIO_END = 6, 7
ROWS = 24
SPLIT = ROWS // 2
REF_ROWS = slice(5, 11)                # reference audio, slot 8
GEN_ROWS = slice(ROWS - 5, ROWS)       # earlier generated frames, slot 9 (last row included)


def prompt_rows(seed=0x5EED1):
    """A voice-clone-shaped prompt: text rows, [6], six reference rows (slot 8) with some
    channels at the pad, [7], text, [6], five assistant rows (slot 9). Seeded; neither all pads
    nor all codes."""
    rng = np.random.default_rng(seed)
    rows = np.full((ROWS, N_VQ + 1), PAD, dtype=np.int64)
    rows[:, 0] = rng.integers(15, 400, size=ROWS)           # ordinary text pieces
    rows[0, 0], rows[4, 0], rows[11, 0], rows[18, 0] = 4, AUDIO_START, AUDIO_END, AUDIO_START
    rows[REF_ROWS, 0] = USER_SLOT
    rows[GEN_ROWS, 0] = ASSISTANT_SLOT
    for r in (*range(ROWS)[REF_ROWS], *range(ROWS)[GEN_ROWS]):
        rows[r, 1:] = rng.integers(0, AUDIO_VOCAB, size=N_VQ)
    for r in range(ROWS)[REF_ROWS]:                          # partial pads in reference rows
        for c in range(N_VQ):
            if (r + c) % 3 == 0:
                rows[r, c + 1] = PAD
    return rows


@pytest.fixture(scope="module")
def reference(nano_reference):
    return nano_reference()


@pytest.fixture(scope="module")
def rows():
    return prompt_rows()


@pytest.fixture(scope="module")
def want(reference, rows):
    """Reference hidden state of every row given the rows before it, (ROWS, D) float64."""
    state, cfg = reference
    return ref.global_forward(state, cfg, rows)


def prefill_chunks(model, rows, chunks, capacity=ROWS + 4):
    """Prefill `rows` in the given chunk lengths on one fresh state; the last hidden."""
    assert sum(chunks) == len(rows)
    with model.make_state(capacity) as state:
        start = 0
        for n in chunks:
            h = model.prefill(state, rows[start:start + n])
            start += n
        assert state.position == len(rows) and state.global_.cache.n_filled == len(rows)
    return h


# --- global transformer and its KV cache -------------------------------------------------------


def test_prefill_last_hidden_matches_reference(nano_model, rows, want, reference):
    got = prefill_chunks(nano_model, rows, [ROWS])
    assert got.shape == (nano_model.config.backbone.n_embd,)
    assert_close(got, want[-1], atol=HIDDEN_ATOL, what="prefill hidden of the last row")
    # guard: the compared hidden depends on the prompt at all (the seed tool's "prompt change")
    other = prompt_rows(seed=99)
    assert_differs(got, ref.global_forward(*reference, other)[-1], atol=HIDDEN_ATOL,
                   what="hidden of another prompt")


@pytest.mark.parametrize("chunks", [[SPLIT, ROWS - SPLIT], [3, 9, 12], [ROWS - 1, 1]],
                         ids=["halves", "three", "last_row_alone"])
def test_chunked_prefill_matches_one_shot(nano_model, rows, want, chunks):
    one_shot = prefill_chunks(nano_model, rows, [ROWS])
    got = prefill_chunks(nano_model, rows, chunks)
    assert_close(got, one_shot, atol=HIDDEN_ATOL, what=f"prefill in chunks {chunks}")
    assert_close(got, want[-1], atol=HIDDEN_ATOL, what=f"chunks {chunks} vs reference")


def test_cached_decode_matches_full_recompute(nano_model, rows, want):
    """Prefill n rows, then one row at a time: row k's hidden equals the reference recompute of
    rows[:k+1], for every k; the one-row graph (one bucket: ≤ 32 slots) is built once and
    replayed."""
    with nano_model.make_state(ROWS) as state:
        nano_model.prefill(state, rows[:SPLIT])
        for k in range(SPLIT, ROWS):
            got = nano_model.prefill(state, rows[k:k + 1])
            assert_close(got, want[k], atol=HIDDEN_ATOL, what=f"decode step at row {k}")
        assert list(state.global_.step_graphs) == [(None, 32)], "the one-row graph was rebuilt"
        assert state.position == ROWS


def test_decode_step_at_wrong_position_is_detected(nano_model, rows, want):
    """Guard: RoPE only sees relative positions, so shift one row, not the whole prompt."""
    with nano_model.make_state(ROWS + 1) as state:
        nano_model.prefill(state, rows[:-1])
        state.global_.position += 1  # the last row rotated as if one position later
        wrong = nano_model.prefill(state, rows[-1:])
    assert_differs(wrong, want[-1], atol=HIDDEN_ATOL, what="decode row at position n+1")


def test_single_row_chain_matches_one_shot_prefill(nano_model, rows, want):
    """Every prompt row through the one-row graph (positions and slots from the row loop)."""
    chained = prefill_chunks(nano_model, rows, [1] * ROWS, capacity=ROWS)
    one_shot = prefill_chunks(nano_model, rows, [ROWS])
    assert_close(chained, one_shot, atol=HIDDEN_ATOL, what="single-row chain vs one shot")
    assert_close(chained, want[-1], atol=HIDDEN_ATOL, what="single-row chain vs reference")


def test_prefix_reuse_on_a_new_state_matches_fresh_prefill(nano_model, rows, reference):
    """The model holds no per-utterance state: a second state with the same prefix and a different
    tail gives the fresh reference, and going back to the first prompt gives its hidden again."""
    rows_b = rows.copy()
    rows_b[SPLIT:, 0] = 3          # a divergent tail: text pad rows …
    rows_b[SPLIT:, 1:] = PAD       # … without codes
    with nano_model.make_state(ROWS) as a, nano_model.make_state(ROWS) as b:
        h_a = nano_model.prefill(a, rows)
        h_b = nano_model.prefill(b, rows_b)
        with nano_model.make_state(ROWS) as again:
            h_a2 = nano_model.prefill(again, rows)
    assert_close(h_b, ref.global_forward(*reference, rows_b)[-1], atol=HIDDEN_ATOL,
                 what="new state, shared prefix, new tail")
    np.testing.assert_array_equal(h_a2, h_a)
    assert_differs(h_b, h_a, atol=HIDDEN_ATOL, what="the divergent tail")


def test_mismatched_cached_prefix_changes_the_hidden(nano_model, rows, want):
    """Guard from the seed tool: a chunked prefill must read its cached prefix. One code of one
    cached row changed → the hidden of the (unchanged) tail moves past the tolerance."""
    wrong = rows.copy()
    r = range(ROWS)[REF_ROWS][1]
    c = next(c for c in range(N_VQ) if wrong[r, c + 1] != PAD)
    wrong[r, c + 1] = (wrong[r, c + 1] + 1) % AUDIO_VOCAB
    with nano_model.make_state(ROWS) as state:
        nano_model.prefill(state, wrong[:SPLIT])
        got = nano_model.prefill(state, rows[SPLIT:])
    assert_differs(got, want[-1], atol=HIDDEN_ATOL, what="one changed code in the cached prefix")


def test_swapped_slot_tokens_change_the_hidden(nano_model, rows, want):
    """Guard: the slot token of audio rows counts (reference 8 vs assistant 9,
    docs/upstream-notes.md §nano-12.5)."""
    swapped = rows.copy()
    swapped[REF_ROWS, 0] = ASSISTANT_SLOT
    swapped[GEN_ROWS, 0] = USER_SLOT
    got = prefill_chunks(nano_model, swapped, [ROWS])
    assert_differs(got, want[-1], atol=HIDDEN_ATOL, what="slot tokens 8 ↔ 9 swapped")


# --- row embedding ------------------------------------------------------------------------------


def embed(model, rows):
    g = Graph(model.backend, name="test.embed")
    g.output(embed_rows(g, model.w, model.config, len(rows)), "embedding", ndim=2)
    try:
        return g.build().run(masked_row_feed(rows, model.config))["embedding"]
    finally:
        g.close()


def test_pad_codes_contribute_nothing_to_the_row_embedding(nano_model, reference):
    state, _ = reference
    rows = np.array([[120, 5, PAD, 17, PAD],
                     [ASSISTANT_SLOT, 63, 0, 31, 2],
                     [AUDIO_START, PAD, PAD, PAD, PAD]])
    tables = [state[f"audio_embeddings.{c}.weight"] for c in range(N_VQ)]
    by_hand = np.stack([state["transformer.wte.weight"][r[0]]
                        + sum(tables[c][code] for c, code in enumerate(r[1:]) if code != PAD)
                        for r in rows])
    got = embed(nano_model, rows)
    assert_close(got, by_hand, atol=EMBED_ATOL, what="row embeddings")
    # guard: looking the pads up at the safe index 0 without the mask would differ
    unmasked = by_hand[0] + tables[1][0] + tables[3][0]
    assert_differs(got[0], unmasked, atol=EMBED_ATOL, what="pads looked up as code 0")


def test_row_with_pad_codes_matches_reference(nano_model, rows, want):
    """End to end: the prompt's pad-holding rows give the reference's (masked) hidden."""
    assert (rows[REF_ROWS, 1:] == PAD).any() and (rows[REF_ROWS, 1:] != PAD).any()
    got = prefill_chunks(nano_model, rows[:REF_ROWS.stop], [REF_ROWS.stop])
    assert_close(got, want[REF_ROWS.stop - 1], atol=HIDDEN_ATOL, what="hidden after pad rows")


@pytest.mark.parametrize("column, value", [
    (1, AUDIO_VOCAB + 1), (2, -1), (4, 1000),   # codes: past the pad, negative, far out
    (0, -1), (0, "vocab"),                      # text ids: negative, the vocabulary size
], ids=["code_pad_plus_1", "code_negative", "code_1000", "text_negative", "text_vocab"])
def test_out_of_range_ids_raise_input_error(nano_model, rows, column, value):
    bad = rows[:4].copy()
    bad[2, column] = nano_model.config.vocab_size if value == "vocab" else value
    with nano_model.make_state(8) as state:
        nano_model.prefill(state, rows[:1])
        with pytest.raises(InputError):
            nano_model.prefill(state, bad)
        assert state.position == 1, "a rejected prompt must leave the state untouched"


def test_non_integer_rows_raise_input_error(nano_model, rows):
    """A float row (e.g. 4.7) must not be truncated to an id silently (the reference raises)."""
    bad = rows[:3].astype(np.float64)
    bad[:, 0] += 0.7  # text ids 4.7, …; the codes stay whole numbers in range
    with nano_model.make_state(8) as state, pytest.raises(InputError):
        nano_model.prefill(state, bad)


@pytest.mark.parametrize("shape", [(3, N_VQ), (3, N_VQ + 2), (0, N_VQ + 1), (N_VQ + 1,)])
def test_rows_of_the_wrong_shape_raise_input_error(nano_model, shape):
    with nano_model.make_state(8) as state, pytest.raises(InputError, match="shape"):
        nano_model.prefill(state, np.full(shape, 3))


def test_prefill_past_the_state_capacity_raises_input_error(nano_model, rows):
    with nano_model.make_state(6) as state:
        nano_model.prefill(state, rows[:5])
        with pytest.raises(InputError, match="exceed"):
            nano_model.prefill(state, rows[5:7])
        nano_model.prefill(state, rows[5:6])  # the last free slot still works


# --- depth (local) transformer ------------------------------------------------------------------


@pytest.fixture(scope="module")
def hiddens(want):
    """A few global hidden states (as f32, fed identically to ggml and the reference)."""
    return want[[4, 10, 17, 20, 23]].astype(np.float32)


def run_frame(model, state, h):
    """One frame, always continuing, greedy codes; returns (decision logits, codes, logits)."""
    decision, logits = [], []

    def choose(c, ell):
        logits.append(np.array(ell))
        return int(np.argmax(ell))

    def decide(l_continue, l_stop):
        decision.extend([l_continue, l_stop])
        return True

    codes = model.frame(state, h, choose, decide)
    return np.array(decision), codes, logits


def test_frame_codes_match_reference_greedy(nano_model, reference, hiddens):
    state, cfg = reference
    with nano_model.make_state(4) as s:
        for i, h in enumerate(hiddens):
            decision, codes, logits = run_frame(nano_model, s, h)
            cont, want_codes = ref.depth_frame_greedy(state, cfg, h, always_codes=True)
            np.testing.assert_array_equal(codes, want_codes, err_msg=f"frame from hidden {i}")
            assert codes.dtype == np.int32 and ((codes >= 0) & (codes < AUDIO_VOCAB)).all()
            assert (decision[0] >= decision[1]) == cont
            # HF reruns the whole local prefix per step; ggml caches it: same logits
            _, audio = ref.local_logits(state, cfg, h, ASSISTANT_SLOT, want_codes[:-1])
            for c in range(N_VQ):
                assert_close(logits[c], audio[c], atol=LOGIT_ATOL,
                             what=f"audio logits of channel {c}, hidden {i}")
    distinct = {tuple(ref.depth_frame_greedy(state, cfg, h, always_codes=True)[1]) for h in hiddens}
    assert len(distinct) > 1, "every hidden gives the same frame: the check would be vacuous"


def test_decision_logits_match_reference(nano_model, reference, hiddens):
    state, cfg = reference
    with nano_model.make_state(4) as s:
        for i, h in enumerate(hiddens):
            got = nano_model.depth_logits(s, 0, h)
            assert_close(got, ref.decision_logits(state, cfg, h), atol=LOGIT_ATOL,
                         what=f"(continue, stop) logits, hidden {i}")


def test_local_cache_is_reset_every_frame(nano_model, reference, hiddens):
    """Two frames from the same hidden give identical codes and logits, also with another frame
    in between (the local cache holds that frame's rows when the next one starts)."""
    with nano_model.make_state(4) as s:
        first = run_frame(nano_model, s, hiddens[0])
        run_frame(nano_model, s, hiddens[1])
        again = run_frame(nano_model, s, hiddens[0])
    np.testing.assert_array_equal(again[1], first[1])
    np.testing.assert_array_equal(again[0], first[0])
    for c in range(N_VQ):
        np.testing.assert_array_equal(again[2][c], first[2][c])
    with nano_model.make_state(4) as fresh:
        np.testing.assert_array_equal(run_frame(nano_model, fresh, hiddens[0])[1], first[1])


def test_heads_are_tied_to_the_embeddings(nano_model, reference, hiddens):
    """Decision logits = h_local[0] · wte[9, 7]ᵀ, audio logits of channel c = h_local[c+1] ·
    audio_embeddings[c]ᵀ, with h_local from the reference local transformer."""
    state, cfg = reference
    h = hiddens[2]
    with nano_model.make_state(4) as s:
        decision, codes, logits = run_frame(nano_model, s, h)
    hl = ref.local_forward(state, cfg, ref.local_inputs(state, cfg, h, ASSISTANT_SLOT, codes[:-1]))
    wte = state["transformer.wte.weight"]
    assert_close(decision, hl[0] @ wte[[ASSISTANT_SLOT, AUDIO_END]].T, atol=LOGIT_ATOL,
                 what="decision = tied text head rows 9, 7")
    for c in range(N_VQ):
        table = state[f"audio_embeddings.{c}.weight"]
        assert_close(logits[c], hl[c + 1] @ table.T, atol=LOGIT_ATOL, what=f"audio head {c}")
        # guard: the neighbouring channel's table is a different head
        other = state[f"audio_embeddings.{(c + 1) % N_VQ}.weight"]
        assert_differs(logits[c], hl[c + 1] @ other.T, atol=LOGIT_ATOL,
                       what=f"audio head {c} vs table {(c + 1) % N_VQ}")
    # guard: the checkpoint's stale local_transformer.wte is not the text head
    stale = state["local_transformer.wte.weight"]
    assert_differs(decision, hl[0] @ stale[[ASSISTANT_SLOT, AUDIO_END]].T, atol=LOGIT_ATOL,
                   what="decision through the stale local wte")


def test_depth_inputs_change_the_logits(nano_model, reference, hiddens):
    """Guards for the depth wiring: the decision token (wte[9], not 8) and the previous channel's
    code feed the next position; either changed moves the logits past the tolerance."""
    state, cfg = reference
    h = hiddens[3]
    _, codes = ref.depth_frame_greedy(state, cfg, h, always_codes=True)
    _, audio = ref.local_logits(state, cfg, h, ASSISTANT_SLOT, codes[:-1])
    with nano_model.make_state(4) as s:
        nano_model.depth_logits(s, 0, h)
        wrong_token = nano_model.depth_logits(s, 1, USER_SLOT)
        assert_differs(wrong_token, audio[0], atol=LOGIT_ATOL, what="decision token 8 for 9")
        nano_model.depth_logits(s, 0, h)
        assert_close(nano_model.depth_logits(s, 1, ASSISTANT_SLOT), audio[0], atol=LOGIT_ATOL,
                     what="head 0 after a fresh start")
        wrong_code = nano_model.depth_logits(s, 2, (int(codes[0]) + 1) % AUDIO_VOCAB)
        assert_differs(wrong_code, audio[1], atol=LOGIT_ATOL, what="previous code changed")


def test_depth_code_out_of_range_raises_input_error(nano_model, hiddens):
    with nano_model.make_state(4) as s:
        nano_model.depth_logits(s, 0, hiddens[0])
        nano_model.depth_logits(s, 1, ASSISTANT_SLOT)
        with pytest.raises(InputError):
            nano_model.depth_logits(s, 2, AUDIO_VOCAB)


def test_frame_stops_when_the_decision_says_so(nano_model, hiddens):
    with nano_model.make_state(4) as s:
        called = []
        codes = nano_model.frame(s, hiddens[0], lambda c, ell: called.append(c) or 0,
                                 lambda a, b: False)
    assert codes is None and called == []


def test_frame_row_is_the_assistant_slot_and_the_codes(nano_model):
    row = nano_model.frame_row(np.array([1, 2, 3, 63], np.int32))
    np.testing.assert_array_equal(row, [[ASSISTANT_SLOT, 1, 2, 3, 63]])
    assert row.dtype == np.int32


def test_generation_state_is_a_context_manager_that_frees_both_caches(nano_model):
    with nano_model.make_state(4) as state:
        assert state.global_.cache is not None and state.depth.cache is not None
    assert state.global_.cache is None and state.depth.cache is None
    state.close()                                   # closing again is harmless
