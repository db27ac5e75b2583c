"""Parity of the op functions in moss_tts/ggml/ops.py with the numpy references in
fixtures/reference/ops.py: one table row per op × shape × layout, each with a named tolerance
(style C28-C29), plus the ShapeError checks that keep a bad shape from aborting the process (C11).
$MOSS_TTS_TEST_BACKEND names another backend to run them on (a device's kernels, same tolerances).
Past 600 lines because it mirrors all of ops.py (C27); the tables are most of it.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Callable

import numpy as np
import pytest

from fixtures.compare import assert_close, assert_differs
from fixtures.reference import ops as ref
from fixtures.reference.quant import dequantize_q8_0, quantize_q8_0
from moss_tts.errors import ShapeError
from moss_tts.ggml import BF16, F16, F32, I32, GGMLType, Graph, Weights, ops
from moss_tts.ggml.quant import dequantize, quantize
from moss_tts.ggml.types import bf16_bits_to_float32, float32_to_bf16_bits

from tests.conftest import TEST_BACKEND_ENV

from .child import death_detail, run_graph_child

# the backend the tables run on: the CPU, or a device (bench/gpu_check.sh sets cuda)
BACKEND = os.environ.get(TEST_BACKEND_ENV) or "cpu"

NUMPY_FLOAT = {F32: np.float32, F16: np.float16}

# -- tolerances (absolute unless rtol is given; inputs are O(1)) ----------------------------------
# +, −, ×, ÷, negation, x² and copies are IEEE-exact in f32, and the float64 reference rounded once
# to f32 is the same number (53 ≥ 2·24 + 2 bits: no double-rounding error).
EXACT = 0.0
# x·s + b: ggml rounds after the product and after the sum, the reference once (measured 2.4e-7
# on |y| ≤ 5: one ulp).
SCALE_BIAS = 1e-6
# ggml's f32 expf / tanhf / erff / silu kernels: measured ≤ 1 ulp (rel ≤ 2.4e-7; abs 9.5e-7 at
# |y| ≈ 10 for swiglu), so 1e-6 + 1e-6·|y| leaves a 4× margin. Also the composed gelu_tanh
# (~7 f32 ops, measured 4.8e-7).
F32_TRANSCENDENTAL = 1e-6
F32_TRANSCENDENTAL_RTOL = 1e-6
# Mean / variance / norm over 32-64 values accumulated in f32 (measured ≤ 4.8e-7, unit output).
F32_REDUCTION = 2e-6
# exp and a row sum in f32, probabilities ≤ 1 (measured ≤ 1.2e-7).
F32_SOFTMAX = 1e-6
# cos/sin of f32 θ = p·base^(−2i/n) built by repeated multiplication (measured 8.5e-7 at p < 50).
F32_ROPE = 3e-6


def _tile(b: np.ndarray, like: np.ndarray) -> np.ndarray:
    """ggml broadcasting repeats b whole (tiling, `i % ne`) along every axis whose ne divides."""
    b = b.reshape((1,) * (like.ndim - b.ndim) + b.shape)
    return np.tile(b, tuple(a // n for a, n in zip(like.shape, b.shape)))


def _f64(x):
    return np.asarray(x, dtype=np.float64)


def _as_f32(x) -> np.ndarray:
    """A float64 reference rounded once to the f32 that ggml returns (ints stay ints)."""
    x = np.asarray(x)
    return x.astype(np.float32) if x.dtype == np.float64 else x


def _values(rng, shape, domain: str) -> np.ndarray:
    """Seeded inputs of numpy `shape` (C28a): never all zeros or ones."""
    if domain == "normal":
        x = rng.standard_normal(shape)
    elif domain == "positive":            # sqrt
        x = rng.uniform(0.1, 4.0, shape)
    elif domain == "divisor":             # ÷: keeps |b| ≥ 0.5
        x = rng.choice([-1.0, 1.0], shape) * rng.uniform(0.5, 2.0, shape)
    elif domain == "wide":                # the saturating ends of tanh / exp / gelu / silu
        x = rng.uniform(-6.0, 6.0, shape)
    else:
        raise ValueError(domain)
    return x.astype(np.float32)


# -- graph plumbing -------------------------------------------------------------------------------
ROW_PAD = (2, 3)       # a strided operand lives at columns [2, 2 + D) of rows D + 5 long
SENTINEL = 99.0        # what a view that reads past its window would pick up


def _operand(g: Graph, name: str, value: np.ndarray, dtype: GGMLType, layout: str):
    """Graph tensor holding `value`: a plain input, or ("strided") a view into a wider input
    whose rows are contiguous but whose row stride is larger (ggml_is_contiguous_rows only)."""
    if layout == "contiguous" or value.ndim < 2:
        return g.input(name, value.shape, dtype), value
    before, after = ROW_PAD
    wide = np.full(value.shape[:-1] + (before + value.shape[-1] + after,), SENTINEL, value.dtype)
    wide[..., before:before + value.shape[-1]] = value
    t = g.input(name, wide.shape, dtype)
    view = t.view(value.shape[::-1], None, before * wide.itemsize)  # ne = [D, ...], t's strides
    assert view.is_contiguous() == (value.size == value.shape[-1])  # one row is contiguous
    return view, wide


def run(build: Callable, values: list, *, dtypes=None, layout: str = "contiguous",
        ndim: int | None = None) -> np.ndarray:
    """Build `build(*operands)` over graph inputs holding `values`, run it, return the output
    (with at least `ndim` axes: ggml drops trailing size-1 axes, e.g. M = 1)."""
    dtypes = dtypes or [F32] * len(values)
    with Graph(BACKEND, name="test_ops") as g:
        operands, feeds = [], {}
        for i, (v, dt) in enumerate(zip(values, dtypes)):
            t, feeds[f"in{i}"] = _operand(g, f"in{i}", v, dt, layout)
            operands.append(t)
        g.output(build(*operands), "out", ndim=ndim)
        return g.run(feeds)["out"]


def _wrong_rows(x: np.ndarray) -> np.ndarray:
    """Sensitivity input: rows in the wrong order, what a misread stride would produce."""
    return np.roll(x, 1, axis=0 if x.shape[0] > 1 else -1)


# -- the elementwise / reduction table ------------------------------------------------------------
@dataclass(frozen=True)
class OpCase:
    build: Callable              # graph operands → Tensor
    reference: Callable          # numpy operands → expected
    inputs: tuple                # (numpy shape, value domain) per operand
    atol: float
    rtol: float = 0.0
    strided: bool = True         # the op takes row-strided views


BINARY = {
    "add": (ops.add, np.add, "normal"),
    "sub": (ops.sub, np.subtract, "normal"),
    "mul": (ops.mul, np.multiply, "normal"),
    "div": (ops.div, np.divide, "divisor"),
}
BROADCASTS = {  # name: (a shape, b shape); every ggml ne of b divides a's
    "same": ((6, 32), (6, 32)),
    "row_vector": ((6, 32), (32,)),
    "column": ((6, 32), (6, 1)),
    "tiled_rows": ((6, 32), (2, 32)),    # rows 0..5 read b rows 0,1,0,1,0,1 (not numpy's rule)
    "batch_3d": ((4, 3, 32), (2, 1, 32)),
}
F32_FN = (F32_TRANSCENDENTAL, F32_TRANSCENDENTAL_RTOL)
CASES: dict[str, OpCase] = {}
for _op, (_fn, _np, _dom) in BINARY.items():
    for _bname, (_sa, _sb) in BROADCASTS.items():
        CASES[f"{_op}-{_bname}"] = OpCase(
            _fn, lambda a, b, _np=_np: _np(_f64(a), _f64(_tile(b, a))),
            ((_sa, "normal"), (_sb, _dom)), EXACT)

CASES.update({
    # scale / scale_bias need fully contiguous input (ggml_is_padded_1d): no strided row
    "scale": OpCase(lambda x: x * 2.5, lambda x: _f64(x) * 2.5, (((6, 32), "normal"),), EXACT,
                    strided=False),
    "add_constant": OpCase(lambda x: x + 1.0, lambda x: _f64(x) + 1.0, (((6, 32), "normal"),),
                           EXACT, strided=False),
    "sub_constant": OpCase(lambda x: x - 0.5, lambda x: _f64(x) - 0.5, (((6, 32), "normal"),),
                           EXACT, strided=False),
    "scale_bias": OpCase(lambda x: ops.scale_bias(x, 0.7, -1.3), lambda x: _f64(x) * 0.7 - 1.3,
                         (((6, 32), "normal"),), SCALE_BIAS, strided=False),
    "sqr": OpCase(ops.sqr, np.square, (((6, 32), "normal"),), EXACT),
    "sqrt": OpCase(ops.sqrt, np.sqrt, (((6, 32), "positive"),), EXACT),
    "neg": OpCase(ops.neg, np.negative, (((6, 32), "normal"),), EXACT),
    "sin": OpCase(ops.sin, np.sin, (((6, 32), "wide"),), *F32_FN),
    "tanh": OpCase(ops.tanh, np.tanh, (((6, 32), "wide"),), *F32_FN),
    "exp": OpCase(ops.exp, np.exp, (((6, 32), "wide"),), *F32_FN),
    "silu": OpCase(ops.silu, ref.silu, (((6, 32), "wide"),), *F32_FN),
    "silu_3d": OpCase(ops.silu, ref.silu, (((2, 3, 32), "normal"),), *F32_FN),
    "gelu_erf": OpCase(ops.gelu_erf, ref.gelu_erf, (((6, 32), "wide"),), *F32_FN),
    "gelu_tanh": OpCase(ops.gelu_tanh, ref.gelu_tanh, (((6, 32), "wide"),), *F32_FN),
    "swiglu": OpCase(ops.swiglu, ref.swiglu, (((6, 32), "wide"), ((6, 32), "normal")), *F32_FN),
    "swiglu_3d": OpCase(ops.swiglu, ref.swiglu, (((2, 3, 32), "normal"), ((2, 3, 32), "normal")),
                        *F32_FN),
    "clamp": OpCase(lambda x: ops.clamp(x, -0.5, 0.7), lambda x: np.clip(x, -0.5, 0.7),
                    (((6, 32), "normal"),), EXACT),
    "norm": OpCase(lambda x: ops.norm(x, 1e-5), lambda x: ref.layer_norm(x, eps=1e-5),
                   (((6, 64), "normal"),), F32_REDUCTION),
    "rms_norm": OpCase(lambda x: ops.rms_norm(x, 1e-6), lambda x: ref.rms_norm(x, eps=1e-6),
                       (((6, 64), "normal"),), F32_REDUCTION),
    "rms_norm_3d": OpCase(lambda x: ops.rms_norm(x, 1e-6), lambda x: ref.rms_norm(x, eps=1e-6),
                          (((2, 3, 32), "normal"),), F32_REDUCTION),
    "l2_norm": OpCase(lambda x: ops.l2_norm(x, 1e-12), lambda x: ref.l2_normalize(x, 1e-12),
                      (((6, 64), "normal"),), F32_REDUCTION),
    "sum_rows": OpCase(ops.sum_rows, ref.sum_rows, (((6, 64), "normal"),), F32_REDUCTION),
    "argmax": OpCase(ops.argmax, ref.argmax, (((6, 64), "normal"),), EXACT),
    "softmax": OpCase(ops.softmax, ref.softmax, (((6, 40), "wide"),), F32_SOFTMAX, strided=False),
})

TABLE = [pytest.param(name, layout, id=f"{name}-{layout}")
         for name, case in CASES.items()
         for layout in (("contiguous", "strided") if case.strided else ("contiguous",))]


@pytest.mark.parametrize("name, layout", TABLE)
def test_op_matches_reference(rng, name, layout):
    case = CASES[name]
    values = [_values(rng, shape, dom) for shape, dom in case.inputs]
    got = run(case.build, values, layout=layout)
    want = _as_f32(case.reference(*values))
    assert_close(got, want, atol=case.atol, rtol=case.rtol, what=f"{name} ({layout})")
    wrong = case.reference(_wrong_rows(values[0]), *values[1:])
    assert_differs(got, np.reshape(wrong, got.shape), atol=case.atol, rtol=case.rtol,
                   what=f"{name} with rows out of order")


# ggml_gelu's CPU kernel rounds x to f16 and reads a 64k-entry table (f32 formula past |x| > 10).
# Measured on 24k points in [-6, 6]: max abs error 2.0e-3 (f16 input rounding × gelu' ≤ 1.13).
GELU_TABLE_MIN_ERROR = 1e-4
GELU_TABLE_MAX_ERROR = 5e-3


def test_gelu_tanh_table_is_f16_accurate_only(rng):
    x = np.concatenate([rng.uniform(-6, 6, 20480), np.linspace(-6, 6, 4096)]).astype(np.float32)
    x = x.reshape(-1, 64)
    got = run(lambda t: ops.gelu_tanh(t, table=True), [x])
    want = ref.gelu_tanh(x)
    err = assert_close(got, want, atol=GELU_TABLE_MAX_ERROR, what="gelu_tanh(table=True)")
    assert err > GELU_TABLE_MIN_ERROR, f"the f16 table was expected to lose > 1e-4, lost {err:.3g}"
    exact = run(ops.gelu_tanh, [x])
    assert_close(exact, want, atol=F32_TRANSCENDENTAL, rtol=F32_TRANSCENDENTAL_RTOL,
                 what="composed gelu_tanh on the same points")


# -- f16 elementwise ------------------------------------------------------------------------------
@pytest.mark.parametrize("b_type", [F16, F32], ids=["f16+f16", "f16+f32"])
@pytest.mark.parametrize("op", ["add", "mul"])
def test_f16_binary_matches_reference(rng, op, b_type):
    a = _values(rng, (6, 32), "normal").astype(np.float16)
    b = _values(rng, (32,), "normal").astype(np.float16 if b_type == F16 else np.float32)
    fn, np_fn, _ = BINARY[op]
    got = run(fn, [a, b], dtypes=[F16, b_type])
    assert got.dtype == np.float16

    def reference(a):  # ggml: widen to f32, one IEEE f32 op, round the result to f16
        return _as_f32(np_fn(_f64(a), _f64(_tile(b, a)))).astype(np.float16)

    assert_close(got, reference(a), atol=EXACT, what=f"{op} f16")
    assert_differs(got, reference(_wrong_rows(a)), atol=EXACT, what=f"{op} f16, rows out of order")


# -- softmax with masks ---------------------------------------------------------------------------
def _softmax_mask(rng, rows: int, cols: int) -> np.ndarray:
    """Additive mask: random finite biases, −inf above a causal diagonal (every row keeps one)."""
    mask = rng.uniform(-2.0, 2.0, (rows, cols)).astype(np.float32)
    mask[np.triu_indices(rows, k=cols - rows + 1, m=cols)] = -np.inf
    return mask


SOFTMAX_MASKED = {  # x shape, mask rows (≥ T), mask type, scale
    "f32_mask": ((6, 40), 6, F32, 1.0),
    "f32_mask_scaled": ((6, 40), 6, F32, 0.3),
    "f32_mask_taller": ((6, 40), 9, F32, 0.3),   # ggml reads the first T mask rows
    "f16_mask_scaled": ((6, 40), 6, F16, 0.3),
    "f32_mask_heads": ((3, 6, 40), 6, F32, 0.5),  # one mask broadcast over 3 heads
    "no_mask_scaled": ((6, 40), 0, None, 0.3),
}


@pytest.mark.parametrize("variant", list(SOFTMAX_MASKED))
def test_softmax_with_mask_and_scale_matches_reference(rng, variant):
    shape, mask_rows, mask_type, scale = SOFTMAX_MASKED[variant]
    x = _values(rng, shape, "wide")
    values, dtypes = [x], [F32]
    if mask_type is not None:
        mask = _softmax_mask(rng, mask_rows, shape[-1])
        values.append(mask.astype(np.float16) if mask_type == F16 else mask)
        dtypes.append(mask_type)
    got = run(lambda t, m=None: ops.softmax(t, m, scale), values, dtypes=dtypes)
    mask_used = None if mask_type is None else _f64(values[1])[:shape[-2]]
    want = ref.softmax(x, scale=scale, mask=mask_used)
    assert_close(got, want, atol=F32_SOFTMAX, what=f"softmax {variant}")
    other = None if mask_used is None else np.roll(mask_used, 1, axis=-1)
    assert_differs(got, ref.softmax(x, scale=scale * 1.5 if other is None else scale, mask=other),
                   atol=F32_SOFTMAX, what=f"softmax {variant} with another mask / scale")


# -- mul_mat --------------------------------------------------------------------------------------
K, N = 256, 24     # K a multiple of the 256-wide K-quant blocks; w ~ N(0, 1/K) keeps y = O(1)

# f32 weights: f32 dot products of 256 terms (measured 3.3e-7 on |y| ≤ 4; 15× for other SIMD).
MUL_MAT_F32 = 5e-6
# f16 / bf16 weights: ggml rounds the activations to the weight type first (vec_dot_type); against
# the reference with x rounded the same way only f32 accumulation remains (measured 4.8e-7).
MUL_MAT_SAME_ROUNDING = 5e-6
# ...and against the unrounded x: f16 keeps 11 bits (measured 7.7e-4), bf16 8 bits (6.4e-3).
MUL_MAT_UNROUNDED_X = {F16: 3e-3, BF16: 2e-2}
ACTIVATION_ROUNDING = {F16: lambda x: x.astype(np.float16).astype(np.float32),
                       BF16: lambda x: bf16_bits_to_float32(float32_to_bf16_bits(x))}
WEIGHT_FEED = {F32: lambda w: w, F16: lambda w: w.astype(np.float16),
               BF16: float32_to_bf16_bits}


@pytest.mark.parametrize("layout", ["contiguous", "strided"])
@pytest.mark.parametrize("m", [1, 17], ids=["decode_m1", "m17"])
@pytest.mark.parametrize("wtype", [F32, F16, BF16], ids=["f32", "f16", "bf16"])
def test_mul_mat_float_weights_matches_reference(rng, wtype, m, layout):
    w = (rng.standard_normal((N, K)) / np.sqrt(K)).astype(np.float32)
    x = _values(rng, (m, K), "normal")
    feed = WEIGHT_FEED[wtype](w)
    w_used = w if wtype == F32 else dequantize(np.ascontiguousarray(feed), wtype, w.shape)
    got = run(ops.mul_mat, [feed, x], dtypes=[wtype, F32], layout=layout, ndim=2)
    if wtype == F32:
        assert_close(got, ref.mul_mat(w, x), atol=MUL_MAT_F32, what="mul_mat f32")
    else:
        x_rounded = ACTIVATION_ROUNDING[wtype](x)
        assert_close(got, ref.mul_mat(w_used, x_rounded), atol=MUL_MAT_SAME_ROUNDING,
                     what=f"mul_mat {wtype.name} vs x rounded to {wtype.name}")
        assert_close(got, ref.mul_mat(w, x), atol=MUL_MAT_UNROUNDED_X[wtype],
                     what=f"mul_mat {wtype.name} vs f32 x and weights")
    assert_differs(got, ref.mul_mat(w_used[::-1], x), atol=MUL_MAT_UNROUNDED_X[BF16],
                   what="mul_mat with the weight rows in reverse order")


def test_mul_mat_weight_batch_broadcasts_like_grouped_heads(rng):
    # a [K, N, 2], b [K, M, 4]: b batches 0,1 read a batch 0 and 2,3 read batch 1 (i12 / 2).
    w = (rng.standard_normal((2, N, 64)) / 8).astype(np.float32)
    x = _values(rng, (4, 5, 64), "normal")
    got = run(ops.mul_mat, [w, x])
    assert_close(got, ref.mul_mat(np.repeat(w, 2, axis=0), x), atol=MUL_MAT_F32,
                 what="batched mul_mat")
    assert_differs(got, ref.mul_mat(np.tile(w, (2, 1, 1)), x), atol=MUL_MAT_F32,
                   what="batched mul_mat with tiled (not repeated) weight batches")


@pytest.fixture
def gguf_weights(tmp_path):
    """Writes {name: (raw uint8 rows, GGMLType)} to a GGUF and loads it as persistent Weights —
    the only way to get quantized weights into a graph (graph inputs are element types)."""
    import gguf  # a moss-tts dependency: missing it is a failure, not a skip
    opened = []

    def load(tensors: dict) -> Weights:
        path = tmp_path / f"weights{len(opened)}.gguf"
        writer = gguf.GGUFWriter(path, arch="test")
        for name, (raw, t) in tensors.items():
            writer.add_tensor(name, raw, raw_dtype=gguf.GGMLQuantizationType(int(t)))
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
        writer.close()
        opened.append(Weights.load(path, BACKEND))
        return opened[-1]

    yield load
    for w in opened:
        w.close()


def _run_with_weight(weights: Weights, name: str, build: Callable, x: np.ndarray, dtype=F32):
    with Graph(BACKEND, name="test_ops_weights") as g:
        t = g.input("x", x.shape, dtype)
        g.output(build(weights[name], t), "out", ndim=2)
        return g.run({"x": x})["out"]


# Quantized weights: ggml also quantizes the activations (q8_0 blocks of 32 for q8_0/q4_0, q8_K
# blocks of 256 for K-quants), so against x @ dequantize(w).T that rounding is the error left:
# measured max |err| 0.015 (q8_0, q4_0), 0.019-0.020 (q4_K, q5_K, q6_K) on y = O(1), K = 256.
# (Rounding x through a numpy q8_K as well brings the K-quants to ≤ 4e-7; fixtures/reference/
# quant.py has no q8_K yet, so only q8_0 / q4_0 get that tight check below.)
MUL_MAT_QUANT_VS_DEQUANT = {"q8_0": 0.05, "q4_0": 0.05, "q4_K": 0.05, "q5_K": 0.05, "q6_K": 0.05}
# ...and against the f32 weights, adding the weight rounding; measured 0.029 (q8_0), 0.32 (q4_0),
# 0.26 (q4_K), 0.11 (q5_K), 0.061 (q6_K); bounds ≈ 2.5×.
MUL_MAT_QUANT_VS_F32 = {"q8_0": 0.08, "q4_0": 0.8, "q4_K": 0.65, "q5_K": 0.3, "q6_K": 0.15}
# With the activations rounded through q8_0 in numpy too (fixtures/reference/quant.py), the
# q8_0 / q4_0 products agree to f32 accumulation (measured 2.4e-7).
MUL_MAT_Q8_ACTIVATIONS = 5e-6


@pytest.mark.parametrize("m", [1, 17], ids=["decode_m1", "m17"])
@pytest.mark.parametrize("qtype", list(MUL_MAT_QUANT_VS_DEQUANT))
def test_mul_mat_quantized_weights_matches_dequantized_reference(rng, gguf_weights, qtype, m):
    w = (rng.standard_normal((N, K)) / np.sqrt(K)).astype(np.float32)
    x = _values(rng, (m, K), "normal")
    raw = quantize(w, qtype)
    w_deq = dequantize(raw, qtype, w.shape)
    weights = gguf_weights({"w": (raw, GGMLType.parse(qtype))})
    got = _run_with_weight(weights, "w", ops.mul_mat, x)
    assert_close(got, ref.mul_mat(w_deq, x), atol=MUL_MAT_QUANT_VS_DEQUANT[qtype],
                 what=f"mul_mat {qtype} vs x @ dequantize(w).T")
    assert_close(got, ref.mul_mat(w, x), atol=MUL_MAT_QUANT_VS_F32[qtype],
                 what=f"mul_mat {qtype} vs f32 weights")
    if qtype in ("q8_0", "q4_0"):
        x_q8 = dequantize_q8_0(*quantize_q8_0(x))
        assert_close(got, ref.mul_mat(w_deq, x_q8), atol=MUL_MAT_Q8_ACTIVATIONS,
                     what=f"mul_mat {qtype} vs q8_0-rounded activations")
    assert_differs(got, ref.mul_mat(w_deq[::-1], x), atol=MUL_MAT_QUANT_VS_DEQUANT[qtype],
                   what=f"mul_mat {qtype} with the weight rows in reverse order")


# -- get_rows -------------------------------------------------------------------------------------
@pytest.mark.parametrize("table_type", [F32, F16], ids=["f32", "f16"])
def test_get_rows_with_repeated_ids_matches_reference(rng, table_type):
    table = _values(rng, (11, 32), "normal").astype(NUMPY_FLOAT[table_type])
    ids = np.array([3, 0, 10, 3, 3, 7], dtype=np.int32)  # repeats, first and last row
    got = run(ops.get_rows, [table, ids], dtypes=[table_type, I32])
    assert got.dtype == np.float32
    assert_close(got, table[ids].astype(np.float32), atol=EXACT, what="get_rows")
    assert_differs(got, table[(ids + 1) % len(table)].astype(np.float32), atol=EXACT,
                   what="get_rows of shifted ids")


def test_get_rows_from_quantized_table_matches_dequantized_rows(rng, gguf_weights):
    table = _values(rng, (9, 64), "normal")
    raw = quantize(table, "q8_0")
    weights = gguf_weights({"emb": (raw, GGMLType.Q8_0)})
    ids = np.array([8, 2, 2, 0], dtype=np.int32)
    got = _run_with_weight(weights, "emb", ops.get_rows, ids, I32)
    want = dequantize(raw, "q8_0", table.shape)[ids]
    assert_close(got, want, atol=EXACT, what="get_rows q8_0")
    assert_differs(got, want[::-1], atol=EXACT, what="get_rows q8_0 reversed ids")


# -- rope -----------------------------------------------------------------------------------------
ROPE_T, ROPE_H, ROPE_DH, ROPE_START = 7, 3, 16, 37   # positions 37..43: not starting at 0


@pytest.mark.parametrize("layout", ["contiguous", "strided"])
@pytest.mark.parametrize("n_dims", [ROPE_DH, 8], ids=["full_dims", "partial_dims"])
@pytest.mark.parametrize("mode", ["normal", "neox"])
def test_rope_matches_reference(rng, mode, n_dims, layout):
    x = _values(rng, (ROPE_T, ROPE_H, ROPE_DH), "normal")   # ggml [Dh, H, T]
    pos = np.arange(ROPE_START, ROPE_START + ROPE_T, dtype=np.int32)
    got = run(lambda t, p: ops.rope(t, p, n_dims=n_dims, mode=mode, base=10000.0), [x, pos],
              dtypes=[F32, I32], layout=layout)
    want = ref.rope(x, pos, n_dims=n_dims, base=10000.0, mode=mode)
    assert_close(got, want, atol=F32_ROPE, what=f"rope {mode} n_dims={n_dims}")
    if n_dims < ROPE_DH:
        assert_close(got[..., n_dims:], x[..., n_dims:], atol=EXACT, what="rope pass-through dims")
    other = "neox" if mode == "normal" else "normal"
    assert_differs(got, ref.rope(x, pos + 1, n_dims=n_dims, mode=mode), atol=F32_ROPE,
                   what="rope at positions shifted by one")
    assert_differs(got, ref.rope(x, pos, n_dims=n_dims, mode=other), atol=F32_ROPE,
                   what=f"rope in mode {other}")


# -- flash attention ------------------------------------------------------------------------------
# K/V f32: f32 dot products and an f32 online softmax (measured 7.2e-7 on |out| ≤ 2).
FLASH_ATTN_F32_KV = 5e-6
# K/V f16: ggml rounds q to f16 for q·k and accumulates softmax·V in an f16 buffer, whose half-ulp
# at |out| ≈ 2 is 1e-3 (measured 1.9e-3 against the reference on the f16-rounded k and v).
FLASH_ATTN_F16_KV = 5e-3


@pytest.mark.parametrize("kv_type", [F32, F16], ids=["kv_f32", "kv_f16"])
@pytest.mark.parametrize("tq", [1, 5], ids=["decode_tq1", "tq5"])
def test_flash_attn_matches_reference_attention(rng, kv_type, tq):
    hq, hkv, tk, dh = 4, 2, 9, 32
    q = _values(rng, (hq, tq, dh), "normal")            # ggml [Dh, Tq, Hq]
    k = _values(rng, (hkv, tk, dh), "normal").astype(NUMPY_FLOAT[kv_type])
    v = _values(rng, (hkv, tk, dh), "normal").astype(NUMPY_FLOAT[kv_type])
    q_pos, k_pos = np.arange(tk - tq, tk), np.arange(tk)
    key_mask = np.arange(tk) != 2          # one hidden key, so the decode row is masked too
    allowed = ref.attention_allowed(q_pos, k_pos, causal=True, key_mask=key_mask)
    mask = np.where(allowed, 0.0, -np.inf).astype(np.float16)   # (Tq, Tk) = ggml [Tk, Tq]
    scale = 1.0 / np.sqrt(dh)
    got = run(lambda a, b, c, m: ops.flash_attn(a, b, c, m, scale), [q, k, v, mask],
              dtypes=[F32, kv_type, kv_type, F16], ndim=3)       # → ggml [Dv, Hq, Tq]
    tol = FLASH_ATTN_F32_KV if kv_type == F32 else FLASH_ATTN_F16_KV

    def attention(**kw):  # the reference takes (T, H, Dh)
        return ref.attention(q.transpose(1, 0, 2), k.transpose(1, 0, 2), v.transpose(1, 0, 2),
                             q_pos=q_pos, k_pos=k_pos, scale=scale, **kw)

    assert_close(got, attention(causal=True, key_mask=key_mask), atol=tol,
                 what=f"flash_attn {kv_type.name}")
    assert_differs(got, attention(causal=True), atol=tol, what="flash_attn vs the mask without "
                   "its hidden key")


# -- copies, casts, layout ------------------------------------------------------------------------
@pytest.mark.parametrize("src_type, dst_type", [(F32, F16), (F16, F32), (F32, BF16), (F32, F32)],
                         ids=["f32_to_f16", "f16_to_f32", "f32_to_bf16", "f32_to_f32"])
@pytest.mark.parametrize("src_view", ["contiguous", "transposed"])
def test_cpy_into_destination_converts_exactly(rng, src_type, dst_type, src_view):
    src = _values(rng, (5, 12), "normal").astype(NUMPY_FLOAT[src_type])
    dst_shape = src.shape if src_view == "contiguous" else src.shape[::-1]
    garbage = _values(rng, dst_shape, "wide")               # overwritten by the copy
    dst_feed = WEIGHT_FEED[dst_type](garbage)

    def build(s, d):
        return ops.cpy(s if src_view == "contiguous" else s.transpose(), d)

    got = run(build, [src, dst_feed], dtypes=[src_type, dst_type])
    moved = src.astype(np.float32) if src_view == "contiguous" else src.astype(np.float32).T
    want = WEIGHT_FEED[dst_type](moved.astype(NUMPY_FLOAT.get(dst_type, np.float32)))
    assert got.dtype == np.asarray(want).dtype
    assert_close(got, want, atol=EXACT, what=f"cpy {src_type.name} → {dst_type.name}")
    assert_differs(got, WEIGHT_FEED[dst_type](garbage), atol=EXACT, what="cpy left dst unchanged")


@pytest.mark.parametrize("src_type, dst_type", [(F32, F16), (F16, F32), (F32, BF16)],
                         ids=["f32_to_f16", "f16_to_f32", "f32_to_bf16"])
def test_cast_converts_exactly(rng, src_type, dst_type):
    x = _values(rng, (5, 12), "normal").astype(NUMPY_FLOAT[src_type])
    got = run(lambda t: ops.cast(t, dst_type), [x], dtypes=[src_type])
    want = WEIGHT_FEED[dst_type](x.astype(np.float32).astype(NUMPY_FLOAT.get(dst_type, np.float32)))
    assert got.dtype == np.asarray(want).dtype
    assert_close(got, want, atol=EXACT, what=f"cast {src_type.name} → {dst_type.name}")
    assert_differs(got, WEIGHT_FEED[dst_type](_wrong_rows(x).astype(np.float32)), atol=EXACT,
                   what="cast of rows out of order")


def _numpy_permute(x: np.ndarray, axes: tuple) -> np.ndarray:
    """ggml_permute on numpy order: ggml axis i ↔ numpy axis 3 − i, and source ggml axis i
    becomes result axis axes[i]."""
    x4 = x.reshape((1,) * (4 - x.ndim) + x.shape)
    perm = [0] * 4
    for i, a in enumerate(tuple(axes) + tuple(range(len(axes), 4))):
        perm[3 - a] = 3 - i
    return np.transpose(x4, perm)


def _squeeze_leading(x: np.ndarray) -> np.ndarray:
    while x.ndim > 1 and x.shape[0] == 1:
        x = x[0]
    return x


LAYOUT = {  # name: (input shape, build, numpy reference)
    "cont_of_permute_0213": ((4, 3, 5), lambda t: t.permute(0, 2, 1).cont(),
                             lambda x: _numpy_permute(x, (0, 2, 1))),
    "cont_of_permute_1203": ((4, 3, 5), lambda t: t.permute(1, 2, 0).cont(),
                             lambda x: _numpy_permute(x, (1, 2, 0))),
    "permute_4d_output": ((2, 4, 3, 5), lambda t: t.permute(2, 0, 3, 1),
                          lambda x: _numpy_permute(x, (2, 0, 3, 1))),
    "transpose": ((6, 10), lambda t: t.transpose(), lambda x: x.T),
    "reshape": ((6, 10), lambda t: t.reshape(15, 4), lambda x: x.reshape(4, 15)),
    "reshape_of_cont_transpose": ((6, 10), lambda t: t.transpose().cont().reshape(12, 5),
                                  lambda x: x.T.reshape(5, 12)),
    "view_with_offset": ((6, 10), lambda t: t.view((7, 4), None, 1 * t.nb[1] + 2 * t.nb[0]),
                         lambda x: x[1:5, 2:9]),
    "view_with_strides": ((6, 10), lambda t: t.view((3, 3), (2 * t.nb[1],), t.nb[0]),
                          lambda x: x[0:6:2, 1:4]),
    "pad": ((6, 10), lambda t: ops.pad(t, (1, 2), (0, 3)),
            lambda x: np.pad(x, ((0, 3), (1, 2)))),
    "pad_3d": ((2, 6, 10), lambda t: ops.pad(t, (0, 1), (2, 0), (1, 1)),
               lambda x: np.pad(x, ((1, 1), (2, 0), (0, 1)))),
}


@pytest.mark.parametrize("name", list(LAYOUT))
def test_layout_op_matches_numpy(rng, name):
    shape, build, numpy_fn = LAYOUT[name]
    x = _values(rng, shape, "normal")
    got = run(build, [x])
    want = _squeeze_leading(np.asarray(numpy_fn(x)))
    assert_close(got, want, atol=EXACT, what=name)
    assert_differs(got, _squeeze_leading(np.asarray(numpy_fn(_wrong_rows(x)))), atol=EXACT,
                   what=f"{name} of rows out of order")


@pytest.mark.parametrize("layout", ["contiguous", "transposed"])
@pytest.mark.parametrize("dim", [0, 1, 2, 3])
def test_concat_on_each_axis_matches_numpy(rng, dim, layout):
    a_shape = (2, 3, 4, 5)                      # ggml [5, 4, 3, 2]
    b_shape = list(a_shape)
    b_shape[3 - dim] = 2                        # ggml axis dim ↔ numpy axis 3 − dim
    a, b = _values(rng, a_shape, "normal"), _values(rng, tuple(b_shape), "normal")
    if layout == "transposed":                   # feed b with its two fastest axes swapped
        b_feed = np.ascontiguousarray(np.swapaxes(b, -1, -2))
        got = run(lambda s, t: ops.concat(s, t.permute(1, 0), dim), [a, b_feed])
    else:
        got = run(lambda s, t: ops.concat(s, t, dim), [a, b])
    want = np.concatenate([a, b], axis=3 - dim)
    assert_close(got, want, atol=EXACT, what=f"concat dim {dim}")
    assert_differs(got, np.concatenate([b, a], axis=3 - dim) if a.shape == b.shape else
                   np.concatenate([a, b[::-1]], axis=3 - dim), atol=EXACT,
                   what=f"concat dim {dim} with b reversed")


# -- shape errors: ShapeError in Python, never a ggml abort ---------------------------------------
SHAPE_ERRORS = {  # name: (input shapes and types, build that must raise)
    "mul_mat_mismatched_k": ([((4, 16), F32), ((3, 8), F32)], lambda w, x: ops.mul_mat(w, x)),
    "add_not_broadcastable": ([((6, 32), F32), ((4, 32), F32)], lambda a, b: ops.add(a, b)),
    "mul_not_broadcastable_either_way": ([((6, 32), F32), ((4, 16), F32)],
                                         lambda a, b: a * b),
    "get_rows_f32_ids": ([((8, 4), F32), ((3,), F32)], lambda t, i: ops.get_rows(t, i)),
    "rope_wrong_position_length": ([((5, 2, 8), F32), ((4,), I32)],
                                   lambda x, p: ops.rope(x, p)),
    "rope_odd_n_dims": ([((5, 2, 8), F32), ((5,), I32)], lambda x, p: ops.rope(x, p, n_dims=5)),
    "reshape_wrong_count": ([((6, 10), F32)], lambda x: x.reshape(7, 9)),
    "view_out_of_bounds": ([((6, 10), F32)], lambda x: x.view((10, 6), None, 4)),
    "concat_mismatched": ([((3, 8), F32), ((3, 9), F32)], lambda a, b: ops.concat(a, b, 1)),
    "concat_mixed_types": ([((3, 8), F32), ((3, 8), F16)], lambda a, b: ops.concat(a, b, 1)),
    "softmax_mask_too_short": ([((6, 40), F32), ((5, 40), F32)],
                               lambda x, m: ops.softmax(x, m)),
    "flash_attn_f32_mask": ([((2, 3, 8), F32), ((2, 4, 8), F32), ((2, 4, 8), F32),
                             ((3, 4), F32)], lambda q, k, v, m: ops.flash_attn(q, k, v, m, 0.3)),
    "swiglu_shape_mismatch": ([((3, 8), F32), ((3, 16), F32)], lambda a, b: ops.swiglu(a, b)),
    "sqr_of_transposed": ([((6, 10), F32)], lambda x: ops.sqr(x.transpose())),
    "mul_mat_transposed_b": ([((4, 6), F32), ((6, 3), F32)],
                             lambda w, x: ops.mul_mat(w, x.transpose())),
    "cpy_element_count": ([((3, 8), F32), ((3, 9), F16)], lambda s, d: ops.cpy(s, d)),
    "pad_negative": ([((3, 8), F32)], lambda x: ops.pad(x, (-1, 0))),
    "permute_not_a_permutation": ([((3, 8), F32)], lambda x: x.permute(0, 0)),
}


@pytest.mark.parametrize("name", list(SHAPE_ERRORS))
def test_bad_shapes_raise_shape_error_and_the_graph_survives(rng, name):
    specs, build = SHAPE_ERRORS[name]
    with Graph(BACKEND, name="test_shape_errors") as g:
        ts = [g.input(f"in{i}", shape, dt) for i, (shape, dt) in enumerate(specs)]
        with pytest.raises(ShapeError):
            build(*ts)
        # the process and the graph are intact: a valid op on the same inputs still runs
        g.output(ops.neg(ts[0]), "out")
        feeds = {f"in{i}": _values(rng, shape, "normal").astype(
                 np.int32 if dt == I32 else NUMPY_FLOAT.get(dt, np.float32))
                 for i, (shape, dt) in enumerate(specs)}
        got = g.run(feeds)["out"]
        assert_close(got, -feeds["in0"].astype(np.float32), atol=EXACT, what="op after the error")


def test_tensor_in_if_raises_type_error():
    with Graph(name="test_bool") as g:
        x = g.input("x", (2, 3))
        with pytest.raises(TypeError):
            if x:
                pass


# Layouts and types that ggml rejects with GGML_ASSERT / GGML_ABORT (or, for argmax, misreads:
# its stride check is a debug-only assert) but the op functions let through, so the process
# aborts instead of raising ShapeError (style C11). Each runs in a child process so an abort
# fails one test instead of killing the session.
ABORTS = {
    "add_f32_with_f16_operand": """
        a = g.input("a", (4, 8)); b = g.input("b", (4, 8), F16)
        g.output(ops.add(a, b), "o")
        g.run({"a": np.ones((4, 8)), "b": np.ones((4, 8), np.float16)})""",
    "clamp_of_transposed": """
        a = g.input("a", (4, 8))
        g.output(ops.clamp(a.transpose(), -0.5, 0.5), "o")
        g.run({"a": np.ones((4, 8))})""",
    "sum_rows_of_transposed": """
        a = g.input("a", (4, 8))
        g.output(ops.sum_rows(a.transpose()), "o")
        g.run({"a": np.ones((4, 8))})""",
    "swiglu_of_permuted_3d": """
        a = g.input("a", (2, 3, 8)); b = g.input("b", (2, 3, 8))
        ops.swiglu(a.permute(0, 2, 1), b.permute(0, 2, 1))""",
    "rope_of_transposed": """
        x = g.input("x", (3, 8, 4)); p = g.input("p", (3,), I32)
        g.output(ops.rope(x.permute(1, 0, 2), p), "o")
        g.run({"x": np.ones((3, 8, 4)), "p": np.arange(3, dtype=np.int32)})""",
    "flash_attn_with_transposed_v": """
        q = g.input("q", (1, 2, 8)); k = g.input("k", (1, 4, 8)); v = g.input("v", (1, 8, 4))
        g.output(ops.flash_attn(q, k, v.permute(1, 0, 2), None, 0.3), "o")
        g.run({"q": np.ones((1, 2, 8)), "k": np.ones((1, 4, 8)), "v": np.ones((1, 8, 4))})""",
    "argmax_of_transposed": """
        x = g.input("x", (4, 8))
        g.output(ops.argmax(x.transpose()), "o")
        v = np.random.default_rng(0).random((4, 8)).astype(np.float32)
        got = g.run({"x": v})["o"]
        assert (got == v.T.argmax(-1)).all(), f"silently wrong: {got} != {v.T.argmax(-1)}" """,
}


CHECKS_ITS_RESULT = {"argmax_of_transposed"}  # may also pass by computing the right answer


@pytest.mark.parametrize("name", list(ABORTS))
def test_op_rejects_layouts_and_types_ggml_cannot_take(name):
    proc = run_graph_child(ABORTS[name])
    assert proc.returncode == 0, f"{name}: child died ({proc.returncode}): {death_detail(proc)}"
    ok = ("ShapeError", "NO_ERROR") if name in CHECKS_ITS_RESULT else ("ShapeError",)
    assert proc.stdout.startswith(ok), f"{name}: no ShapeError: {proc.stdout}"
