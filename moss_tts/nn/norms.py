"""LayerNorm and RMSNorm (with optional affine), and per-head q/k RMSNorm."""

from __future__ import annotations

from ..ggml import ops
from ..ggml.graph import Tensor


def layer_norm(x: Tensor, weight: Tensor | None = None, bias: Tensor | None = None, *,
               eps: float = 1e-5) -> Tensor:
    """(x − mean)/√(var + eps) · weight + bias over ne0 (biased variance, like PyTorch)."""
    y = ops.norm(x, eps)
    if weight is not None:
        y = ops.mul(y, weight)
    return y if bias is None else ops.add(y, bias)


def rms_norm(x: Tensor, weight: Tensor | None = None, *, eps: float = 1e-6) -> Tensor:
    """x / √(mean(x²) + eps) · weight over ne0."""
    y = ops.rms_norm(x, eps)
    return y if weight is None else ops.mul(y, weight)


def head_rms_norm(x: Tensor, weight: Tensor, *, eps: float = 1e-6) -> Tensor:
    """Qwen3's q/k norm: RMSNorm of each head x [Dh, H, T] over Dh, one weight [Dh] shared by
    all heads."""
    return ops.mul(ops.rms_norm(x, eps), weight)
