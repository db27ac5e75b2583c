"""Parity of moss_tts/nn/mlp.py (gelu_erf, gelu_tanh, silu, SwiGLU) with the numpy reference."""

import numpy as np
import pytest

from fixtures.compare import assert_close, assert_differs
from fixtures.reference import ops as ref
from moss_tts import nn
from moss_tts.errors import ShapeError
from moss_tts.ggml import Graph

# Two f32 matmuls around an f32 activation (gelu_tanh composed from exact f32 ops, not ggml's
# f16 table): outputs of size ~1 are good to ~1e-6. The erf/tanh GELUs differ by up to ~1e-3
# after the projections, so this bound also tells the two activations apart (see the guard).
MLP_ATOL = 1e-5

T, D, FF = 6, 32, 96


def _silu_mlp_with_bias(x, w_in, w_out, b_in, b_out):
    """The reference has no biased silu MLP; compose it from the reference ops."""
    return ref.linear(ref.silu(ref.linear(x, w_in, b_in)), w_out, b_out)


REFERENCES = {
    "gelu_erf": lambda x, wi, wo, bi, bo: ref.mlp_gelu_erf(x, wi, wo, bi, bo),
    "gelu_tanh": lambda x, wi, wo, bi, bo: ref.mlp_gelu_tanh(x, wi, wo, bi, bo),
    "silu": lambda x, wi, wo, bi, bo: (_silu_mlp_with_bias(x, wi, wo, bi, bo) if bi is not None
                                       else ref.mlp_silu(x, wi, wo)),
}
# for the guard: the activation a mix-up would most likely produce
CONFUSED_WITH = {"gelu_erf": "gelu_tanh", "gelu_tanh": "gelu_erf", "silu": "gelu_erf"}


def _weights(rng, t=T):
    # scaled so pre-activations reach |z| ≈ 3, where the activations differ most
    return {
        "x": rng.standard_normal((t, D)).astype(np.float32),
        "w_in": (rng.standard_normal((FF, D)) * 1.5 / np.sqrt(D)).astype(np.float32),
        "w_gate": (rng.standard_normal((FF, D)) * 1.5 / np.sqrt(D)).astype(np.float32),
        "w_out": (rng.standard_normal((D, FF)) / np.sqrt(FF)).astype(np.float32),
        "b_in": rng.standard_normal(FF).astype(np.float32),
        "b_out": rng.standard_normal(D).astype(np.float32),
    }


def _mlp_graph(t, *, activation, bias, gated):
    g = Graph(name="mlp")
    x = g.input("x", (t, D))                                    # [D, T]
    w_in, w_out = g.input("w_in", (FF, D)), g.input("w_out", (D, FF))
    kw = {}
    if bias:
        kw |= {"b_in": g.input("b_in", (FF,)), "b_out": g.input("b_out", (D,))}
    if gated:
        kw["w_gate"] = g.input("w_gate", (FF, D))
    g.output(nn.mlp(x, w_in, w_out, activation=activation, **kw), "y", ndim=2)  # [D, T]
    return g


@pytest.mark.parametrize("t", [1, T])
@pytest.mark.parametrize("bias", [True, False], ids=["bias", "nobias"])
@pytest.mark.parametrize("activation", ["gelu_erf", "gelu_tanh", "silu"])
def test_mlp_matches_reference(rng, activation, bias, t):
    w = _weights(rng, t)
    g = _mlp_graph(t, activation=activation, bias=bias, gated=False)
    feed = {k: w[k] for k in g.inputs}
    got = g.run(feed)["y"]
    bi, bo = (w["b_in"], w["b_out"]) if bias else (None, None)
    want = REFERENCES[activation](w["x"], w["w_in"], w["w_out"], bi, bo)
    assert_close(got, want, atol=MLP_ATOL, what=f"mlp {activation}")
    # guard: the neighbouring activation must be told apart at this tolerance
    other = CONFUSED_WITH[activation]
    wrong = REFERENCES[other](w["x"], w["w_in"], w["w_out"], bi, bo)
    assert_differs(got, wrong, atol=MLP_ATOL, what=f"{activation} vs {other}")


@pytest.mark.parametrize("t", [1, T])
def test_swiglu_mlp_matches_reference(rng, t):
    """Gated: w_out · (silu(w_gate·x) ⊙ (w_in·x)), w_in the "up" projection (Qwen3 FFN)."""
    w = _weights(rng, t)
    g = _mlp_graph(t, activation="silu", bias=False, gated=True)
    got = g.run({k: w[k] for k in g.inputs})["y"]
    want = ref.mlp_swiglu(w["x"], w["w_gate"], w["w_in"], w["w_out"])
    assert_close(got, want, atol=MLP_ATOL, what="swiglu mlp")
    # guard: gate and up swapped (silu on the up projection) must differ
    swapped = ref.mlp_swiglu(w["x"], w["w_in"], w["w_gate"], w["w_out"])
    assert_differs(got, swapped, atol=MLP_ATOL, what="swiglu with gate/up swapped")


def test_mlp_rejects_unknown_or_ungated_activation():
    g = Graph(name="mlp_bad")
    x, w_in, w_out = g.input("x", (2, D)), g.input("w_in", (FF, D)), g.input("w_out", (D, FF))
    with pytest.raises(ShapeError, match="unknown activation"):
        nn.mlp(x, w_in, w_out, activation="relu")
    with pytest.raises(ShapeError, match="SwiGLU"):
        nn.mlp(x, w_in, w_out, activation="gelu_erf", w_gate=g.input("w_gate", (FF, D)))
