"""Parity of moss_tts/nn/patch.py (the codecs' PatchedPretransform) with the numpy reference."""

import numpy as np
import pytest

from fixtures.compare import assert_close, assert_differs
from fixtures.reference import ops as ref
from moss_tts import nn
from moss_tts.errors import ShapeError
from moss_tts.ggml import Graph, ops

# Pure data movement: every value must arrive bit for bit.
MOVE_ATOL = 0.0
# for the guards: any misplaced value of a standard normal input moves by far more than this
GUARD_ATOL = 1e-3

CASES = [(12, 1, 4), (240, 1, 240), (12, 3, 4), (10, 8, 2), (6, 5, 6)]  # (T, D, h)


def _run(fn, x, h):
    g = Graph(name=fn.__name__)
    g.output(fn(g.input("x", x.shape), h), "y", ndim=2)
    return g.run({"x": x})["y"]


@pytest.mark.parametrize("t,d,h", CASES)
def test_patchify_matches_reference(rng, t, d, h):
    x = rng.standard_normal((t, d)).astype(np.float32)               # [D, T]
    got = _run(nn.patchify, x, h)                                     # [D·h, T/h]
    assert_close(got, ref.patchify(x, h), atol=MOVE_ATOL, what="patchify")
    # guard: reversing the time axis in each patch misplaces values
    flipped = x.reshape(t // h, h, d)[:, ::-1].reshape(t, d)
    if h > 1:
        assert_differs(got, ref.patchify(flipped, h), atol=GUARD_ATOL, what="flipped patches")


@pytest.mark.parametrize("t,d,h", CASES)
def test_unpatchify_matches_reference(rng, t, d, h):
    x = rng.standard_normal((t // h, d * h)).astype(np.float32)      # [D·h, L]
    got = _run(nn.unpatchify, x, h)                                   # [D, L·h]
    assert_close(got, ref.unpatchify(x, h), atol=MOVE_ATOL, what="unpatchify")


@pytest.mark.parametrize("t,d,h", CASES)
def test_unpatchify_inverts_patchify(rng, t, d, h):
    x = rng.standard_normal((t, d)).astype(np.float32)
    g = Graph(name="round_trip")
    g.output(nn.unpatchify(nn.patchify(g.input("x", (t, d)), h), h), "y", ndim=2)
    assert_close(g.run({"x": x})["y"], x, atol=MOVE_ATOL, what="unpatchify ∘ patchify")


@pytest.mark.parametrize("t,d,h", [c for c in CASES if c[1] > 1])
def test_plain_reshape_is_not_patchify_when_channels_exceed_one(rng, t, d, h):
    """For D > 1 patchify interleaves channel-major (index c·h + j); a bare reshape of [D, T]
    into [D·h, T/h] would be time-major (index j·D + c) — the guard that the permute is needed."""
    x = rng.standard_normal((t, d)).astype(np.float32)
    g = Graph(name="reshape")
    g.output(ops.reshape(g.input("x", (t, d)), d * h, t // h), "y", ndim=2)
    reshaped = g.run({"x": x})["y"]
    assert_differs(reshaped, ref.patchify(x, h), atol=GUARD_ATOL, what="reshape as patchify")


def test_patchify_rejects_length_not_multiple_of_patch():
    g = Graph(name="bad")
    with pytest.raises(ShapeError, match="multiple"):
        nn.patchify(g.input("x", (10, 2)), 4)
    with pytest.raises(ShapeError, match="multiple"):
        nn.unpatchify(g.input("y", (3, 10)), 4)
