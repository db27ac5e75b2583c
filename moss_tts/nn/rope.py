"""Rotary position embedding over head-split tensors."""

from __future__ import annotations

from ..ggml import ops
from ..ggml.graph import Tensor


def rope(x: Tensor, positions: Tensor, *, mode: str, base: float = 10000.0,
         n_dims: int | None = None) -> Tensor:
    """x [Dh, H, T] rotated at I32 positions [T]; angle p·base^(−2i/n_dims) for pair i.

    mode "normal" rotates interleaved pairs (x[2i], x[2i+1]) — GPT-J style, used by the MOSS
    codecs and Nano; "neox" rotates halves (x[i], x[i + n_dims/2]) — Qwen3. Dims past n_dims
    (default Dh) pass through unrotated.
    """
    return ops.rope(x, positions, n_dims=n_dims, mode=mode, base=base)
