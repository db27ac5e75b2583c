"""Feed-forward blocks; the variant is an argument, not a subclass (style C15)."""

from __future__ import annotations

from ..errors import ShapeError
from ..ggml import ops
from ..ggml.graph import Tensor
from .linear import linear

ACTIVATIONS = {
    "gelu_erf": ops.gelu_erf,      # exact GELU (PyTorch nn.GELU() default): the codecs
    "gelu_tanh": ops.gelu_tanh,    # GPT-2 gelu_new, composed in f32 (ggml_gelu uses an f16 table)
    "silu": ops.silu,
}


def mlp(x: Tensor, w_in: Tensor, w_out: Tensor, *, activation: str, b_in: Tensor | None = None,
        b_out: Tensor | None = None, w_gate: Tensor | None = None) -> Tensor:
    """x [D, T] → w_out · act(w_in · x + b_in) + b_out.

    With `w_gate` it is gated (SwiGLU when activation="silu"): w_out · (act(w_gate·x) ⊙ (w_in·x)),
    w_in playing the "up" projection.
    """
    up = linear(x, w_in, b_in)
    if w_gate is not None:
        if activation != "silu":
            raise ShapeError(f"mlp: gated MLPs are SwiGLU only, got activation {activation!r}")
        h = ops.swiglu(linear(x, w_gate), up)
    else:
        try:
            h = ACTIVATIONS[activation](up)
        except KeyError:
            raise ShapeError(f"mlp: unknown activation {activation!r}; "
                             f"known: {', '.join(ACTIVATIONS)}") from None
    return linear(h, w_out, b_out)
