"""Tensor handles and the Graph lifecycle: build → mark inputs/outputs → allocate → write
inputs → compute → read outputs (design §2). Op functions live in `ops.py`.

Shapes: `Tensor.ne` is ggml order (fastest axis first, always 4 long); `Tensor.shape` is the
numpy order of the same data, `(T, D)` ↔ `ne = [D, T, 1, 1]` (style C13).
"""

from __future__ import annotations

import ctypes
import logging
import struct
from typing import NamedTuple

import numpy as np

from ..errors import BackendError, InputError, ShapeError
from . import lib as _lib
from .backend import Allocator, Backend, NativeResource, get_backend
from .repack import check_graph
from .sched import Scheduler, allocator_for
from .types import F32, GGMLType, numpy_dtype
from . import work as _work

logger = logging.getLogger(__name__)

# type, buffer, ne[4], nb[4] are the struct's first 80 bytes: one read gives all three we cache.
assert (_lib.ggml_tensor.ne.offset, _lib.ggml_tensor.nb.offset) == (16, 48)
_HEAD = ctypes.c_int64 * 10
# The same head unpacked straight from a graph context's own memory (a numpy buffer we hand to
# ggml_init), which is several times cheaper than a ctypes read per op.
_HEAD_STRUCT = struct.Struct("<i4xQ4q4q")
_type_sizes: dict[int, tuple[int, int]] = {}


def type_size(t: int) -> tuple[int, int]:
    """(bytes per block, elements per block) of a ggml type."""
    got = _type_sizes.get(t)
    if got is None:
        L = _lib.get()
        got = _type_sizes[t] = (L.ggml_type_size(t), L.ggml_blck_size(t))
    return got
_TENSORS_PER_CONTEXT = 2048


class Tensor:
    """A handle on a `ggml_tensor*`: pointer, cached `ne`, type, owning graph (None = persistent)."""

    __slots__ = ("ptr", "ne", "nb", "type", "graph", "owner")

    def __init__(self, ptr: int, ne: tuple, nb: tuple, type_: int, graph: "Graph | None"):
        self.ptr = ptr
        self.ne = ne      # element counts, ggml order
        self.nb = nb      # byte strides, read from the struct (views set their own)
        self.type = type_
        self.graph = graph

    @classmethod
    def from_ptr(cls, ptr: int, graph: "Graph | None", owner=None) -> "Tensor":
        """Wrap any tensor; `owner` (the Weights or KVCache holding a persistent tensor's
        memory) is kept alive as long as the handle is."""
        if not ptr:
            raise BackendError("ggml returned a NULL tensor (context out of memory?)")
        v = tuple(_HEAD.from_address(ptr))
        # enum ggml_type is the low 4 bytes of the first word (the rest is padding)
        t = cls(ptr, v[2:6], v[6:10], v[0] & 0xFFFFFFFF, graph)
        t.owner = owner
        return t

    @property
    def shape(self) -> tuple:
        """numpy order, with trailing size-1 ggml axes dropped (at least one axis)."""
        ne = self.ne
        n = 4
        while n > 1 and ne[n - 1] == 1:
            n -= 1
        return tuple(reversed(ne[:n]))

    @property
    def n_elements(self) -> int:
        a, b, c, d = self.ne
        return a * b * c * d

    @property
    def name(self) -> str:
        return _lib.ggml_tensor.from_address(self.ptr).name.decode()

    @property
    def on_host(self) -> bool:
        """Is this tensor's memory the host's (a CPU buffer)? False on a GPU or an RPC server,
        and for a tensor that has no memory yet."""
        buffer = _lib.ggml_tensor.from_address(self.ptr).buffer
        return bool(buffer) and bool(_lib.get().ggml_backend_buffer_is_host(buffer))

    def is_contiguous(self, n: int = 0) -> bool:
        """ggml_is_contiguous_n from the cached ne/nb (no C call): packed, except that axes
        1..n may have padded strides (n=1: rows contiguous, row stride free)."""
        size, block = type_size(self.type)
        ne, nb = self.ne, self.nb
        if ne[0] != block and nb[0] != size:
            return False
        expect = size * (ne[0] // block)
        for i in (1, 2, 3):
            if ne[i] != 1:
                if i > n:
                    if nb[i] != expect:
                        return False
                    expect *= ne[i]
                else:
                    expect = ne[i] * nb[i]
        return True

    def __bool__(self):
        raise TypeError("a graph Tensor has no truth value (it is not computed yet)")

    def __repr__(self):
        return f"Tensor({self.name or '?'} ne={list(self.ne)} {GGMLType(self.type).name})"

    # elementwise operators with ggml broadcasting (C12); `@` is deliberately not defined
    def __add__(self, other):
        from .ops import add
        return add(self, other)

    def __sub__(self, other):
        from .ops import sub
        return sub(self, other)

    def __mul__(self, other):
        from .ops import mul
        return mul(self, other)

    # movement ops
    def reshape(self, *ne):
        from .ops import reshape
        return reshape(self, *ne)

    def view(self, ne, nb=None, offset=0):
        from .ops import view
        return view(self, ne, nb, offset)

    def permute(self, *axes):
        from .ops import permute
        return permute(self, *axes)

    def transpose(self):
        from .ops import transpose
        return transpose(self)

    def cont(self):
        from .ops import cont
        return cont(self)


class Graph(NativeResource):
    """One compute graph and its metadata contexts.

    Build it with op functions over its inputs, `output()` what you need, then `run()` as often
    as you like: a graph whose shapes do not change is built once and replayed (design §3).
    `reset()` empties it for a rebuild (the contexts and the allocator are reused).
    """

    def __init__(self, backend: "Backend | str | None" = None, *, name: str = "graph",
                 allocator: "Allocator | Scheduler | None" = None, rowwise: bool = False):
        self.backend = get_backend(backend)
        self.lib = self.backend.lib
        self.name = name
        # each row's matmul product the same whatever rows go with it (ops.mul_mat): a step of
        # several streams then computes each stream's numbers as its step alone does
        self.rowwise = rowwise
        self._owns_allocator = allocator is None  # a shared allocator belongs to its creator
        self.allocator = allocator or allocator_for(self.backend)
        # metadata contexts: (ggml_context*, view of its Python-owned memory, base address, memory)
        self._ctxs: list = []
        self._ctx_index = -1
        self._ctx_used = _TENSORS_PER_CONTEXT  # the first op opens a context
        self._effects: list[Tensor] = []  # writes into persistent tensors (KV cache updates)
        self._graph_ctx = None
        self._graph_ctx_size = 0
        self.cgraph = None
        self._work = None   # the built graph's flops, counted on the first compute under count_flops
        self.inputs: dict[str, Tensor] = {}
        self.outputs: dict[str, Tensor] = {}
        self._output_ndim: dict[str, int] = {}
        self._allocated = False
        self._placed = False     # tensors carry addresses from an earlier allocation
        self.builds = 0          # counts build(): a scheduler tells a rebuilt graph by it
        self._unused: set[str] = set()
        # index inputs: each entry is a window (view) of the input whose values index `bound` rows
        self._bounds: dict[str, list[IndexWindow]] = {}
        self._bounded_ids: dict[int, int] = {}    # computed ids known to lie in [0, n)
        self._copied_ids: dict[int, Tensor] = {}  # copies of ids: their values come from src

    # -- building -------------------------------------------------------------------------------
    def _next_context(self) -> None:
        """Move on to the next metadata context, making one when none is left to reuse."""
        self._ctx_index += 1
        if self._ctx_index == len(self._ctxs):
            mem = np.empty((_TENSORS_PER_CONTEXT + 8) * self.lib.ggml_tensor_overhead() + 64,
                           dtype=np.uint8)
            base = mem.ctypes.data
            skip = -base % 64  # ggml wants an aligned pool
            c = self.lib.ggml_init(_lib.ggml_init_params(mem.size - skip, base + skip, True))
            if not c:
                raise BackendError("ggml_init failed (out of memory?)")
            self._ctxs.append((c, memoryview(mem), base, mem))
        self._ctx, self._mem_view, self._mem_base, _ = self._ctxs[self._ctx_index]
        self._ctx_used = 0

    def make(self, fn, *args) -> Tensor:
        """Call the ggml op constructor `fn(ctx, *args)` in this graph; wrap its result."""
        if self._ctx_used >= _TENSORS_PER_CONTEXT:
            self._next_context()
        self._ctx_used += 1
        ptr = fn(self._ctx, *args)
        if not ptr:
            raise BackendError("ggml returned a NULL tensor (context out of memory?)")
        v = _HEAD_STRUCT.unpack_from(self._mem_view, ptr - self._mem_base)
        return Tensor(ptr, v[2:6], v[6:10], v[0], self)

    def limit_index(self, ids: Tensor, bound: int) -> None:
        """ids indexes `bound` rows; an out-of-range row would abort inside ggml's kernel, so
        every way ids can get its values is checked before ggml sees them:

        - a graph input, or any view of one (reshape, permute, slice): the values in the view's
          window are range-checked on every write of that input;
        - a copy (`cont`) of ids: checked as its source;
        - computed in the graph: only by an op whose result is bounded by construction
          (`argmax` over n entries is in [0, n)), and n must not exceed `bound`.
        Anything else (ids from a cast, a persistent tensor) raises ShapeError now."""
        head = _lib.ggml_tensor.from_address(ids.ptr)
        root = head.view_src or ids.ptr
        offset = head.view_offs if head.view_src else 0
        for name, t in self.inputs.items():
            if t.ptr == root:
                self._bounds.setdefault(name, []).append(IndexWindow(offset, ids.ne, ids.nb, bound))
                return
        if root in self._copied_ids:  # the copy's values are its source's (all of them: safe)
            self.limit_index(self._copied_ids[root], bound)
            return
        known = self._bounded_ids.get(root)
        if known is None:
            raise ShapeError(f"graph {self.name!r}: index tensor {ids!r} is neither a graph input "
                             "(or a view of one) nor the result of an op that bounds its values "
                             "(argmax); its rows cannot be range-checked — feed it as an input")
        if known > bound:
            raise ShapeError(f"graph {self.name!r}: index tensor {ids!r} holds values up to "
                             f"{known - 1}, but it indexes only {bound} rows")

    def bound_ids(self, ids: Tensor, n: int) -> None:
        """Record that the op which made `ids` puts every value in [0, n)."""
        self._bounded_ids[ids.ptr] = n

    def copied_ids(self, copy: Tensor, src: Tensor) -> None:
        """Record that `copy` holds exactly the values of `src` (a cont of index values)."""
        self._copied_ids[copy.ptr] = src

    def add_effect(self, t: Tensor) -> None:
        """Keep a node that writes into a persistent tensor; it runs before every output."""
        self._effects.append(t)

    def _check_open(self):
        if self.cgraph is not None:
            raise BackendError(f"graph {self.name!r} is already built; reset() it to rebuild")

    def input(self, name: str, shape: tuple, dtype: GGMLType = F32) -> Tensor:
        """A graph input of numpy `shape` (at most 4 axes), written on each `run()`."""
        self._check_open()
        if name in self.inputs:
            raise ShapeError(f"graph {self.name!r} already has an input named {name!r}")
        shape = tuple(int(s) for s in shape)
        if not 1 <= len(shape) <= 4 or any(s < 1 for s in shape):
            raise ShapeError(f"input {name!r}: shape {shape} must have 1-4 positive axes")
        ne = (ctypes.c_int64 * len(shape))(*reversed(shape))
        t = self.make(self.lib.ggml_new_tensor, int(dtype), len(shape), ne)
        self.lib.ggml_set_name(t.ptr, name.encode())
        self.lib.ggml_set_input(t.ptr)
        self.inputs[name] = t
        return t

    def output(self, t: Tensor, name: str, *, ndim: int | None = None) -> Tensor:
        """Mark `t` as an output read back after `run()` (made contiguous if it is a view)."""
        self._check_open()
        if name in self.outputs:
            raise ShapeError(f"graph {self.name!r} already has an output named {name!r}")
        if not t.is_contiguous():
            from .ops import cont
            t = cont(t)
        self.lib.ggml_set_name(t.ptr, name.encode())
        # Outputs are flagged so the allocator never reuses their memory for later nodes.
        self.lib.ggml_set_output(t.ptr)
        self.outputs[name] = t
        self._output_ndim[name] = ndim or len(t.shape)
        return t

    def build(self) -> "Graph":
        """Close the graph: size it from what was created and expand it from the outputs."""
        self._check_open()
        if not self.outputs and not self._effects:
            raise ShapeError(f"graph {self.name!r} has no outputs")
        created = self._ctx_index * _TENSORS_PER_CONTEXT + self._ctx_used
        # Size derived from the build (never a fixed node budget): nodes ≤ created tensors, and
        # every leaf is an operand of a created op, which has at most 4 (flash attention).
        size = 4 * created + 64
        need = self.lib.ggml_graph_overhead_custom(size, False) + 1024
        if self._graph_ctx is None or need > self._graph_ctx_size:
            if self._graph_ctx is not None:
                self.lib.ggml_free(self._graph_ctx)
            self._graph_ctx = self.lib.ggml_init(_lib.ggml_init_params(need, None, True))
            self._graph_ctx_size = need
        else:
            self.lib.ggml_reset(self._graph_ctx)
        self.cgraph = self.lib.ggml_new_graph_custom(self._graph_ctx, size, False)
        self.builds += 1
        self._work = None
        # Cache writes first: nodes run in expansion order, so every later read of the cache
        # (built from a plain view of it, not from the write) sees the new rows.
        for t in self._effects + list(self.outputs.values()):
            self.lib.ggml_build_forward_expand(self.cgraph, t.ptr)
        check_graph(self.lib, self.cgraph, self.name,
                    [mem for _, _, _, mem in self._ctxs[:self._ctx_index + 1]])
        self._allocated = False
        return self

    @property
    def n_nodes(self) -> int:
        return self.lib.ggml_graph_n_nodes(self.cgraph) if self.cgraph else 0

    def reset(self) -> None:
        """Forget every tensor of this graph so it can be rebuilt (contexts are reused)."""
        for c, *_ in self._ctxs:
            self.lib.ggml_reset(c)
        self._ctx_index = -1
        self._ctx_used = _TENSORS_PER_CONTEXT
        self._effects.clear()
        self._bounds.clear()
        self._bounded_ids.clear()
        self._copied_ids.clear()
        self._placed = False
        self.cgraph = None
        self.inputs.clear()
        self.outputs.clear()
        self._output_ndim.clear()
        self._allocated = False
        if self.allocator.current is self:
            self.allocator.current = None

    # -- running --------------------------------------------------------------------------------
    def allocate(self) -> None:
        if self.cgraph is None:
            self.build()
        if self.allocator.current is not self or not self._allocated:
            if self._placed:
                self._forget_placement()
            self.allocator.alloc(self)
            self._allocated = self._placed = True
            # An input no output depends on is not in the graph and gets no memory.
            self._unused = {n for n, t in self.inputs.items()
                            if not _lib.ggml_tensor.from_address(t.ptr).buffer}

    def _forget_placement(self) -> None:
        """Clear every tensor address of this graph before allocating it again.

        The allocator leaves tensors that already have an address where they are; after another
        graph grew (reallocated) the shared buffer, those addresses point into freed memory.
        """
        L = self.lib
        for c, *_ in self._ctxs[: self._ctx_index + 1]:
            p = L.ggml_get_first_tensor(c)
            while p:
                t = _lib.ggml_tensor.from_address(p)
                t.data = None
                t.buffer = None
                p = L.ggml_get_next_tensor(c, p)

    def set_input(self, name: str, value) -> None:
        """Write one input; call after `allocate()` (writing earlier would abort in ggml)."""
        if not self._allocated:
            raise BackendError(f"graph {self.name!r}: allocate() before writing inputs")
        try:
            t = self.inputs[name]
        except KeyError:
            raise ShapeError(f"graph {self.name!r} has no input {name!r} "
                             f"(inputs: {', '.join(self.inputs)})") from None
        dtype = numpy_dtype(t.type)
        arr = np.ascontiguousarray(value, dtype=dtype)
        if arr.size != t.n_elements or _squeeze(arr.shape) != _squeeze(t.shape):
            raise ShapeError(f"input {name!r} of graph {self.name!r}: expected shape {t.shape}, "
                             f"got {arr.shape}")
        for window in self._bounds.get(name, ()):
            bad = window.first_outside(arr)
            if bad is not None:
                raise InputError(f"input {name!r} of graph {self.name!r} holds {bad}, outside "
                                 f"the [0, {window.bound}) rows it indexes")
        if name not in self._unused:
            self.lib.ggml_backend_tensor_set(t.ptr, arr.ctypes.data, 0, arr.nbytes)

    def read(self, name: str) -> np.ndarray:
        t = self.outputs[name]
        arr = np.empty(t.shape, dtype=numpy_dtype(t.type))
        self.lib.ggml_backend_tensor_get(t.ptr, arr.ctypes.data, 0, arr.nbytes)
        ndim = self._output_ndim[name]
        if arr.ndim < ndim:
            arr = arr.reshape((1,) * (ndim - arr.ndim) + arr.shape)
        return arr

    def compute(self) -> None:
        """Compute once. Write every input before each call: the allocator may reuse an input's
        memory after its last reader (only outputs are kept), so `run()` is the safe replay."""
        self.allocator.compute(self)   # one backend's, or a Scheduler's over several
        if _work.counting():
            if self._work is None:
                self._work = _work.graph_work(self.lib, self.cgraph)
            _work.record(self._work)

    def run(self, inputs: dict | None = None, outputs=None) -> dict[str, np.ndarray]:
        """Allocate (if needed), write `inputs` (every input, each run), compute, read outputs."""
        self.allocate()
        inputs = inputs or {}
        missing = set(self.inputs) - set(inputs)
        if missing:
            raise ShapeError(f"graph {self.name!r}: missing input(s) {', '.join(sorted(missing))}")
        for name, value in inputs.items():
            self.set_input(name, value)
        self.compute()
        names = self.outputs if outputs is None else outputs
        return {n: self.read(n) for n in names}

    def close(self) -> None:
        for c, *_ in self._ctxs:
            self.lib.ggml_free(c)
        self._ctxs = []
        if self._graph_ctx is not None:
            self.lib.ggml_free(self._graph_ctx)
            self._graph_ctx = None
        self.cgraph = None
        # the graph <-> allocator reference cycle kept an own allocator's compute buffer
        # alive past close (25 KB per short-lived graph in bench/serve_soak.py): free it here
        if getattr(self, "_owns_allocator", False):
            self.allocator.close()


class IndexWindow(NamedTuple):
    """The elements of a graph input that one index op reads: byte offset, ne, nb (a view)."""

    offset: int
    ne: tuple
    nb: tuple
    bound: int

    def first_outside(self, arr: np.ndarray):
        """The first value of this window of `arr` (the input's data) outside [0, bound)."""
        # numpy strides are byte strides in numpy order, the reverse of ggml's ne / nb
        values = np.ndarray(tuple(reversed(self.ne)), dtype=arr.dtype, buffer=arr,
                            offset=self.offset, strides=tuple(reversed(self.nb)))
        if values.size and (values.min() < 0 or values.max() >= self.bound):
            return values[(values < 0) | (values >= self.bound)].reshape(-1)[0]
        return None


def _squeeze(shape: tuple) -> tuple:
    return tuple(s for s in shape if s != 1)
