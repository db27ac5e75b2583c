"""How ggml's mul_mat of a weight type sums one activation row's product as the number of rows
multiplied at once changes — probed once per (backend, type, repacked) on the kernels this
process runs — so that in a `rowwise` graph (a decode step, Graph.rowwise) each row's product
is the same whatever rows go with it, and a stream in a step of several computes what it
computes alone, bit for bit (issue 31; ops.mul_mat applies the plan).

ggml's CPU backend picks its kernel by the row count: one row goes through vec_dot; two or
more through llamafile's tiled GEMM where it has one (f32, f16, bf16, iq4_nl: the same sums for
any count of two or more, in another order than vec_dot's, ~1e-6 apart), and the K-quants from
8 rows, repacked q4_K and q2_K from 4, through yet other kernels. What holds where is the
kernels' business and differs by CPU, so it is measured, not listed: random weights times 1 to
PROBE_ROWS rows, each row's product compared with its product alone and in a pair.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass

import numpy as np

from . import lib as _lib
from .backend import Backend, Buffer
from .types import F32

K, N = 512, 64       # a K-quant block's multiple; rows a multiple of 16, as repacking wants
PROBE_ROWS = 9       # past 8, where the K-quants change kernel


@dataclass(frozen=True)
class RowPlan:
    """`pair`: a one-row product is taken as a pair (the row twice), since from two rows on
    every count sums alike (and the tiled kernel is also the faster: docs/performance.md);
    `alone_from`: from this many rows each row is multiplied on its own ([K, 1, M], each weight
    block still read once for all), since up to one fewer they sum as one row does (None:
    never needed)."""

    pair: bool = False
    alone_from: int | None = None


_plans: dict[tuple, RowPlan] = {}


def plan(backend: Backend, type_: int, packed: bool) -> RowPlan:
    """The RowPlan of weights of `type_` (repacked into CPU_REPACK or not) on `backend`."""
    key = (backend.name, int(type_), packed)
    if key not in _plans:
        _plans[key] = _probe(backend, int(type_), packed)
    return _plans[key]


def _probe(backend: Backend, type_: int, packed: bool) -> RowPlan:
    from .graph import Graph, Tensor
    from .ops import mul_mat
    from .quant import quantize

    rng = np.random.default_rng(0)
    x = rng.standard_normal((PROBE_ROWS, K)).astype(np.float32)
    with _weight(backend, type_, packed, quantize(rng.standard_normal((N, K)) / 20, type_)) \
            as (ptr, owner):
        weight = Tensor.from_ptr(ptr, None, owner)

        def product(rows: np.ndarray) -> np.ndarray:
            with Graph(backend, name="rowwise-probe") as g:
                g.output(mul_mat(weight, g.input("x", rows.shape, F32)), "y", ndim=2)
                return g.run({"x": rows})["y"]

        alone = np.concatenate([product(x[j:j + 1]) for j in range(PROBE_ROWS)])
        paired = np.stack([product(x[[j, j]])[0] for j in range(PROBE_ROWS)])
        counts = {n: product(x[:n]) for n in range(2, PROBE_ROWS + 1)}
    if all(np.array_equal(y, alone[:n]) for n, y in counts.items()):
        return RowPlan()
    if all(np.array_equal(y, paired[:n]) for n, y in counts.items()):
        return RowPlan(pair=True)
    return RowPlan(alone_from=min(n for n, y in counts.items()
                                  if not np.array_equal(y, alone[:n])))


class _weight:
    """A probe weight [K, N] of `type_` holding `data` (its bytes), in the backend's own
    buffer or repacked into CPU_REPACK; → (tensor pointer, its owning buffer)."""

    def __init__(self, backend: Backend, type_: int, packed: bool, data: np.ndarray):
        self.backend, self.type, self.packed = backend, type_, packed
        self.data = np.ascontiguousarray(data)

    def __enter__(self):
        L = self.backend.lib
        self.ctx = L.ggml_init(_lib.ggml_init_params(2 * L.ggml_tensor_overhead(), None, True))
        self.buffer = None
        ne = (ctypes.c_int64 * 2)(K, N)
        ptr = L.ggml_new_tensor(self.ctx, self.type, 2, ne)
        if self.packed:
            from .repack import Packer

            self.buffer = Packer(self.backend).upload(
                [("rowwise-probe", ptr, self.data.ctypes.data, self.data.nbytes)])
        else:
            self.buffer = Buffer(L, L.ggml_backend_alloc_ctx_tensors(self.ctx, self.backend.ptr))
            L.ggml_backend_tensor_set(ptr, self.data.ctypes.data, 0, self.data.nbytes)
        return ptr, self.buffer

    def __exit__(self, *exc):
        if self.buffer is not None:
            self.buffer.close()
        self.backend.lib.ggml_free(self.ctx)
