"""Embedding lookups: one table, and the masked sum over several tables (text + codebooks)."""

from __future__ import annotations

from ..errors import ShapeError
from ..ggml import ops
from ..ggml.graph import Tensor


def embedding(table: Tensor, ids: Tensor) -> Tensor:
    """table [D, V] at I32 ids [T] → [D, T]."""
    return ops.get_rows(table, ids)


def masked_embedding_sum(tables: list[Tensor], ids: list[Tensor], masks: list[Tensor | None]) -> Tensor:
    """Σ_c mask_c ⊙ table_c[ids_c] → [D, T].

    ids_c are I32 [T] already made safe on the host (a pad id replaced by 0, since the pad lies
    outside the table); mask_c is F32 [1, T] with 0 where the id was a pad (None = all valid).
    """
    if not tables or len(tables) != len(ids) or len(ids) != len(masks):
        raise ShapeError(f"masked_embedding_sum: need matching non-empty lists, got "
                         f"{len(tables)} tables, {len(ids)} id vectors, {len(masks)} masks")
    total = None
    for table, idx, mask in zip(tables, ids, masks):
        e = ops.get_rows(table, idx)
        if mask is not None:
            e = ops.mul(e, mask)
        total = e if total is None else ops.add(total, e)
    return total
