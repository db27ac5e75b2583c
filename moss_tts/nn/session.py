"""A decode session: one sequence's KV cache with its prefill graphs and its one-row step graphs,
each step graph built once per (variant, bucket) and replayed (design §3). Shared by every
family's backbone loop (Nano's global and depth transformers, the Qwen3 backbones).
`SharedDecodeSession` is the same over a cache shared by several sequences: a step carries one
row per sequence, so each weight is read once for all of them."""

from __future__ import annotations

from collections.abc import Callable, Hashable

import numpy as np

from ..errors import ContextFull, InputError
from ..ggml.backend import Backend, NativeResource, allocator_for
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


def in_chunks(run: Callable[[dict, int], dict], rows_feed: dict, n_rows: int, *,
              extra: dict | None = None, max_rows: int = PREFILL_ROWS,
              name: str = "prefill") -> list[dict[str, np.ndarray]]:
    """Append n_rows rows through `run(feed, rows)` in chunks of at most max_rows (each
    `rows_feed` array sliced along its first axis, `extra` given to every chunk) → each chunk's
    outputs, in order."""
    if max_rows < 1:
        raise InputError(f"{name}: max_rows must be at least 1, got {max_rows}")
    outs = []
    for start in range(0, n_rows, max_rows):
        stop = min(n_rows, start + max_rows)
        feed = {key: value[start:stop] for key, value in rows_feed.items()}
        outs.append(run(feed | (extra or {}), stop - start))
    return outs


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
                 dtype: GGMLType = F32, head_major: bool = False):
        self.backend = backend
        self.capacity = -(-capacity // SLOT_ALIGN) * SLOT_ALIGN
        self.cache = KVCache(n_layer, n_kv_head, head_dim, self.capacity, backend=backend,
                             dtype=dtype, head_major=head_major)
        self._build, self.prefix, self.name, self.flash = build, prefix, name, flash
        self.step_graphs: dict[tuple, Graph] = {}    # (variant, n_slots) → replayed graph
        self.prefill_allocator = allocator_for(backend)
        self.position = 0

    def _graph(self, n_rows: int, n_slots: int, variant, allocator=None) -> Graph:
        g = Graph(self.backend, name=f"{self.name}[{variant},{n_rows}x{n_slots}]",
                  allocator=allocator)
        kv = CacheView.inputs(g, self.cache, n_rows, n_slots, flash=self.flash, prefix=self.prefix)
        self._build(g, n_rows, kv, variant)
        return g.build()

    def step_graph(self, n_slots: int, variant=None, *, n_rows: int = 1) -> Graph:
        """The graph of n_rows step rows (one per sequence) attending over n_slots slots, built
        once, then replayed; keyed (variant, n_slots), plus n_rows past one row."""
        key = (variant, n_slots) + ((n_rows,) if n_rows > 1 else ())
        g = self.step_graphs.get(key)
        if g is None:
            g = self.step_graphs[key] = self._graph(n_rows, n_slots, variant)
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
        out = self._append(feed, np.arange(self.position, self.position + n_rows), None,
                           step=n_rows == 1, variant=variant)
        self.position += n_rows
        return out

    def _append(self, feed: dict, positions: np.ndarray, seq, *, step: bool,
                variant) -> dict[str, np.ndarray]:
        """Reserve slots for rows at `positions` (of sequence(s) `seq`) and run them: through
        the replayed step graph of their bucket (`step`: one row per sequence), or through a
        graph built for them on the prefill allocator, attending over exactly the filled
        span."""
        slots = self.cache.reserve(positions, seq=seq)
        n_rows = len(positions)
        if step:
            n_slots = bucket(self.cache.span, self.capacity)
            g = self.step_graph(n_slots, variant, n_rows=n_rows)
        else:
            n_slots = self.cache.span
            g = self._graph(n_rows, n_slots, variant, self.prefill_allocator)
        try:
            return g.run(feed | self.cache.placed(positions, slots, n_slots, flash=self.flash,
                                                  prefix=self.prefix, seq=seq))
        finally:
            if not step:
                g.close()

    def prefill(self, rows_feed: dict, n_rows: int, *, variant=None, extra: dict | None = None,
                max_rows: int = PREFILL_ROWS) -> list[dict[str, np.ndarray]]:
        """Append n_rows rows in chunks of at most max_rows (each `rows_feed` array is sliced
        along its first axis, `extra` goes to every chunk) → each chunk's outputs, in order.
        Every chunk attends over the cache the chunks before it filled, so this equals one
        `run` of all the rows."""
        return in_chunks(lambda feed, n: self.run(feed, n, variant=variant), rows_feed, n_rows,
                         extra=extra, max_rows=max_rows, name=self.name)

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


class SharedDecodeSession(DecodeSession):
    """One KV cache and its graphs shared by several sequences (design §3): `open()` starts a
    sequence, `append` runs one sequence's rows (its prompt, between steps), `step` one row of
    each of several sequences in one graph (replayed per (rows, bucket)), and `release` frees a
    finished sequence's slots for the next. Each row attends only over its own sequence's
    slots, so a sequence's result does not depend on who shares the cache.
    """

    def __init__(self, build: Builder, **kwargs):
        super().__init__(build, **kwargs)
        self.positions: dict[int, int] = {}   # open sequence id → its next position
        self._next_seq = 0

    def open(self) -> int:
        """A new, empty sequence; returns its id."""
        seq, self._next_seq = self._next_seq, self._next_seq + 1
        self.positions[seq] = 0
        return seq

    def release(self, seq: int) -> None:
        """Forget sequence `seq` and free its slots."""
        self._position(seq)
        self.cache.free(seq)
        del self.positions[seq]

    def _position(self, seq: int) -> int:
        if seq not in self.positions:
            raise InputError(f"{self.name}: sequence {seq} is not open")
        return self.positions[seq]

    def _fits(self, n_rows: int) -> None:
        free = self.capacity - self.cache.n_filled
        if n_rows > free:
            raise ContextFull(f"{self.name}: {n_rows} new rows exceed the {free} free slots of "
                              f"the shared capacity of {self.capacity}; make a larger one")

    def append(self, seq: int, feed: dict, n_rows: int, *, variant=None) -> dict[str, np.ndarray]:
        """Append n_rows rows to sequence `seq` (the graph's own inputs in `feed`) → outputs."""
        start = self._position(seq)
        self._fits(n_rows)
        out = self._append(feed, np.arange(start, start + n_rows), seq, step=n_rows == 1,
                           variant=variant)
        self.positions[seq] = start + n_rows
        return out

    def run(self, feed: dict, n_rows: int, *, variant=None) -> dict[str, np.ndarray]:
        raise InputError(f"{self.name}: a shared session runs rows of a sequence: use "
                         "append(seq, ...) or step(seqs, ...)")

    def step(self, seqs, feed: dict, *, variant=None) -> dict[str, np.ndarray]:
        """One row for each sequence in `seqs`, in that order (row i of every `feed` array
        belongs to seqs[i]) → outputs with one row per sequence, in the same order."""
        seqs = [int(s) for s in seqs]
        if len(set(seqs)) != len(seqs) or not seqs:
            raise InputError(f"{self.name}: a step takes each open sequence at most once, "
                             f"got {seqs}")
        positions = np.array([self._position(s) for s in seqs])
        self._fits(len(seqs))
        out = self._append(feed, positions, np.array(seqs), step=True, variant=variant)
        for s in seqs:
            self.positions[s] += 1
        return out

    def per_frame(self, n: int):
        """Empty the cache and open n fresh sequences, one per stream, for a per-frame
        transformer (a depth or local block whose sequence starts afresh each frame) →
        `run(feed, streams, variant)`: one step of the sequences of `streams` (indices into the
        n, row i of `feed` for streams[i]), their outputs in that order."""
        self.reset()
        seqs = [self.open() for _ in range(n)]
        return lambda feed, streams, variant=None: self.step([seqs[i] for i in streams], feed,
                                                             variant=variant)

    def prefill_sequence(self, seq: int, rows_feed: dict, n_rows: int, *, variant=None,
                         extra: dict | None = None,
                         max_rows: int = PREFILL_ROWS) -> list[dict[str, np.ndarray]]:
        """`DecodeSession.prefill` for sequence `seq`: its rows in chunks of at most max_rows."""
        return in_chunks(lambda feed, n: self.append(seq, feed, n, variant=variant), rows_feed,
                         n_rows, extra=extra, max_rows=max_rows, name=self.name)

    def reset(self) -> None:
        """Close every sequence and empty the cache; built graphs stay valid."""
        super().reset()
        self.positions.clear()


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
