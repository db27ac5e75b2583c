"""Parity of moss_tts/nn/linear.py (linear, layer_scale) with fixtures/reference/ops.py."""

import numpy as np
import pytest

from fixtures.compare import assert_close, assert_differs
from fixtures.reference import ops as ref
from moss_tts import nn
from moss_tts.ggml import F16, F32, Graph

# f32 weights: ggml accumulates the dot products in f32; |x|, |w| ~ 1 over ≤ 64 terms keeps the
# error ~1e-6, well under this bound.
F32_ATOL = 1e-5
# f16 weights: ggml rounds both the weight (stored) and x (converted to the f16 vec-dot type)
# to f16 (rel. 2^-11 each), so a 64-term dot product of O(1) values is off by a few 1e-3.
F16_ATOL = 1e-2
# layer_scale is one f32 multiply: exact up to the final rounding.
SCALE_ATOL = 1e-6

SHAPES = [(1, 8, 4), (7, 32, 48), (5, 64, 16)]  # (T, in, out)


def _linear_graph(t, n_in, n_out, *, wtype, bias, strided):
    """Build linear over x (T, in); `strided` reads every other row of a (2T, in) input (a view
    whose rows are not packed)."""
    g = Graph(name="linear")
    if strided:
        src = g.input("x", (2 * t, n_in))
        x = src.view((n_in, t), (2 * src.nb[1],))        # [in, T], rows 0, 2, 4, …
        assert t == 1 or not x.is_contiguous()
    else:
        x = g.input("x", (t, n_in))                      # [in, T]
    w = g.input("w", (n_out, n_in), wtype)               # PyTorch (out, in) == ggml [in, out]
    b = g.input("b", (n_out,)) if bias else None
    g.output(nn.linear(x, w, b), "y", ndim=2)            # [out, T]; ndim keeps T=1
    return g


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("bias", [True, False], ids=["bias", "nobias"])
@pytest.mark.parametrize("wtype,atol", [(F32, F32_ATOL), (F16, F16_ATOL)], ids=["f32", "f16"])
@pytest.mark.parametrize("strided", [False, True], ids=["contiguous", "strided_rows"])
def test_linear_matches_reference(rng, shape, bias, wtype, atol, strided):
    t, n_in, n_out = shape
    x = rng.standard_normal((2 * t if strided else t, n_in)).astype(np.float32)
    w = rng.standard_normal((n_out, n_in)).astype(np.float32) / np.sqrt(n_in)
    b = rng.standard_normal(n_out).astype(np.float32)
    g = _linear_graph(t, n_in, n_out, wtype=wtype, bias=bias, strided=strided)
    feed = {"x": x, "w": w} | ({"b": b} if bias else {})
    got = g.run(feed)["y"]
    rows = x[::2] if strided else x
    want = ref.linear(rows, w, b if bias else None)
    assert_close(got, want, atol=atol, what="linear")
    # guard: the same weights read with the rows of x shifted by one are a different result
    shifted = ref.linear(np.roll(rows, 1, axis=0) if t > 1 else rows + 1, w, b if bias else None)
    assert_differs(got, shifted, atol=atol, what="linear with shifted rows")


def test_linear_uses_pytorch_weight_layout(rng):
    """A square weight must be used as (out, in): wᵀ gives a different answer."""
    d = 16
    x = rng.standard_normal((4, d)).astype(np.float32)
    w = rng.standard_normal((d, d)).astype(np.float32)
    got = _linear_graph(4, d, d, wtype=F32, bias=False, strided=False).run({"x": x, "w": w})["y"]
    assert_close(got, ref.linear(x, w), atol=F32_ATOL, what="linear (out, in)")
    assert_differs(got, ref.linear(x, w.T), atol=F32_ATOL, what="linear with wᵀ")


@pytest.mark.parametrize("t,d", [(1, 8), (9, 24)])
def test_layer_scale_matches_reference(rng, t, d):
    x = rng.standard_normal((t, d)).astype(np.float32)
    s = rng.uniform(0.1, 2.0, d).astype(np.float32)
    g = Graph(name="layer_scale")
    g.output(nn.layer_scale(g.input("x", (t, d)), g.input("s", (d,))), "y", ndim=2)
    got = g.run({"x": x, "s": s})["y"]
    assert_close(got, ref.layer_scale(x, s), atol=SCALE_ATOL, what="layer_scale")
    # guard: the scale is per channel, not per row — a reversed scale vector must differ
    assert_differs(got, ref.layer_scale(x, s[::-1]), atol=SCALE_ATOL, what="reversed scale")
