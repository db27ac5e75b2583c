"""ggml's scheduler (`ggml_backend_sched`) over a device backend and the CPU (design §2): each op
runs where its weights are when that backend supports it, the rest on the CPU, with the copies
between them. It stands in a Graph's place of an Allocator:
`Graph(device, allocator=Scheduler(device))`."""

from __future__ import annotations

import ctypes
import logging
import weakref

from ..errors import BackendError
from . import lib as _lib
from .backend import Allocator, Backend, NativeResource, get_backend

logger = logging.getLogger(__name__)

_SRC = _lib.ggml_tensor.src.offset
_SRC_BYTES = ctypes.sizeof(ctypes.c_void_p) * _lib.GGML_MAX_SRC


class Scheduler(NativeResource):
    """A persistent scheduler: reused by every graph run on it, its buffers growing to the
    largest. `lacks`: ggml op names (`"SOFT_MAX"`, `"MUL_MAT"`) the device is to treat as
    unsupported, so they run on the CPU as an op the device lacks would — the test of the
    fallback on a device that has every op."""

    def __init__(self, backend: Backend, cpu: Backend | None = None, *,
                 lacks: frozenset[str] = frozenset()):
        self.backend = backend
        # the CPU part runs with the threads the device's backend was given (--threads)
        self.cpu = cpu if cpu is not None else get_backend("cpu", backend.threads)
        if not self.cpu.is_cpu:
            raise BackendError(f"a scheduler falls back to the CPU backend, not {self.cpu.name}")
        if self.backend is self.cpu:
            raise BackendError("a scheduler needs a device backend beside the CPU")
        self.lib = backend.lib
        self.lacks = frozenset(lacks)
        self._ptr = None
        self._size = 0     # the graph size the scheduler's tables hold
        self.current = None  # the graph whose tensors the buffers currently hold
        # graph → (its build number, [(node, its own sources)])
        self._sources: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()

    def _fit(self, graph) -> None:
        """Make the scheduler (again) when a graph is larger than its tables: ggml sizes them
        once, and a fixed budget would abort on a long input."""
        # its hash table holds the graph's nodes and leafs (each at most the graph's size)
        size = 2 * self.lib.ggml_graph_size(graph.cgraph)
        if self._ptr and size <= self._size:
            self.lib.ggml_backend_sched_reset(self._ptr)
            return
        self._free()
        backends = (ctypes.c_void_p * 2)(self.backend.ptr, self.cpu.ptr)
        self._ptr = self.lib.ggml_backend_sched_new(backends, None, 2, size, False, False)
        if not self._ptr:
            raise BackendError("ggml_backend_sched_new failed")
        self._size = size

    def _own_sources(self, graph) -> None:
        """ggml's split points each node that reads another backend's tensor at a copy in the
        scheduler's context, which the next graph's split reuses: give a graph its own sources
        back before it is split again, or it reads another graph's tensors."""
        saved = self._sources.get(graph)
        if saved is not None and saved[0] == graph.builds:
            for node, sources in saved[1]:
                ctypes.memmove(node + _SRC, sources, _SRC_BYTES)
            return
        L = self.lib
        nodes = [L.ggml_graph_node(graph.cgraph, i) for i in range(L.ggml_graph_n_nodes(graph.cgraph))]
        self._sources[graph] = (graph.builds,
                                [(n, ctypes.string_at(n + _SRC, _SRC_BYTES)) for n in nodes])

    def _place(self, graph) -> None:
        """Put the ops the device is said to lack on the CPU."""
        if not self.lacks:
            return
        L = self.lib
        for i in range(L.ggml_graph_n_nodes(graph.cgraph)):
            node = L.ggml_graph_node(graph.cgraph, i)
            op = L.ggml_op_desc(node).decode()
            if op not in self.lacks:
                continue
            head = _lib.ggml_tensor.from_address(node)
            if head.buffer or head.view_src:
                # it writes into a persistent tensor on the device (a KV-cache row), where the
                # CPU cannot reach: ggml would abort or the CPU would write a device address
                raise BackendError(f"graph {graph.name!r}: {op} writes into device memory, so "
                                   "it cannot run on the CPU")
            L.ggml_backend_sched_set_tensor_backend(self._ptr, node, self.cpu.ptr)

    def reserve(self, graph) -> int:
        """Size the buffers for a worst-case graph now (no compute); returns their bytes."""
        self._fit(graph)
        self._own_sources(graph)
        self._place(graph)
        if not self.lib.ggml_backend_sched_reserve(self._ptr, graph.cgraph):
            raise BackendError(f"could not reserve compute buffers for graph {graph.name!r}")
        self.current = None
        logger.info("compute buffers for %s: %.1f MiB", graph.name, self.buffer_size / 2**20)
        return self.buffer_size

    def alloc(self, graph) -> None:
        self.current = None
        self._fit(graph)
        self._own_sources(graph)
        self._place(graph)
        if not self.lib.ggml_backend_sched_alloc_graph(self._ptr, graph.cgraph):
            raise BackendError(f"could not allocate the compute buffers for graph "
                               f"{graph.name!r} (out of memory?)")
        self.current = graph

    def compute(self, graph) -> None:
        # both backends' locks, in one order: the CPU backend may be shared with other graphs
        with self.backend.compute_lock, self.cpu.compute_lock:
            status = self.lib.ggml_backend_sched_graph_compute(self._ptr, graph.cgraph)
        if status != 0:
            raise BackendError(f"ggml graph compute failed on {self.backend.name} + CPU "
                               f"(status {status})")

    @property
    def n_splits(self) -> int:
        """Pieces of the current graph run on one backend each (1: all on the device)."""
        return self.lib.ggml_backend_sched_get_n_splits(self._ptr) if self._ptr else 0

    def backend_of(self, tensor) -> str | None:
        """The name of the backend a node of the current graph runs on."""
        b = self.lib.ggml_backend_sched_get_tensor_backend(self._ptr, tensor.ptr)
        return self.lib.ggml_backend_name(b).decode() if b else None

    @property
    def buffer_size(self) -> int:
        if not self._ptr:
            return 0
        return sum(self.lib.ggml_backend_sched_get_buffer_size(self._ptr, b.ptr)
                   for b in (self.backend, self.cpu))

    def _free(self) -> None:
        if self._ptr:
            self.lib.ggml_backend_sched_free(self._ptr)
            self._ptr = None
            self._size = 0
            self.current = None

    def close(self) -> None:
        self._free()


def allocator_for(backend: Backend) -> "Allocator | Scheduler":
    """A persistent allocator for graphs on `backend`: the CPU's own, or for any other backend
    ggml's scheduler over it and the CPU, so an op it lacks runs on the CPU."""
    if backend.is_cpu:
        return Allocator(backend)
    return Scheduler(backend, lacks=backend.lacks)
