"""Linear projections and LayerScale."""

from __future__ import annotations

from ..ggml import ops
from ..ggml.graph import Tensor


def linear(x: Tensor, weight: Tensor, bias: Tensor | None = None) -> Tensor:
    """x [in, T] · weight (PyTorch (out, in) = ggml [in, out]) + bias [out] → [out, T]."""
    y = ops.mul_mat(weight, x)
    return y if bias is None else ops.add(y, bias)


def layer_scale(x: Tensor, scale: Tensor) -> Tensor:
    """Per-channel scale [D] on x [D, T] (LayerScale: applied to a branch before its residual)."""
    return ops.mul(x, scale)
