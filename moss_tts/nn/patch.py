"""The codecs' PatchedPretransform: a pure reshape between sample rate and frame rate.

Upstream (conv layout (B, D, T)): reshape (B, D, T/h, h) → permute (B, D, h, T/h) → reshape
(B, D·h, T/h); so the new channel index is c·h + j (channel-major, patch-offset-minor).
"""

from __future__ import annotations

from ..errors import ShapeError
from ..ggml import ops
from ..ggml.graph import Tensor


def patchify(x: Tensor, h: int) -> Tensor:
    """x [D, T] (frame-major) → [D·h, T/h] with out[c·h + j, l] = x[c, l·h + j]."""
    d, t = x.ne[0], x.ne[1]
    if t % h:
        raise ShapeError(f"patchify: length {t} is not a multiple of the patch size {h} "
                         "(pad the input first)")
    if d == 1:  # one channel: frame l is simply samples l·h … l·h+h−1
        return ops.reshape(x, h, t // h)
    y = ops.reshape(x, d, h, t // h)                 # [D, h, L]
    y = ops.cont(ops.permute(y, 1, 0, 2))             # [h, D, L]: j fastest, then c
    return ops.reshape(y, d * h, t // h)              # [D·h, L], index c·h + j


def unpatchify(x: Tensor, h: int) -> Tensor:
    """x [D·h, L] → [D, L·h] with out[c, l·h + j] = x[c·h + j, l]."""
    dh, n = x.ne[0], x.ne[1]
    if dh % h:
        raise ShapeError(f"unpatchify: {dh} channels are not a multiple of the patch size {h}")
    d = dh // h
    if d == 1:
        return ops.reshape(x, 1, h * n)
    y = ops.reshape(x, h, d, n)                       # [h, D, L]: channel c·h + j → (j, c)
    y = ops.cont(ops.permute(y, 1, 0, 2))             # [D, h, L]
    return ops.reshape(y, d, h * n)
