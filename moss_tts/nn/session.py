"""A decode session: one sequence's KV cache with its prefill graphs and its one-row step graphs,
each step graph built once per (variant, bucket) and replayed (design §3). Shared by every
family's backbone loop (Nano's global and depth transformers, the Qwen3 backbones).
`SharedDecodeSession` is the same over a cache shared by several sequences: a step carries one
row per sequence, so each weight is read once for all of them."""

from __future__ import annotations

from collections.abc import Callable, Hashable

import numpy as np

from ..errors import ContextFull, InputError
from ..ggml.backend import Backend, NativeResource
from ..ggml.sched import allocator_for
from ..ggml.graph import Graph
from ..ggml.types import F32, GGMLType
from .kv_cache import CacheView, KVCache, Window

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


def aligned(rows: int) -> int:
    """Slots a session of `rows` rows holds: rows rounded up to SLOT_ALIGN."""
    return -(-rows // SLOT_ALIGN) * SLOT_ALIGN


def frames_capacity(rows: int, streams: int | None) -> int:
    """Capacity of a per-frame session (`per_frame`) of `rows` rows a frame for `streams`
    streams (None: one stream, a session of its own)."""
    return aligned(rows) * (streams or 1)


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
        self.capacity = aligned(capacity)
        self.cache = KVCache(n_layer, n_kv_head, head_dim, self.capacity, backend=backend,
                             dtype=dtype, head_major=head_major)
        self._build, self.prefix, self.name, self.flash = build, prefix, name, flash
        self.step_graphs: dict[tuple, Graph] = {}    # (variant, n_slots) → replayed graph
        self.prefill_allocator = allocator_for(backend)
        self.position = 0

    def _graph(self, n_rows: int, n_slots: int, variant, allocator=None, *,
               windows: tuple[Window, ...] = (), step: bool = False) -> Graph:
        """A graph of n_rows rows over the first n_slots slots, or over `windows`. A step's
        matmuls give each row the product it has whatever rows go with it
        (`Graph.rowwise`), so a sequence's step among others' equals its step alone."""
        g = Graph(self.backend, name=f"{self.name}[{variant},{n_rows}x{n_slots}]",
                  allocator=allocator, rowwise=step)
        kv = CacheView.inputs(g, self.cache, n_rows, n_slots, flash=self.flash, prefix=self.prefix,
                              windows=windows)
        self._build(g, n_rows, kv, variant)
        return g.build()

    def step_graph(self, n_slots: int, variant=None) -> Graph:
        """The graph of one step row attending over n_slots slots, built once, then replayed;
        keyed (variant, n_slots)."""
        key = (variant, n_slots)
        g = self.step_graphs.get(key)
        if g is None:
            g = self.step_graphs[key] = self._graph(1, n_slots, variant, step=True)
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
        slots = self.cache.reserve(positions)
        # one row: the replayed step graph of its bucket; several: a graph built for them on
        # the prefill allocator, attending over exactly the filled span
        step = n_rows == 1
        n_slots = bucket(self.cache.span, self.capacity) if step else self.cache.span
        g = self.step_graph(n_slots, variant) if step else \
            self._graph(n_rows, n_slots, variant, self.prefill_allocator)
        try:
            out = g.run(feed | self.cache.placed(positions, slots, n_slots, flash=self.flash,
                                                 prefix=self.prefix))
        finally:
            if not step:
                g.close()
        self.position += n_rows
        return out

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
    """One KV cache and its graphs shared by several sequences (design §3): `open(rows)` starts
    a sequence in a region of the cache of its own, `append` runs one sequence's rows (its
    prompt, between steps), `step` one row of each of several sequences in one graph, and
    `release` frees a finished sequence's region for the next.

    A sequence's rows run as they run in a session of its own, bit for bit: its position p
    sits in slot first + p of its region, each row attends over its own region only (a
    `CacheView` window: the bucket of its filled prefix for a step row, the filled span for a
    chunk, as `DecodeSession` attends), and a step's matmuls take each row through the one-row
    kernels. So who shares the cache, in what order, never changes a sequence's numbers. A
    step graph is built per (variant, each row's window) and replayed; the most recent
    STEP_GRAPHS_KEPT are kept.
    """

    STEP_GRAPHS_KEPT = 32

    def __init__(self, build: Builder, **kwargs):
        super().__init__(build, **kwargs)
        self.positions: dict[int, int] = {}   # open sequence id → its next position
        self.limits: dict[int, int] = {}      # ... → its capacity, as a session of its own
        self._next_seq = 0

    def fits(self, rows: int, *, slots: int | None = None) -> bool:
        """Whether a sequence of at most `rows` rows (in a region of `slots`) fits now."""
        return self.cache.fits(max(aligned(rows), slots or 0))

    def open(self, rows: int, *, slots: int | None = None) -> int:
        """A new, empty sequence of at most `rows` rows, attended as a session of `rows`
        capacity attends, in a region of `slots` slots (default: just those rows; a scheduler
        gives regions of a few sizes, so the next sequence fits where one left); → its id."""
        slots = max(aligned(rows), slots or 0)
        if not self.cache.fits(slots):
            raise ContextFull(f"{self.name}: no free run of {slots} slots for a sequence of "
                              f"{rows} rows in the shared capacity of {self.capacity}; "
                              "release one or make a larger session")
        seq, self._next_seq = self._next_seq, self._next_seq + 1
        self.cache.place(seq, slots)
        self.positions[seq], self.limits[seq] = 0, aligned(rows)
        return seq

    def release(self, seq: int) -> None:
        """Forget sequence `seq` and free its region."""
        self._position(seq)
        self.cache.free(seq)
        del self.positions[seq], self.limits[seq]

    def _position(self, seq: int) -> int:
        if seq not in self.positions:
            raise InputError(f"{self.name}: sequence {seq} is not open")
        return self.positions[seq]

    def _window(self, seq: int, n_rows: int) -> Window:
        """Where the next n_rows of `seq` attend: its region's first slots, as many as its own
        session would attend over (checked to fit its region)."""
        start = self._position(seq)
        first, size = self.cache.region(seq)[0], self.limits[seq]
        if start + n_rows > size:
            raise ContextFull(f"{self.name}: sequence {seq}: {start} + {n_rows} rows exceed its "
                              f"{size} slots; open it with more rows")
        filled = start + n_rows
        return first, bucket(filled, size) if n_rows == 1 else filled, n_rows

    def _run(self, seqs: list[int], windows: tuple[Window, ...], feed: dict,
             variant) -> dict[str, np.ndarray]:
        positions = np.concatenate([np.arange(self.positions[s], self.positions[s] + rows)
                                    for s, (_, _, rows) in zip(seqs, windows)])
        rows_seq = np.repeat(seqs, [rows for _, _, rows in windows])
        slots = self.cache.reserve(positions, seq=rows_seq)
        step = all(rows == 1 for _, _, rows in windows)
        g = self._step_graph(windows, variant) if step else \
            self._graph(len(positions), 0, variant, self.prefill_allocator, windows=windows)
        try:
            out = g.run(feed | self.cache.placed(positions, slots, 0, flash=self.flash,
                                                 prefix=self.prefix, windows=windows))
        finally:
            if not step:
                g.close()
        for s, (_, _, rows) in zip(seqs, windows):
            self.positions[s] += rows
        return out

    def _step_graph(self, windows: tuple[Window, ...], variant) -> Graph:
        key = (variant, windows)
        g = self.step_graphs.pop(key, None)
        if g is None:
            g = self._graph(len(windows), 0, variant, windows=windows, step=True)
            if len(self.step_graphs) >= self.STEP_GRAPHS_KEPT:   # the least recently used
                self.step_graphs.pop(next(iter(self.step_graphs))).close()
        self.step_graphs[key] = g
        return g

    def append(self, seq: int, feed: dict, n_rows: int, *, variant=None) -> dict[str, np.ndarray]:
        """Append n_rows rows to sequence `seq` (the graph's own inputs in `feed`) → outputs."""
        return self._run([seq], (self._window(seq, n_rows),), feed, variant)

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
        return self._run(seqs, tuple(self._window(s, 1) for s in seqs), feed, variant)

    def per_frame(self, n: int, rows: int):
        """Empty the cache and open n fresh sequences of `rows` rows, one per stream, for a
        per-frame transformer (a depth or local block whose sequence starts afresh each
        frame) → `run(feed, streams, variant)`: one step of the sequences of `streams`
        (indices into the n, row i of `feed` for streams[i]), their outputs in that order."""
        self.reset()
        seqs = [self.open(rows) for _ in range(n)]
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
        self.limits.clear()


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
