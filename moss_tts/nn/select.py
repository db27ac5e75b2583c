"""Row selection on [D, T] activations, so model code never handles byte strides (C7)."""

from __future__ import annotations

from ..errors import ShapeError
from ..ggml import ops
from ..ggml.graph import Tensor


def last_row(x: Tensor) -> Tensor:
    """x [D, T] → its last row [D, 1] (a view: only the rows that are sampled reach the
    heads)."""
    if x.ne[2] != 1 or x.ne[3] != 1:
        raise ShapeError(f"last_row: expected a matrix [D, T], got {list(x.ne)}")
    return ops.view(x, (x.ne[0], 1), offset=(x.ne[1] - 1) * x.nb[1])
