"""Parity of moss_tts/nn/norms.py (layer_norm, rms_norm, head_rms_norm) with the numpy reference."""

import numpy as np
import pytest

from fixtures.compare import assert_close, assert_differs
from fixtures.reference import ops as ref
from moss_tts import nn
from moss_tts.ggml import Graph

# f32 normalization: ggml sums the mean and variance in f32 (ggml_float for the sums); outputs
# of size ~3 (affine weight up to 2, inputs offset by 3) are good to a few 1e-6.
NORM_ATOL = 1e-5

SHAPES = [(1, 16), (6, 64), (3, 384)]  # (T, D)


def _rows(rng, t, d):
    """Rows with a non-zero mean and uneven scale, so mean removal and eps both matter."""
    scale = rng.uniform(0.5, 3.0, (t, 1))
    return (rng.standard_normal((t, d)) * scale + 3.0).astype(np.float32)


def _affine(rng, d):
    return (rng.uniform(0.5, 2.0, d).astype(np.float32), rng.standard_normal(d).astype(np.float32))


def _norm_graph(kind, t, d, *, weight, bias, eps, strided):
    g = Graph(name=kind)
    if strided:  # every other row of a (2T, D) input: rows not packed
        src = g.input("x", (2 * t, d))
        x = src.view((d, t), (2 * src.nb[1],))          # [D, T]
    else:
        x = g.input("x", (t, d))                        # [D, T]
    w = g.input("w", (d,)) if weight else None
    if kind == "layer_norm":
        b = g.input("b", (d,)) if bias else None
        y = nn.layer_norm(x, w, b, eps=eps)
    else:
        y = nn.rms_norm(x, w, eps=eps)
    g.output(y, "y", ndim=2)
    return g


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("affine", ["none", "weight", "weight_bias"])
@pytest.mark.parametrize("strided", [False, True], ids=["contiguous", "strided_rows"])
def test_layer_norm_matches_reference(rng, shape, affine, strided):
    t, d = shape
    eps = 1e-5
    x = _rows(rng, 2 * t if strided else t, d)
    w, b = _affine(rng, d)
    use_w, use_b = affine != "none", affine == "weight_bias"
    g = _norm_graph("layer_norm", t, d, weight=use_w, bias=use_b, eps=eps, strided=strided)
    feed = {"x": x} | ({"w": w} if use_w else {}) | ({"b": b} if use_b else {})
    got = g.run(feed)["y"]
    rows = x[::2] if strided else x
    want = ref.layer_norm(rows, w if use_w else None, b if use_b else None, eps)
    assert_close(got, want, atol=NORM_ATOL, what="layer_norm")
    # guard: RMSNorm of the same (offset) rows skips mean removal, so it must differ
    wrong = ref.rms_norm(rows, w if use_w else None, eps) + (b if use_b else 0)
    assert_differs(got, wrong, atol=NORM_ATOL, what="rms_norm instead of layer_norm")


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("weight", [False, True], ids=["noweight", "weight"])
@pytest.mark.parametrize("strided", [False, True], ids=["contiguous", "strided_rows"])
def test_rms_norm_matches_reference(rng, shape, weight, strided):
    t, d = shape
    eps = 1e-6
    x = _rows(rng, 2 * t if strided else t, d)
    w, _ = _affine(rng, d)
    g = _norm_graph("rms_norm", t, d, weight=weight, bias=False, eps=eps, strided=strided)
    got = g.run({"x": x} | ({"w": w} if weight else {}))["y"]
    rows = x[::2] if strided else x
    want = ref.rms_norm(rows, w if weight else None, eps)
    assert_close(got, want, atol=NORM_ATOL, what="rms_norm")
    # guard: LayerNorm of the offset rows removes the mean, so it must differ
    assert_differs(got, ref.layer_norm(rows, w if weight else None, None, eps), atol=NORM_ATOL,
                   what="layer_norm instead of rms_norm")


@pytest.mark.parametrize("eps", [1e-6, 1e-2])
def test_norm_eps_is_used(rng, eps):
    """Tiny-variance rows: the eps inside the square root dominates, so a wrong eps shows."""
    t, d = 4, 32
    x = (rng.standard_normal((t, d)) * 1e-2).astype(np.float32)
    g = _norm_graph("rms_norm", t, d, weight=False, bias=False, eps=eps, strided=False)
    got = g.run({"x": x})["y"]
    assert_close(got, ref.rms_norm(x, None, eps), atol=NORM_ATOL, what=f"rms_norm eps={eps}")
    other = 1e-2 if eps == 1e-6 else 1e-6
    assert_differs(got, ref.rms_norm(x, None, other), atol=NORM_ATOL, what="rms_norm, other eps")


@pytest.mark.parametrize("t,h,dh", [(1, 2, 8), (5, 4, 16), (3, 16, 128)])
def test_head_rms_norm_matches_reference(rng, t, h, dh):
    """Qwen3 q/k norm: RMSNorm over Dh of each head, one weight [Dh] shared by all heads."""
    eps = 1e-6
    # heads at very different scales: a norm over the whole H·Dh row would not undo them
    x = (rng.standard_normal((t, h, dh)) * rng.uniform(0.1, 5.0, (1, h, 1))).astype(np.float32)
    w, _ = _affine(rng, dh)
    g = Graph(name="head_rms_norm")
    xt = g.input("x", (t, h, dh))                        # [Dh, H, T]
    g.output(nn.head_rms_norm(xt, g.input("w", (dh,)), eps=eps), "y", ndim=3)
    got = g.run({"x": x, "w": w})["y"]
    assert_close(got, ref.rms_norm(x, w, eps), atol=NORM_ATOL, what="head_rms_norm")
    # guard: one RMSNorm over the merged H·Dh row (not per head) must differ
    merged = ref.rms_norm(x.reshape(t, h * dh), np.tile(w, h), eps).reshape(t, h, dh)
    assert_differs(got, merged, atol=NORM_ATOL, what="norm over merged heads")
