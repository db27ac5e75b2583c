"""ggml's CPU repacked weights (the CPU backend's "extra buffer type" CPU_REPACK).

A quantized matrix uploaded into a CPU_REPACK buffer is rewritten into row-interleaved blocks
(ggml 0.25.3 on x86: q4_0, q4_K and iq4_nl → 8x8 with AVX2, q2_K → 8x8 with AVX-512; ARM
has more), and mul_mat on it runs kernels that multiply 4 activation rows by
8 weight rows at once. Rules taken from ggml-cpu/repack.cpp, which this module enforces:

- ggml decides per tensor (type, CPU features, rows a multiple of 4/8/16) and aborts the process
  when asked to repack a tensor it cannot: `Packer.eligible` asks ggml first, with a probe
  tensor of the same type and row remainder.
- a repacked tensor may only be src0 of a mul_mat with F32 src1; any other op (get_rows, a view,
  a copy) would read the interleaved bytes as the plain type — silently wrong numbers.
  `check_graph` refuses such a graph when it is built.
- the buffer has no get_tensor: a repacked weight is read back from the file (weights.py).
- only CPU_REPACK is used, never the AMX buffer type (wrong f32 results and SIGILL on q8_0 on
  one host: shared/perf-notes.md).
"""

from __future__ import annotations

import ctypes
import os

import numpy as np

from ..errors import BackendError, InputError, ShapeError
from . import lib as _lib
from .backend import Backend, Buffer
from .types import GGMLType

REPACK_ENV = "MOSS_TTS_REPACK"
CPU_REPACK = "CPU_REPACK"
_OFF, _ON = ("0", "off", "false", "no"), ("1", "on", "true", "yes")
_get_extra_bufts_t = ctypes.CFUNCTYPE(ctypes.POINTER(ctypes.c_void_p), ctypes.c_void_p)
_SRC = _lib.ggml_tensor.src.offset
_SRCS = ctypes.c_void_p * _lib.GGML_MAX_SRC
# Pointers of the live repacked weight tensors (added by Weights, removed when they close).
PACKED: dict[int, str] = {}


# Types repacked by default: those measured faster than the plain kernels (bench/matmul.py,
# docs/performance.md "Repacked weights"). q4_K is not among them: on an AVX-512 VNNI Xeon its
# repacked kernels were 0.95x at 1 row and 0.72x at 64 rows (1.8x only at 4); MOSS_TTS_REPACK=all
# repacks it (and whatever else ggml repacks) anyway.
DEFAULT_TYPES = frozenset({GGMLType.Q4_0, GGMLType.IQ4_NL})
ALL_TYPES = frozenset(GGMLType)


def types(flag: bool | None = None) -> frozenset | None:
    """The weight types to repack, or None for none: `flag` False turns it off, else the
    MOSS_TTS_REPACK environment variable: 0 off, 1 (default) DEFAULT_TYPES, all ALL_TYPES."""
    value = os.environ.get(REPACK_ENV, "1").strip().lower()
    if value not in _OFF + _ON + ("all",):
        raise InputError(f"{REPACK_ENV}={value!r} is not understood — set it to 1 (repack the "
                         "types measured faster), all (every type ggml repacks) or 0 (none)")
    if flag is False or (flag is None and value in _OFF):
        return None
    return ALL_TYPES if value == "all" else DEFAULT_TYPES


def extra_buffer_types(backend: Backend) -> dict[str, int]:
    """Name → handle of the extra buffer types the backend's device offers (empty if none)."""
    L = backend.lib
    dev = L.ggml_backend_get_device(backend.ptr)
    addr = L.ggml_backend_reg_get_proc_address(L.ggml_backend_dev_backend_reg(dev),
                                               b"ggml_backend_dev_get_extra_bufts")
    if not addr:
        return {}
    array = _get_extra_bufts_t(addr)(dev)
    out, i = {}, 0
    while array and array[i]:   # NULL-terminated
        out[L.ggml_backend_buft_name(array[i]).decode()] = array[i]
        i += 1
    return out


class Packer:
    """Places eligible weights into one CPU_REPACK buffer (or none: `available` is False)."""

    def __init__(self, backend: Backend):
        self.lib = backend.lib
        self.buft = extra_buffer_types(backend).get(CPU_REPACK) \
            if backend.is_cpu and backend.is_host else None
        self._probed: dict[tuple[int, int], bool] = {}

    @property
    def available(self) -> bool:
        return self.buft is not None

    def eligible(self, type_: int, ne: tuple) -> bool:
        """Would ggml repack a 2-D tensor of this type and shape on this host?"""
        if self.buft is None or ne[2] != 1 or ne[3] != 1 or ne[1] < 2 or ne[0] % 8:
            return False
        # ggml's choice depends on the type, the CPU and ne1 modulo 4, 8 or 16 (repack.cpp)
        key = (int(type_), 16 + ne[1] % 16)
        if key not in self._probed:
            self._probed[key] = self._probe(*key)
        return self._probed[key]

    def _probe(self, type_: int, rows: int) -> bool:
        L = self.lib
        ctx = L.ggml_init(_lib.ggml_init_params(2 * L.ggml_tensor_overhead(), None, True))
        buf = None
        try:
            ne = (ctypes.c_int64 * 2)(L.ggml_blck_size(type_), rows)
            t = L.ggml_new_tensor(ctx, type_, 2, ne)
            buf = Buffer(L, L.ggml_backend_buft_alloc_buffer(self.buft, L.ggml_nbytes(t) + 64))
            if L.ggml_backend_tensor_alloc(buf.ptr, t, L.ggml_backend_buffer_get_base(buf.ptr)):
                return False
            return bool(_lib.ggml_tensor.from_address(t).extra)   # the chosen kernel, or NULL
        finally:
            if buf is not None:
                buf.close()
            L.ggml_free(ctx)

    def upload(self, tensors: list[tuple[str, int, int, int]]) -> Buffer:
        """One buffer holding (name, tensor ptr, source address, nbytes) repacked by ggml."""
        L = self.lib
        align = L.ggml_backend_buft_get_alignment(self.buft)
        padded = [-(-n // align) * align for _, _, _, n in tensors]
        buf = Buffer(L, L.ggml_backend_buft_alloc_buffer(self.buft, sum(padded)), usage=1)
        try:
            at = L.ggml_backend_buffer_get_base(buf.ptr)
            for (name, ptr, src, n), size in zip(tensors, padded):
                if L.ggml_backend_tensor_alloc(buf.ptr, ptr, at) != 0 or \
                        not _lib.ggml_tensor.from_address(ptr).extra:
                    raise BackendError(f"ggml refused to repack weight {name!r} — load with "
                                       f"repack off ({REPACK_ENV}=0)")
                L.ggml_backend_tensor_set(ptr, src, 0, n)   # repacks while copying
                at += size
        except BaseException:
            buf.close()
            raise
        return buf


def check_graph(lib, cgraph, graph_name: str, memories=None) -> None:
    """Refuse a graph that reads a repacked weight other than as a mul_mat's weight operand.
    `memories`: the numpy arrays holding the graph's tensor structs; when no 8-byte word in
    them is a repacked tensor's address, no node can read one and the walk is skipped."""
    if not PACKED or (memories is not None and not _mentions_packed(memories)):
        return
    for i in range(lib.ggml_graph_n_nodes(cgraph)):
        node = lib.ggml_graph_node(cgraph, i)
        srcs = _SRCS.from_address(node + _SRC)
        for j, src in enumerate(srcs):
            if src in PACKED and (j != 0 or lib.ggml_op_desc(node) != b"MUL_MAT"):
                raise ShapeError(
                    f"graph {graph_name!r}: repacked weight {PACKED[src]!r} is read by "
                    f"{lib.ggml_op_desc(node).decode()}, but only mul_mat can read a repacked "
                    f"weight — leave that tensor out of the model's repack set, or set "
                    f"{REPACK_ENV}=0")


def _mentions_packed(memories) -> bool:
    """Does any aligned word of these buffers equal a repacked tensor's address? A superset of
    the nodes' sources at numpy speed (the walk costs a few µs per node in Python)."""
    wanted = np.fromiter(PACKED, dtype=np.uint64, count=len(PACKED))
    lo, hi = wanted.min(), wanted.max()
    for mem in memories:
        lead = -mem.ctypes.data % 8
        words = mem[lead:lead + (mem.size - lead) // 8 * 8].view(np.uint64)
        near = words[(words >= lo) & (words <= hi)]
        if near.size and np.isin(near, wanted).any():
            return True
    return False
