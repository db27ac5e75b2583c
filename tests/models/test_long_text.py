"""Long text in the Qwen3 families (issue 22 #2): prefill in chunks (DecodeSession.prefill)
equals one-shot prefill in every family, and memory stays bounded — no prefill mask or graph
grows with the square of the prompt; Delay, Local and Local v1.5 split long text into
sentence chunks (models/long_text.py) and a one-chunk text speaks exactly as before."""

import numpy as np
import pytest

from fixtures.compare import assert_differs
from moss_tts.models import delay, local, realtime
from moss_tts.nn.kv_cache import KVCache
from moss_tts.nn.session import PREFILL_ROWS, concat_rows

PROMPT = 45
SMALL_CHUNK = 7      # 45 rows = six chunks of 7 and one of 3: several chunks and a ragged end
# the tiny models' difference of a changed first row, seen 40 rows later, is ~1e-2 (measured)
GUARD_ATOL = 1e-4


def random_rows(model, n_codes: int, code_top: int, n=PROMPT, seed=0):
    """Valid rows [n, 1 + n_codes]: text ids below the tiny vocabularies' 200, codes in range."""
    rng = np.random.default_rng(seed)
    return np.hstack([rng.integers(0, 200, (n, 1)), rng.integers(0, code_top, (n, n_codes))])


def family_sessions(delay_model, local_model, local_v15_model, realtime_model):
    """family → (model, a session maker (capacity → session), rows → its feed, the variant
    that returns every row, rows)."""
    d, lo, v15, rt = delay_model(), local_model(), local_v15_model(), realtime_model()
    return {
        "delay": (d, d.make_session, delay.row_feed, False,
                  random_rows(d, d.config.n_vq, d.config.audio_vocab_size)),
        "local": (lo, lambda c: lo.make_state(c), lambda r: local.row_feed(r, lo.config.n_vq),
                  (lo.config.n_vq, False),
                  random_rows(lo, lo.config.n_vq, lo.config.audio_vocab_size)),
        "local_v15": (v15, lambda c: v15.make_state(c), v15.check_rows, False,
                      random_rows(v15, v15.config.n_vq, v15.config.audio_vocab_size)),
        "realtime": (rt, rt.make_backbone, realtime.row_feed, False,
                     random_rows(rt, rt.config.rvq, rt.config.codebook_size)),
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
    rows = random_rows(model, model.config.n_vq, model.config.audio_vocab_size, n=n, seed=4)
    greedy = delay.DelaySamplingOptions(text_temperature=0, audio_temperature=0)
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
