"""Op functions over `Tensor`s. Each checks in Python what ggml would GGML_ASSERT (an assert
aborts the whole process) and raises `ShapeError` naming the op and the shapes (style C11).

Shapes in docstrings are ggml order `[ne0, ne1, ...]` (fastest axis first).
"""

from __future__ import annotations

import itertools
import math

from ..errors import ShapeError
from . import lib as _lib
from .graph import Graph, Tensor, type_size
from .types import BF16, F16, F32, I32, I64, GGMLType

_FLOATS = (F32, F16, BF16)
# float → quantized copies need the CPU type's from_float (NULL for most IQ types)
_QUANTIZABLE = (GGMLType.Q4_0, GGMLType.Q4_1, GGMLType.Q5_0, GGMLType.Q5_1, GGMLType.Q8_0,
                GGMLType.Q2_K, GGMLType.Q3_K, GGMLType.Q4_K, GGMLType.Q5_K, GGMLType.Q6_K,
                GGMLType.IQ4_NL, GGMLType.IQ4_XS)
ROPE_MODES = {"normal": 0, "neox": 2}  # GGML_ROPE_TYPE_NORMAL: interleaved pairs; NEOX: halves
_SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)


def _graph(*ts: Tensor, graph: Graph | None = None) -> Graph:
    """The graph an op result belongs to: that of its first graph operand (or `graph`, for an
    op on persistent tensors only, such as a view of a KV cache)."""
    for t in ts:
        if t is not None and t.graph is not None:
            return t.graph
    if graph is None:
        raise ShapeError("an op needs at least one operand that belongs to a graph "
                         "(all operands are persistent tensors)")
    return graph


def _nbytes(t: Tensor) -> int:
    """ggml_nbytes from the cached ne/nb: the byte span of t's data."""
    size, block = type_size(t.type)
    ne, nb = t.ne, t.nb
    span = ne[0] * nb[0] // block if block > 1 else size + (ne[0] - 1) * nb[0]
    return span + (ne[1] - 1) * nb[1] + (ne[2] - 1) * nb[2] + (ne[3] - 1) * nb[3]


def _name(t: Tensor) -> str:
    return f"{list(t.ne)} {GGMLType(t.type).name}"


def _fail(op: str, msg: str, *ts: Tensor):
    raise ShapeError(f"{op}: {msg} (got " + ", ".join(_name(t) for t in ts) + ")")


def _rows_contiguous(op: str, x: Tensor) -> None:
    if x.nb[0] != type_size(x.type)[0]:
        _fail(op, "input must have contiguous elements along ne0", x)


def _need_type(op: str, x: Tensor, *types) -> None:
    if x.type not in types:
        _fail(op, "input type must be " + "/".join(GGMLType(t).name for t in types), x)


def _can_repeat(b: Tensor, a: Tensor) -> bool:
    (a0, a1, a2, a3), (b0, b1, b2, b3) = a.ne, b.ne
    return not (a0 % b0 or a1 % b1 or a2 % b2 or a3 % b3)


# -- elementwise -----------------------------------------------------------------------------------
def _binary(op: str, fn, a: Tensor, b: Tensor, commutative: bool) -> Tensor:
    if not _can_repeat(b, a):
        if commutative and _can_repeat(a, b):
            a, b = b, a
        else:
            _fail(op, "the second operand must broadcast onto the first (each ne divides)", a, b)
    _rows_contiguous(op, a)
    # the CPU kernels take (f32, f32), (f16, f16) and (f16, f32); the result has a's type
    if not (a.type == b.type == F32 or (a.type == F16 and b.type in (F16, F32))):
        _fail(op, "operands must be F32+F32, F16+F16 or F16+F32 (cast the other first)", a, b)
    g = _graph(a, b)
    return g.make(fn, a.ptr, b.ptr)


def add(a: Tensor, b: "Tensor | float") -> Tensor:
    """a + b, b broadcast over a. A Python number adds a constant."""
    if not isinstance(b, Tensor):
        return scale_bias(a, 1.0, float(b))
    return _binary("add", _lib.get().ggml_add, a, b, True)


def sub(a: Tensor, b: "Tensor | float") -> Tensor:
    if not isinstance(b, Tensor):
        return scale_bias(a, 1.0, -float(b))
    return _binary("sub", _lib.get().ggml_sub, a, b, False)


def mul(a: Tensor, b: "Tensor | float") -> Tensor:
    """a * b elementwise, b broadcast over a. A Python number scales."""
    if not isinstance(b, Tensor):
        return scale(a, float(b))
    return _binary("mul", _lib.get().ggml_mul, a, b, True)


def div(a: Tensor, b: Tensor) -> Tensor:
    return _binary("div", _lib.get().ggml_div, a, b, False)


def scale(x: Tensor, s: float) -> Tensor:
    """x · s."""
    return scale_bias(x, s, 0.0)


def scale_bias(x: Tensor, s: float, b: float) -> Tensor:
    """x · s + b."""
    _need_type("scale", x, F32)
    if not x.is_contiguous():
        _fail("scale", "input must be contiguous (ggml_is_padded_1d)", x)
    g = _graph(x)
    L = g.lib
    if b == 0.0:
        return g.make(L.ggml_scale, x.ptr, s)
    return g.make(L.ggml_scale_bias, x.ptr, s, b)


def _unary(op: str, fn, x: Tensor) -> Tensor:
    _need_type(op, x, F32, F16)
    _rows_contiguous(op, x)
    g = _graph(x)
    return g.make(fn, x.ptr)


def sqr(x): return _unary("sqr", _lib.get().ggml_sqr, x)          # noqa: E704
def sqrt(x): return _unary("sqrt", _lib.get().ggml_sqrt, x)       # noqa: E704
def sin(x): return _unary("sin", _lib.get().ggml_sin, x)          # noqa: E704
def tanh(x): return _unary("tanh", _lib.get().ggml_tanh, x)       # noqa: E704
def exp(x): return _unary("exp", _lib.get().ggml_exp, x)          # noqa: E704
def neg(x): return _unary("neg", _lib.get().ggml_neg, x)          # noqa: E704
def silu(x): return _unary("silu", _lib.get().ggml_silu, x)       # noqa: E704


def gelu_erf(x: Tensor) -> Tensor:
    """Exact GELU, 0.5·x·(1 + erf(x/√2)) (the codecs' nn.GELU()); ggml computes it in f32."""
    return _unary("gelu_erf", _lib.get().ggml_gelu_erf, x)


def gelu_tanh(x: Tensor, *, table: bool = False) -> Tensor:
    """GPT-2's gelu_new, 0.5·x·(1 + tanh(√(2/π)·(x + 0.044715·x³))).

    ggml's CPU `ggml_gelu` rounds its input to f16 and reads a table (~1e-3 relative error), so
    by default the formula is composed from exact f32 ops; `table=True` takes the fast table.
    """
    if table:
        return _unary("gelu", _lib.get().ggml_gelu, x)
    # 0.5·(1 + tanh u) = σ(2u), so gelu_new(x) = x·σ(2u) with u = c·x·p, p = 1 + 0.044715·x²;
    # and x·σ(2u) = silu(2u) / (2c·p): ggml's vectorized silu instead of a scalar tanhf per
    # element (21 % of a 100-row Nano prefill). p ≥ 1, so the division is always safe.
    c = _SQRT_2_OVER_PI
    p = scale_bias(sqr(x), 0.044715, 1.0)                  # 1 + 0.044715·x²
    z = mul(scale(p, 2.0 * c), x)                          # 2u
    return div(silu(z), scale(p, 2.0 * c))


def swiglu(gate: Tensor, up: Tensor) -> Tensor:
    """silu(gate) · up, fused."""
    if gate.ne != up.ne or gate.type != up.type:
        _fail("swiglu", "gate and up must have the same shape and type", gate, up)
    if not (gate.is_contiguous(1) and up.is_contiguous(1)):
        _fail("swiglu", "inputs must be contiguous beyond the row stride", gate, up)
    g = _graph(gate, up)
    return g.make(g.lib.ggml_swiglu_split, gate.ptr, up.ptr)


def clamp(x: Tensor, lo: float, hi: float) -> Tensor:
    _need_type("clamp", x, F32, F16)
    _rows_contiguous("clamp", x)
    g = _graph(x)
    return g.make(g.lib.ggml_clamp, x.ptr, lo, hi)


# -- normalization and reductions ----------------------------------------------------------------
def _norm(op: str, fn, x: Tensor, eps: float) -> Tensor:
    _need_type(op, x, F32)
    _rows_contiguous(op, x)
    g = _graph(x)
    return g.make(fn, x.ptr, float(eps))


def norm(x: Tensor, eps: float) -> Tensor:
    """(x − mean) / √(var + eps) over ne0 (no affine)."""
    return _norm("norm", _lib.get().ggml_norm, x, eps)


def rms_norm(x: Tensor, eps: float) -> Tensor:
    """x / √(mean(x²) + eps) over ne0 (no affine)."""
    return _norm("rms_norm", _lib.get().ggml_rms_norm, x, eps)


def l2_norm(x: Tensor, eps: float) -> Tensor:
    """x / max(‖x‖₂, eps) over ne0 (F.normalize)."""
    return _norm("l2_norm", _lib.get().ggml_l2_norm, x, eps)


def sum_rows(x: Tensor) -> Tensor:
    """[n, a, b, c] → [1, a, b, c]."""
    _need_type("sum_rows", x, F32)
    _rows_contiguous("sum_rows", x)
    g = _graph(x)
    return g.make(g.lib.ggml_sum_rows, x.ptr)


def argmax(x: Tensor) -> Tensor:
    """[n, rows] F32 → [rows] I32: index of the largest entry of each row."""
    _need_type("argmax", x, F32)
    _rows_contiguous("argmax", x)  # ggml only debug-asserts this and reads wrong rows otherwise
    if x.ne[2] != 1 or x.ne[3] != 1:
        _fail("argmax", "input must be a matrix [n, rows]", x)
    g = _graph(x)
    out = g.make(g.lib.ggml_argmax, x.ptr)
    g.bound_ids(out, x.ne[0])   # an index into a row of ne0 entries: in [0, ne0) by construction
    return out


def softmax(x: Tensor, mask: Tensor | None = None, scale: float = 1.0) -> Tensor:
    """softmax(x·scale + mask) over ne0. mask: F32/F16 [ne0, ≥ne1, ne2 | 1, ne3 | 1]."""
    _need_type("softmax", x, F32)
    if not x.is_contiguous():
        _fail("softmax", "input must be contiguous", x)
    if mask is not None:
        _need_type("softmax", mask, F32, F16)
        if not mask.is_contiguous() or mask.ne[0] != x.ne[0] or mask.ne[1] < x.ne[1] \
                or x.ne[2] % mask.ne[2] or x.ne[3] % mask.ne[3]:
            _fail("softmax", "mask must be contiguous [ne0, >=ne1, divisor, divisor]", x, mask)
    g = _graph(x, mask)
    return g.make(g.lib.ggml_soft_max_ext, x.ptr, mask.ptr if mask is not None else None,
                  float(scale), 0.0)


# -- matrix products, lookups, rope, attention -----------------------------------------------------
def mul_mat(a: Tensor, b: Tensor) -> Tensor:
    """ggml_mul_mat: a [K, N, h, r] (weights, any type), b [K, M, h·i, r·j] F32 → [N, M, ...] F32.

    Row m of the result is a·b[m] — numpy `b @ a.T` — so a PyTorch Linear weight (out, in)
    is used as `a` unchanged.

    In a `rowwise` graph (a decode step) each row's product is the same whatever rows go with
    it: ggml picks its kernel by the row count, so a one-row product is taken as a pair, or
    from some count each row is multiplied on its own, as this backend's kernels need
    (rowwise.py probes them).
    """
    if a.ne[0] != b.ne[0] or b.ne[2] % a.ne[2] or b.ne[3] % a.ne[3]:
        _fail("mul_mat", "need a.ne0 == b.ne0 and a's batch axes dividing b's", a, b)
    if a.nb[0] > a.nb[1]:
        _fail("mul_mat", "a must not be transposed (make it contiguous)", a)
    if b.type != F32:
        _fail("mul_mat", "b must be F32", a, b)
    if a.nb[0] != type_size(a.type)[0] or b.nb[0] != 4:
        _fail("mul_mat", "operands need contiguous rows", a, b)
    g = _graph(a, b)
    if g.rowwise and b.ne[2] == b.ne[3] == 1 and a.ne[2] == a.ne[3] == 1:
        return _rowwise_mul_mat(g, a, b)
    return g.make(g.lib.ggml_mul_mat, a.ptr, b.ptr)


def _rowwise_mul_mat(g: Graph, a: Tensor, b: Tensor) -> Tensor:
    from .repack import PACKED
    from .rowwise import plan

    rows, how = b.ne[1], plan(g.backend, a.type, a.ptr in PACKED)
    if how.pair and rows == 1:       # the row twice: the kernel every count of 2+ takes
        y = g.make(g.lib.ggml_mul_mat, a.ptr, concat(b, b, 1).ptr)   # [N, 2]
        return view(y, (a.ne[1], 1))
    if how.alone_from is not None and rows >= how.alone_from:
        # [K, M] → [K, 1, M] (each row a matrix of its own, a broadcast over them) → [N, 1, M]
        b = view(b, (b.ne[0], 1, rows), (b.nb[1], b.nb[1]))
        return reshape(g.make(g.lib.ggml_mul_mat, a.ptr, b.ptr), a.ne[1], rows)
    return g.make(g.lib.ggml_mul_mat, a.ptr, b.ptr)


def get_rows(table: Tensor, ids: Tensor) -> Tensor:
    """Gather rows: table [D, V, h, r], ids I32 [n, h, r] → [D, n, h, r] F32."""
    if ids.type != I32:
        _fail("get_rows", "ids must be I32", table, ids)
    if table.ne[2] != ids.ne[1] or table.ne[3] != ids.ne[2] or ids.ne[3] != 1:
        _fail("get_rows", "ids [n, h, r] must match table [D, V, h, r]", table, ids)
    g = _graph(table, ids)
    g.limit_index(ids, table.ne[1])
    return g.make(g.lib.ggml_get_rows, table.ptr, ids.ptr)


def rope(x: Tensor, positions: Tensor, *, n_dims: int | None = None, mode: str = "normal",
         base: float = 10000.0, freq_scale: float = 1.0) -> Tensor:
    """Rotary embedding of x [Dh, H, T, 1] at I32 positions [T]; the first n_dims (default Dh)
    dims rotate, the rest pass through. mode "normal": pairs (2i, 2i+1); "neox": (i, i+n/2)."""
    if mode not in ROPE_MODES:
        raise ShapeError(f"rope: mode must be one of {sorted(ROPE_MODES)}, got {mode!r}")
    n_dims = x.ne[0] if n_dims is None else int(n_dims)
    _need_type("rope", x, F32, F16)
    _rows_contiguous("rope", x)
    if positions.type != I32 or positions.ne[1:] != (1, 1, 1) or positions.ne[0] != x.ne[2]:
        _fail("rope", "positions must be an I32 vector of length ne2 (T)", x, positions)
    if n_dims <= 0 or n_dims % 2 or n_dims > x.ne[0]:
        _fail("rope", f"n_dims={n_dims} must be even and at most ne0", x)
    g = _graph(x, positions)
    # ext_factor 0 turns YaRN off; attn_factor 1, beta_fast 32 and beta_slow 1 are then unused
    return g.make(g.lib.ggml_rope_ext, x.ptr, positions.ptr, None, n_dims, ROPE_MODES[mode], 0,
                  float(base), float(freq_scale), 0.0, 1.0, 32.0, 1.0)


def flash_attn(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, scale: float) -> Tensor:
    """Fused attention. q [Dh, Tq, Hq, 1], k [Dh, Tk, Hkv, 1], v [Dv, Tk, Hkv, 1] (not
    transposed), mask F16 [Tk, ≥Tq, 1, 1] additive → [Dv, Hq, Tq, 1] (note: heads before time)."""
    if q.ne[0] != k.ne[0] or k.ne[1] != v.ne[1] or k.ne[2] != v.ne[2] or q.ne[2] % k.ne[2] \
            or q.ne[3] != k.ne[3] or q.ne[3] != v.ne[3]:
        _fail("flash_attn", "need q/k head dims equal, k/v lengths and heads equal, Hq % Hkv == 0",
              q, k, v)
    _need_type("flash_attn", q, F32)
    for t in (q, k, v):
        _rows_contiguous("flash_attn", t)
    if mask is not None:
        if mask.type != F16 or not mask.is_contiguous() or mask.ne[0] != k.ne[1] \
                or mask.ne[1] < q.ne[1] or q.ne[2] % mask.ne[2] or q.ne[3] % mask.ne[3]:
            _fail("flash_attn", "mask must be contiguous F16 [Tk, >=Tq, ...]", q, k, mask)
    g = _graph(q, k, v, mask)
    return g.make(g.lib.ggml_flash_attn_ext, q.ptr, k.ptr, v.ptr,
                  mask.ptr if mask is not None else None, float(scale), 0.0, 0.0)


# -- copies, casts, layout ---------------------------------------------------------------------------
def _check_copy(op: str, src: Tensor, dst: Tensor | None, dst_type: int) -> None:
    """What ggml's CPU copy kernels (dup/cpy/cont/cast) take; anything else aborts there.
    dst None: a new contiguous tensor of src's shape (cast, cont)."""
    (s_size, s_block), (d_size, d_block) = type_size(src.type), type_size(dst_type)
    dst_contiguous = dst is None or dst.is_contiguous()
    if src.type == dst_type:
        # quantized blocks move whole: either both sides are packed, or row by row over the
        # same shape with packed rows (ggml's other paths step by element and misread blocks)
        packed = src.is_contiguous() and dst_contiguous
        by_rows = src.nb[0] == s_size and (dst is None or (dst.ne == src.ne and dst.nb[0] == d_size))
        if s_block > 1 and not (packed or by_rows):
            _fail(op, "a quantized copy needs packed rows of the same shape", src)
        return
    if src.type in _FLOATS and (dst_type in _FLOATS or (src.type, dst_type) == (F32, I32)):
        return
    if (src.type, dst_type) == (I32, F32):
        return
    if src.type in _FLOATS and dst_type in _QUANTIZABLE:
        if not dst_contiguous or src.nb[0] != s_size or src.ne[0] % d_block:
            _fail(op, f"quantizing to {GGMLType(dst_type).name} needs packed source rows whose "
                  f"length is a multiple of {d_block} and a contiguous destination", src)
        return
    if s_block > 1 and dst_type == F32:
        if dst is not None and (dst.nb[0] != d_size or (not dst_contiguous and dst.ne[0] % s_block)):
            _fail(op, "dequantizing needs destination rows of whole blocks", src, dst)
        return
    _fail(op, f"ggml cannot copy {GGMLType(src.type).name} to {GGMLType(dst_type).name}", src)


def cpy(src: Tensor, dst: Tensor) -> Tensor:
    """Copy src into dst (converting type); a write into a persistent tensor (a KV-cache view)
    is registered as a graph effect so it runs before any output."""
    if src.n_elements != dst.n_elements:
        _fail("cpy", "element counts differ", src, dst)
    _check_copy("cpy", src, dst, dst.type)
    g = _graph(src, dst)
    out = g.make(g.lib.ggml_cpy, src.ptr, dst.ptr)
    if dst.graph is None or _lib.ggml_tensor.from_address(dst.ptr).view_src:
        g.add_effect(out)
    return out


def set_rows(dst: Tensor, src: Tensor, rows: Tensor) -> Tensor:
    """dst[rows[i]] = src[i] along ne1: dst [D, N, h, r], src F32 [D, n, h, r], rows I32/I64 [n].
    Lets a fixed-shape decode graph write its KV row at a position given as an input."""
    if dst.ne[0] != src.ne[0] or dst.ne[2] != src.ne[2] or dst.ne[3] != src.ne[3] \
            or src.ne[1] != rows.ne[0] or rows.ne[1:] != (1, 1, 1):
        _fail("set_rows", "need dst [D, N, h, r], src [D, n, h, r], rows [n]", dst, src, rows)
    if src.type not in (F32, F16) or rows.type not in (I32, I64):
        _fail("set_rows", "src must be F32/F16 and rows I32/I64", src, rows)
    # rows are converted with the dst type's from_float, which many types lack (NULL: a crash)
    if dst.type not in _FLOATS + (I32,) + _QUANTIZABLE or dst.ne[0] % type_size(dst.type)[1]:
        _fail("set_rows", "dst must be F32/F16/BF16/I32 or a quantizable type, in whole blocks",
              dst)
    for t in (dst, src):  # ggml_is_contiguous_rows: each row's elements packed
        if t.ne[0] != 1 and t.nb[0] != type_size(t.type)[0]:
            _fail("set_rows", "dst and src rows must be contiguous along ne0", dst, src)
    g = _graph(dst, src, rows)
    g.limit_index(rows, dst.ne[1])
    out = g.make(g.lib.ggml_set_rows, dst.ptr, src.ptr, rows.ptr)
    if dst.graph is None or _lib.ggml_tensor.from_address(dst.ptr).view_src:
        g.add_effect(out)
    return out


def cast(x: Tensor, type_: GGMLType) -> Tensor:
    """x converted to `type_` (a new contiguous tensor of the same shape)."""
    _check_copy("cast", x, None, int(type_))
    g = _graph(x)
    return g.make(g.lib.ggml_cast, x.ptr, int(type_))


def cont(x: Tensor) -> Tensor:
    """x laid out contiguously (same shape and type)."""
    _check_copy("cont", x, None, x.type)
    g = _graph(x)
    out = g.make(g.lib.ggml_cont, x.ptr)
    if x.type in (I32, I64):
        g.copied_ids(out, x)   # so an index guard on the copy checks x's values
    return out


def reshape(x: Tensor, *ne: int) -> Tensor:
    """Same data, new ggml shape (1-4 axes, fastest first); x must be contiguous."""
    if not 1 <= len(ne) <= 4:
        _fail("reshape", f"cannot reshape to {list(ne)}", x)
    n0, n1, n2, n3 = ne + (1,) * (4 - len(ne))
    a, b, c, d = x.ne
    if n0 * n1 * n2 * n3 != a * b * c * d:
        _fail("reshape", f"cannot reshape to {list(ne)}", x)
    if not x.is_contiguous():
        _fail("reshape", "input must be contiguous (cont() it first)", x)
    g = _graph(x)
    return g.make(g.lib.ggml_reshape_4d, x.ptr, n0, n1, n2, n3)


def view(x: Tensor, ne, nb=None, offset: int = 0, *, graph: Graph | None = None) -> Tensor:
    """A strided window on x: ne (1-4 axes), byte strides nb[1..] (default: x's own), byte
    offset. Bounds are checked against x's data."""
    n0, n1, n2, n3 = ne4 = tuple(ne) + (1,) * (4 - len(ne))
    size, block = type_size(x.type)
    row = size * n0 // block
    if nb is None:
        s1, s2, s3 = x.nb[1:]
    else:  # missing strides pack the axes after the given ones
        k = len(nb)
        s1 = nb[0] if k > 0 else row
        s2 = nb[1] if k > 1 else s1 * n1
        s3 = nb[2] if k > 2 else s2 * n2
    last = offset + row + (n1 - 1) * s1 + (n2 - 1) * s2 + (n3 - 1) * s3
    if offset < 0 or min(ne4) < 1 or last > _nbytes(x):
        _fail("view", f"view ne={list(ne4)} nb={[s1, s2, s3]} offset={offset} is out of bounds", x)
    # ggml also asserts (an abort) that the view's packed size from its offset fits the source,
    # which a view of overlapping windows (smaller strides than its rows) can break
    if offset + row * n1 * n2 * n3 > _nbytes(x):
        _fail("view", f"view ne={list(ne4)} offset={offset} packs {row * n1 * n2 * n3} bytes, "
              f"more than the source's {_nbytes(x) - offset} from there (ggml requires it even "
              "for overlapping windows)", x)
    g = _graph(x, graph=graph)
    return g.make(g.lib.ggml_view_4d, x.ptr, *ne4, s1, s2, s3, offset)


# every permutation of the first 1-4 axes, completed with the trailing axes that stay put
_PERMUTATIONS = {p: p + tuple(range(len(p), 4)) for n in (1, 2, 3, 4)
                 for p in itertools.permutations(range(n))}


def permute(x: Tensor, *axes: int) -> Tensor:
    """ggml_permute: source axis i moves to position axes[i] (missing trailing axes stay)."""
    ax = _PERMUTATIONS.get(axes)
    if ax is None:
        _fail("permute", f"axes {list(axes)} are not a permutation of 0..3", x)
    g = _graph(x)
    return g.make(g.lib.ggml_permute, x.ptr, *ax)


def transpose(x: Tensor) -> Tensor:
    g = _graph(x)
    return g.make(g.lib.ggml_transpose, x.ptr)


def concat(a: Tensor, b: Tensor, dim: int) -> Tensor:
    """Join along ggml axis `dim`; all other axes must match."""
    if a.type != b.type or not 0 <= dim < 4 or any(
            a.ne[d] != b.ne[d] for d in range(4) if d != dim):
        _fail("concat", f"cannot concatenate along axis {dim}", a, b)
    g = _graph(a, b)
    return g.make(g.lib.ggml_concat, a.ptr, b.ptr, dim)


def pad(x: Tensor, *pads: tuple[int, int]) -> Tensor:
    """Zero-pad: pads[i] = (before, after) for ggml axis i."""
    p = [(int(a), int(b)) for a, b in pads] + [(0, 0)] * (4 - len(pads))
    if len(pads) > 4 or any(a < 0 or b < 0 for a, b in p):
        _fail("pad", f"pads {pads} must be (before, after) >= 0 for at most 4 axes", x)
    _need_type("pad", x, F32)
    g = _graph(x)
    return g.make(g.lib.ggml_pad_ext, x.ptr, *[v for pair in p for v in pair])


def name(x: Tensor, label: str) -> Tensor:
    """Label a node `<stage>.<layer>.<what>` so debug tools can find it (style C17)."""
    _lib.get().ggml_set_name(x.ptr, label.encode())
    return x
