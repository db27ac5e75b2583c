"""Parity of moss_tts/nn/embeddings.py (embedding, masked_embedding_sum) with the reference."""

import numpy as np
import pytest

from fixtures.compare import assert_close, assert_differs
from fixtures.reference import ops as ref
from moss_tts import nn
from moss_tts.errors import ShapeError
from moss_tts.ggml import F16, F32, I32, Graph

# A lookup copies rows exactly (F16 tables widen exactly to f32); the masked sum adds ≤ 4 rows
# of O(1) values in f32, one rounding per add.
LOOKUP_ATOL = 0.0
SUM_ATOL = 1e-6

# docs/upstream-notes.md §nano-2.1: the audio pad id, one past the 1024-row codebook tables
PAD = 1024
V, D = PAD, 16


def safe_ids_and_masks(ids: np.ndarray, pad_id: int):
    """Host-side mapping the graph expects: (T, C) ids with pads → I32 ids with each pad
    replaced by 0 (a valid row) and F32 masks (T, C) with 0 where the id was a pad."""
    is_pad = ids == pad_id
    return np.where(is_pad, 0, ids).astype(np.int32), (~is_pad).astype(np.float32)


def _masked_sum_graph(t, n_tables, *, table_type=F32, masked=True):
    g = Graph(name="masked_embedding_sum")
    tables = [g.input(f"table.{c}", (V, D), table_type) for c in range(n_tables)]  # [D, V]
    ids = [g.input(f"ids.{c}", (t,), I32) for c in range(n_tables)]                # [T]
    masks = [g.input(f"mask.{c}", (t, 1)) if masked else None for c in range(n_tables)]  # [1, T]
    g.output(nn.masked_embedding_sum(tables, ids, masks), "y", ndim=2)                # [D, T]
    return g


def _feed(tables, safe, masks=None):
    feed = {f"table.{c}": tab for c, tab in enumerate(tables)}
    feed |= {f"ids.{c}": safe[:, c] for c in range(len(tables))}
    if masks is not None:
        feed |= {f"mask.{c}": masks[:, c:c + 1] for c in range(len(tables))}
    return feed


def _codes(rng, t, n_tables, pad_rate):
    ids = rng.integers(0, V, (t, n_tables))
    ids[rng.random((t, n_tables)) < pad_rate] = PAD
    if t > 1:
        ids[0, :] = PAD              # one row entirely pad: must embed to exactly zero
        ids[-1, :] = V - 1           # the last table row is reachable
    else:
        ids[0, 0] = PAD              # a single row still holds a pad
    return ids


@pytest.mark.parametrize("table_type", [F32, F16], ids=["f32", "f16"])
@pytest.mark.parametrize("t", [1, 9])
def test_embedding_matches_table_rows(rng, table_type, t):
    table = rng.standard_normal((V, D)).astype(np.float32)
    ids = rng.integers(0, V, t).astype(np.int32)
    g = Graph(name="embedding")
    g.output(nn.embedding(g.input("table", (V, D), table_type), g.input("ids", (t,), I32)),
             "y", ndim=2)
    got = g.run({"table": table, "ids": ids})["y"]
    stored = table.astype(np.float16).astype(np.float32) if table_type == F16 else table
    assert_close(got, stored[ids], atol=LOOKUP_ATOL, what="embedding")
    # guard: ids off by one select other rows
    assert_differs(got, stored[(ids + 1) % V], atol=SUM_ATOL, what="embedding at ids + 1")


@pytest.mark.parametrize("n_tables", [1, 4])
@pytest.mark.parametrize("t", [1, 12])
def test_masked_embedding_sum_matches_reference_with_pads(rng, n_tables, t):
    tables = [rng.standard_normal((V, D)).astype(np.float32) for _ in range(n_tables)]
    ids = _codes(rng, t, n_tables, pad_rate=0.3)
    safe, masks = safe_ids_and_masks(ids, PAD)
    got = _masked_sum_graph(t, n_tables).run(_feed(tables, safe, masks))["y"]
    want = ref.embedding_sum(ids, tables, pad_id=PAD)
    assert_close(got, want, atol=SUM_ATOL, what="masked_embedding_sum")
    if (ids[0] == PAD).all():
        assert_close(got[0], np.zeros(D, np.float32), atol=0.0, what="all-pad row")
    # guard: without the masks the pads read row 0 of every table, which is not zero
    unmasked = ref.embedding_sum(safe, tables)
    assert_differs(got, unmasked, atol=SUM_ATOL, what="pads embedded as id 0")


def test_masked_embedding_sum_without_masks_is_plain_sum(rng):
    """masks=None means every id is valid: the plain sum of the looked-up rows."""
    t, n_tables = 7, 3
    tables = [rng.standard_normal((V, D)).astype(np.float32) for _ in range(n_tables)]
    ids = rng.integers(0, V, (t, n_tables))
    g = _masked_sum_graph(t, n_tables, masked=False)
    got = g.run(_feed(tables, ids.astype(np.int32)))["y"]
    assert_close(got, ref.embedding_sum(ids, tables), atol=SUM_ATOL, what="unmasked sum")
    # guard: the tables are summed column by column, not all read with column 0's ids
    wrong = ref.embedding_sum(np.repeat(ids[:, :1], n_tables, axis=1), tables)
    assert_differs(got, wrong, atol=SUM_ATOL, what="every table read at column 0")


def test_masked_embedding_sum_f16_tables(rng):
    t, n_tables = 8, 2
    tables = [rng.standard_normal((V, D)).astype(np.float32) for _ in range(n_tables)]
    ids = _codes(rng, t, n_tables, pad_rate=0.25)
    safe, masks = safe_ids_and_masks(ids, PAD)
    got = _masked_sum_graph(t, n_tables, table_type=F16).run(_feed(tables, safe, masks))["y"]
    stored = [tab.astype(np.float16).astype(np.float32) for tab in tables]  # what the graph holds
    assert_close(got, ref.embedding_sum(ids, stored, pad_id=PAD), atol=SUM_ATOL,
                 what="masked sum over f16 tables")


def test_masked_embedding_sum_rejects_mismatched_lists():
    g = Graph(name="bad")
    tab = g.input("table", (V, D))
    ids = g.input("ids", (3,), I32)
    with pytest.raises(ShapeError):
        nn.masked_embedding_sum([tab, tab], [ids], [None, None])
    with pytest.raises(ShapeError):
        nn.masked_embedding_sum([], [], [])
