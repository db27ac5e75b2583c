"""Parity of moss_tts/nn/rope.py (normal = interleaved pairs, neox = halves) with the reference."""

import numpy as np
import pytest

from fixtures.compare import assert_close, assert_differs
from fixtures.reference import ops as ref
from moss_tts import nn
from moss_tts.errors import ShapeError
from moss_tts.ggml import F32, I32, Graph

# ggml builds each angle p·base^(−2i/n) in f32 by repeated multiplication (rope cache), so the
# angle error grows with p: ~p·i·6e-8 rad; positions < 512 and |x| ~ 1 keep it under 1e-4.
ROPE_ATOL = 2e-4
MAX_POS = 512


def _rope(x, pos, *, mode, base, n_dims):
    t, h, dh = x.shape
    g = Graph(name="rope")
    xt = g.input("x", (t, h, dh))                       # [Dh, H, T]
    p = g.input("pos", (t,), I32)
    g.output(nn.rope(xt, p, mode=mode, base=base, n_dims=n_dims), "y", ndim=3)
    return g.run({"x": x, "pos": pos})["y"]


CASES = [  # (T, H, Dh, n_dims, base)
    (1, 1, 8, None, 10000.0),
    (7, 4, 16, None, 10000.0),
    (5, 2, 64, None, 1e6),     # Qwen3's base
    (6, 3, 32, 16, 10000.0),   # partial rotary: dims past n_dims pass through
]


@pytest.mark.parametrize("mode", ["normal", "neox"])
@pytest.mark.parametrize("case", CASES, ids=lambda c: "T{}H{}D{}n{}b{:g}".format(*c))
def test_rope_matches_reference(rng, mode, case):
    t, h, dh, n_dims, base = case
    x = rng.standard_normal((t, h, dh)).astype(np.float32)
    pos = rng.integers(0, MAX_POS, t).astype(np.int32)   # unsorted, with gaps
    got = _rope(x, pos, mode=mode, base=base, n_dims=n_dims)
    want = ref.rope(x, pos, n_dims=n_dims, base=base, mode=mode)
    assert_close(got, want, atol=ROPE_ATOL, what=f"rope {mode}")
    # guard: every position off by one must move the result
    assert_differs(got, ref.rope(x, pos + 1, n_dims=n_dims, base=base, mode=mode),
                   atol=ROPE_ATOL, what="rope at shifted positions")
    if n_dims is not None:  # the unrotated tail is passed through bit for bit
        assert_close(got[..., n_dims:], x[..., n_dims:], atol=0.0, what="rope pass-through dims")


@pytest.mark.parametrize("mode,other", [("normal", "neox"), ("neox", "normal")])
def test_rope_modes_pair_different_dims(rng, mode, other):
    """normal rotates (2i, 2i+1), neox rotates (i, i+n/2): the other pairing must differ."""
    x = rng.standard_normal((4, 2, 16)).astype(np.float32)
    pos = np.array([3, 10, 50, 200], dtype=np.int32)
    got = _rope(x, pos, mode=mode, base=10000.0, n_dims=None)
    assert_differs(got, ref.rope(x, pos, mode=other), atol=ROPE_ATOL, what=f"{mode} vs {other}")


def test_rope_at_position_zero_is_identity(rng):
    x = rng.standard_normal((3, 2, 8)).astype(np.float32)
    got = _rope(x, np.zeros(3, np.int32), mode="normal", base=10000.0, n_dims=None)
    assert_close(got, x, atol=1e-7, what="rope at p=0")


def test_rope_rejects_bad_positions_and_dims():
    g = Graph(name="rope_bad")
    x = g.input("x", (4, 2, 8))
    with pytest.raises(ShapeError):
        nn.rope(x, g.input("p_short", (3,), I32), mode="normal")
    with pytest.raises(ShapeError):
        nn.rope(x, g.input("p_f32", (4,), F32), mode="normal")
    with pytest.raises(ShapeError):
        nn.rope(x, g.input("p", (4,), I32), mode="normal", n_dims=7)
    with pytest.raises(ShapeError):
        nn.rope(x, g.inputs["p"], mode="gptj")
