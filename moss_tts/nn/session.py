"""A decode session: one sequence's KV cache with its prefill graphs and its one-row step graphs,
each step graph built once per (variant, bucket) and replayed (design §3). Shared by every
family's backbone loop (Nano's global and depth transformers, the Qwen3 backbones)."""

from __future__ import annotations

from collections.abc import Callable, Hashable

import numpy as np

from ..errors import ContextFull, InputError
from ..ggml.backend import Allocator, Backend, NativeResource
from ..ggml.graph import Graph
from ..ggml.types import F32, GGMLType
from .kv_cache import CacheView, KVCache

# Slot counts are multiples of this: the rows of an f16 mask, and what the allocator places
# after them, stay 64-byte aligned. It is also the smallest bucket a step attends over.
SLOT_ALIGN = 32
# Rows per prefill graph (llama.cpp's default n_ubatch): a longer prompt is appended in chunks
# of this many rows, so its mask [n_slots, rows] and attention grow with the prompt, not its
# square (design §3); prompts up to this size run in one graph, as before
PREFILL_ROWS = 512

# build(graph, n_rows, cache view, variant): declare the graph's own inputs, its layers over
# `kv`, and its outputs (the session builds and runs it)
Builder = Callable[[Graph, int, CacheView, Hashable], None]


def bucket(n_filled: int, capacity: int) -> int:
    """Slots a step graph attends over: the filled prefix rounded up to a power of two (at
    least SLOT_ALIGN, at most `capacity`), so a step at position 10 does not pay for 4000 slots
    and a graph serves every position up to its bucket."""
    n = SLOT_ALIGN
    while n < n_filled:
        n *= 2
    return min(n, capacity)


def concat_rows(outs: list[dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
    """The outputs of prefill chunks that return every row, joined along the row axis (each
    output's first axis is its rows, as `Graph.run` returns them)."""
    return {name: np.concatenate([out[name] for out in outs]) for name in outs[0]}


class DecodeSession(NativeResource):
    """KV cache + graphs of one sequence; per-request state owned by the caller (style C16).

    `run(feed, n_rows)` appends n_rows at the next positions: one row goes through the step
    graph of its bucket (built on first use, then replayed with new inputs), several rows
    through a prefill graph built for them on an allocator that `reserve()` sizes up front.
    """

    def __init__(self, build: Builder, *, backend: Backend, n_layer: int, n_kv_head: int,
                 head_dim: int, capacity: int, prefix: str, name: str, flash: bool = True,
                 dtype: GGMLType = F32):
        self.backend = backend
        self.capacity = -(-capacity // SLOT_ALIGN) * SLOT_ALIGN
        self.cache = KVCache(n_layer, n_kv_head, head_dim, self.capacity, backend=backend,
                             dtype=dtype)
        self._build, self.prefix, self.name, self.flash = build, prefix, name, flash
        self.step_graphs: dict[tuple, Graph] = {}    # (variant, n_slots) → replayed graph
        self.prefill_allocator = Allocator(backend)
        self.position = 0

    def _graph(self, n_rows: int, n_slots: int, variant, allocator=None) -> Graph:
        g = Graph(self.backend, name=f"{self.name}[{variant},{n_rows}x{n_slots}]",
                  allocator=allocator)
        kv = CacheView.inputs(g, self.cache, n_rows, n_slots, flash=self.flash, prefix=self.prefix)
        self._build(g, n_rows, kv, variant)
        return g.build()

    def step_graph(self, n_slots: int, variant=None) -> Graph:
        """The one-row graph attending over n_slots slots (built once, then replayed)."""
        key = (variant, n_slots)
        g = self.step_graphs.get(key)
        if g is None:
            g = self.step_graphs[key] = self._graph(1, n_slots, variant)
        return g

    def reserve(self, max_rows: int, variant=None) -> int:
        """Size the prefill allocator for `max_rows` rows over the whole cache now (the
        worst case), so no prefill grows it later; returns its bytes."""
        g = self._graph(max_rows, self.capacity, variant, self.prefill_allocator)
        try:
            return self.prefill_allocator.reserve(g)
        finally:
            g.close()

    def run(self, feed: dict, n_rows: int, *, variant=None) -> dict[str, np.ndarray]:
        """Append n_rows rows (the graph's own inputs in `feed`) → the graph's outputs."""
        if self.position + n_rows > self.capacity:
            raise ContextFull(f"{self.name}: {self.position} + {n_rows} rows exceed the session's "
                             f"capacity of {self.capacity}; make a larger one")
        positions = np.arange(self.position, self.position + n_rows)
        if n_rows == 1:
            n_slots = bucket(self.cache.n_filled + 1, self.capacity)
            g = self.step_graph(n_slots, variant)
        else:   # built for these rows only: attend over exactly the filled prefix
            n_slots = self.cache.n_filled + n_rows
            g = self._graph(n_rows, n_slots, variant, self.prefill_allocator)
        try:
            out = g.run(feed | self.cache.feed(positions, n_slots, flash=self.flash,
                                               prefix=self.prefix))
        finally:
            if n_rows > 1:
                g.close()
        self.position += n_rows
        return out

    def prefill(self, rows_feed: dict, n_rows: int, *, variant=None, extra: dict | None = None,
                max_rows: int = PREFILL_ROWS) -> list[dict[str, np.ndarray]]:
        """Append n_rows rows in chunks of at most max_rows (each `rows_feed` array is sliced
        along its first axis, `extra` goes to every chunk) → each chunk's outputs, in order.
        Every chunk attends over the cache the chunks before it filled, so this equals one
        `run` of all the rows."""
        if max_rows < 1:
            raise InputError(f"{self.name}: max_rows must be at least 1, got {max_rows}")
        outs = []
        for start in range(0, n_rows, max_rows):
            stop = min(n_rows, start + max_rows)
            feed = {name: value[start:stop] for name, value in rows_feed.items()}
            outs.append(self.run(feed | (extra or {}), stop - start, variant=variant))
        return outs

    def reset(self) -> None:
        """Empty the cache for a new sequence; built graphs stay valid (same cache)."""
        self.cache.reset()
        self.position = 0

    def close(self) -> None:
        for g in getattr(self, "step_graphs", {}).values():
            g.close()
        self.step_graphs = {}
        if getattr(self, "prefill_allocator", None) is not None:
            self.prefill_allocator.close()
            self.prefill_allocator = None
        if getattr(self, "cache", None) is not None:
            self.cache.close()
            self.cache = None


class SessionsOwner(NativeResource):
    """A per-utterance state built of decode sessions, held in the attributes named by
    SESSIONS: close() closes each one that exists, so a constructor that failed half-way (its
    later sessions never set) is closed as safely as a whole one, and closing twice is fine."""

    SESSIONS: tuple[str, ...] = ()

    def close(self) -> None:
        for name in self.SESSIONS:
            session = getattr(self, name, None)
            if session is not None:
                session.close()
