"""Arithmetic work of a built graph, for benchmarks that report a compute-bound stage as GFLOP/s
against the host's measured GEMM peak (issue 13): what ggml was asked to multiply, read off the
graph's own nodes, so the count follows the model code instead of a formula kept beside it.

Counted: MUL_MAT (2·K per output element, broadcast batches included) and FLASH_ATTN_EXT
(2·Dk + 2·Dv per query row, key and head: q·kᵀ and p·v over every key slot it is given, masked
ones included — ggml's CPU kernel skips only whole 64 × 64 tiles that the mask hides). Everything
else (norms, activations, softmax, copies) is a few flops per element and left out, as GEMM
benchmarks do.
"""

from __future__ import annotations

import threading
from contextlib import contextmanager
from dataclasses import dataclass

from . import lib as _lib

_COUNTED = {b"MUL_MAT": "mul_mat", b"FLASH_ATTN_EXT": "flash_attn"}


@dataclass
class Work:
    """Flops by kind; `runs` counts graph computes (a counter's total over a stretch of code)."""

    mul_mat: int = 0
    flash_attn: int = 0
    runs: int = 0

    @property
    def total(self) -> int:
        return self.mul_mat + self.flash_attn

    def add(self, other: "Work") -> None:
        self.mul_mat += other.mul_mat
        self.flash_attn += other.flash_attn
        self.runs += other.runs

    def gflop(self) -> dict[str, float]:
        return {"mul_mat": self.mul_mat / 1e9, "flash_attn": self.flash_attn / 1e9,
                "total": self.total / 1e9}


def _ne(ptr: int) -> tuple[int, int, int, int]:
    return tuple(_lib.ggml_tensor.from_address(ptr).ne)


def graph_work(lib, cgraph) -> Work:
    """The flops one compute of `cgraph` asks for (see the module docstring)."""
    w = Work(runs=1)
    for i in range(lib.ggml_graph_n_nodes(cgraph)):
        node = lib.ggml_graph_node(cgraph, i)
        kind = _COUNTED.get(lib.ggml_op_desc(node))
        if kind is None:
            continue
        t = _lib.ggml_tensor.from_address(node)
        if kind == "mul_mat":     # dst [N, M, b2, b3] = src0 [K, N, ...] × src1 [K, M, b2, b3]
            k = _ne(t.src[0])[0]
            n = t.ne[0] * t.ne[1] * t.ne[2] * t.ne[3]
            w.mul_mat += 2 * k * n
        else:                     # q [Dk, Tq, H, B], k [Dk, Tk, Hk, B], v [Dv, Tk, Hk, B]
            dk, tq, h, b = _ne(t.src[0])
            tk = _ne(t.src[1])[1]
            dv = _ne(t.src[2])[0]
            w.flash_attn += 2 * (dk + dv) * tq * h * b * tk
    return w


_counters: list[Work] = []
_lock = threading.Lock()


def counting() -> bool:
    return bool(_counters)


def record(work: Work) -> None:
    with _lock:
        for c in _counters:
            c.add(work)


@contextmanager
def count_flops():
    """Sum the work of every graph computed (in any thread) inside the block:
    `with count_flops() as w: codec.encode(x)` → w.total flops, w.runs computes."""
    w = Work()
    with _lock:
        _counters.append(w)
    try:
        yield w
    finally:
        with _lock:
            _counters.remove(w)
