"""Several codec streams decoded together (issue 35): one graph per push for every stream that
pushes. The row-wise work (dequantize, projections, layer norms, MLPs, layer scales, patches)
runs once over all streams' rows, so a push of one frame per stream reads the decoder's weights
once, not once per stream; attention runs per stream over that stream's own window caches."""

from __future__ import annotations

from collections import OrderedDict
from typing import TYPE_CHECKING

import numpy as np

from ..errors import InputError
from ..ggml import I32, Graph, allocator_for
from ..ggml.backend import NativeResource
from . import rlfq
from .tower import TowerState, load_tower, run_tower

if TYPE_CHECKING:
    from .codec import Codec

# Graphs kept (least recently used dropped): one per set of pushing slots and their push sizes
# and attended prefixes; with one frame per push a stream steps through about log2(window)
# prefixes while its windows fill, then keeps one, so a steady batch replays one graph.
MAX_GRAPHS = 24


class StreamBatch(NativeResource):
    """Up to `max_streams` codec streams in slots: `open()` → a slot, `push({slot: codes [k,
    frames]})` → {slot: samples [frames · ds, channels]}, `release(slot)`. Each slot's output
    equals what its own `Codec.stream_decoder()` gives for the same pushes, bit for bit: its
    window caches, attended prefixes and graph chunks are that decoder's, and every matmul is
    row-wise (each row's product the same whatever rows go with it) — where that costs nothing
    (`Codec.stream_rowwise`: f32, f16, q8_0 decoders); with K-quant decoder weights, to their
    rounding.

    >>> batch = codec.stream_batch(4, n_quantizers=16)                     # doctest: +SKIP
    >>> a, b = batch.open(), batch.open()                                  # doctest: +SKIP
    >>> out = batch.push({a: codes_a[:, None], b: codes_b[:, None]})       # doctest: +SKIP
    """

    def __init__(self, codec: "Codec", max_streams: int, n_q: int, max_push_frames: int):
        self.codec, self.max_streams, self.n_q = codec, max_streams, n_q
        self.max_push_frames = max_push_frames
        self._decoder = load_tower(codec.weights, codec.config, "decoder")
        self._states: dict[int, TowerState] = {}   # each slot's caches, kept while it is idle
        self._open: set[int] = set()
        self._graphs: OrderedDict[tuple, Graph] = OrderedDict()
        self.allocator = allocator_for(codec.backend)

    @property
    def slots(self) -> list[int]:
        """The open slots."""
        return sorted(self._open)

    def open(self) -> int:
        """A free slot with empty caches (a new stream)."""
        self._need_open()
        free = [s for s in range(self.max_streams) if s not in self._open]
        if not free:
            raise InputError(f"all {self.max_streams} stream slots are open; release one first")
        slot = free[0]
        state = self._states.get(slot)
        if state is None:
            # as Codec.stream_decoder's: rings for max_push_frames, prefixes growing by doubling,
            # V transposed (few query rows against long windows)
            state = self._states[slot] = TowerState(
                self.codec.config, "decoder", self.max_push_frames, self.codec.backend,
                prefix="doubling", v_trans=True, name=f"decoder.s{slot}")
        state.reset()
        self._open.add(slot)
        return slot

    def release(self, slot: int) -> None:
        """End the stream in `slot` (its caches are kept for the next `open`); nothing once
        the batch is closed."""
        if self._graphs is None:
            return
        self._need_slot(slot)
        self._open.discard(int(slot))

    def stream(self) -> "StreamSlot | None":
        """A free slot as a stream decoder of its own (`push`, `flush`, `close`), or None
        when every slot is open."""
        self._need_open()
        return StreamSlot(self, self.open()) if len(self._open) < self.max_streams else None

    def push(self, codes: dict) -> dict[int, np.ndarray]:
        """{slot: int codes [k ≥ n_quantizers, frames]} → {slot: float32 samples [frames · ds,
        channels]}. Every push is checked before any stream moves; a push longer than
        max_push_frames is decoded in rounds of that many frames, as its stream decoder does."""
        self._need_open()
        if not isinstance(codes, dict):
            raise InputError(f"push takes {{slot: codes}}, got {type(codes).__name__}")
        checked = {slot: self._checked(slot, c) for slot, c in codes.items()}
        parts = {slot: [] for slot in checked}
        step = self.max_push_frames
        for start in range(0, max([c.shape[1] for c in checked.values()] + [0]), step):
            chunk = {slot: c[:, start:start + step] for slot, c in checked.items()
                     if c.shape[1] > start}
            for slot, samples in self._run(chunk).items():
                parts[slot].append(samples)
        channels = self.codec.channels
        return {slot: np.concatenate(p).reshape(-1, channels) if p
                else np.zeros((0, channels), dtype=np.float32) for slot, p in parts.items()}

    def _checked(self, slot, codes) -> np.ndarray:
        self._need_slot(slot)
        c = np.asarray(codes)
        if c.ndim == 2 and c.shape[1] == 0 and c.shape[0] >= self.n_q:   # an empty chunk
            return np.zeros((self.n_q, 0), dtype=np.int32)
        try:
            return self.codec.check_codes(c, self.n_q)
        except InputError as e:
            raise InputError(f"slot {slot}: {e}") from None

    def _run(self, chunk: dict[int, np.ndarray]) -> dict[int, np.ndarray]:
        """One graph run: each slot's frames (≤ max_push_frames) → its samples [f · ds · ch]."""
        slots = sorted(chunk)
        frames = [chunk[s].shape[1] for s in slots]
        counts = [self._states[s].slot_counts(f) for s, f in zip(slots, frames)]
        graph = self._graph(tuple(zip(slots, frames, counts)))
        feed = {"codes": rlfq.stacked_ids(np.concatenate([chunk[s] for s in slots], axis=1),
                                          self.codec.config.codebook_size)}
        for s, f, n in zip(slots, frames, counts):
            feed |= self._states[s].advance(f, n)
        y = graph.run(feed)["samples"].reshape(-1)
        ends = np.cumsum([f * self.codec.config.stream_samples_per_frame for f in frames])
        return dict(zip(slots, np.split(y, ends[:-1])))

    def _graph(self, key: tuple) -> Graph:
        graph = self._graphs.pop(key, None)
        if graph is None:
            graph = self._build(key)
            if len(self._graphs) >= MAX_GRAPHS:
                self._graphs.popitem(last=False)[1].close()
        self._graphs[key] = graph         # the most recently used last
        return graph

    def _build(self, key: tuple) -> Graph:
        """The graph of one push: key = ((slot, frames, attended slot counts), ...)."""
        c = self.codec
        n = sum(f for _, f, _ in key)
        g = Graph(c.backend, name=f"decoder[{len(key)} streams, {n}x{self.n_q}]",
                  allocator=self.allocator, rowwise=c.stream_rowwise)
        states = tuple(self._states[s] for s, _, _ in key)
        inputs = tuple(st.graph_inputs(g, f, counts) for st, (_, f, counts) in zip(states, key))
        ids = g.input("codes", (self.n_q * n,), I32)   # rlfq.stacked_ids of [n_q, N], stream-major
        z = rlfq.dequantize(ids, self.n_q, c.weights, c.tables)                 # [code_dim, N]
        y = run_tower(z, self._decoder, c.config, states, inputs)               # [1, T]
        g.output(y, "samples", ndim=2)
        return g.build()

    def _need_slot(self, slot) -> None:
        if isinstance(slot, bool) or not isinstance(slot, (int, np.integer)) \
                or int(slot) not in self._open:
            raise InputError(f"stream slot {slot!r} is not open (open slots: {self.slots}); "
                             "open one with batch.open()")

    def _need_open(self) -> None:
        if self._graphs is None:
            raise InputError("this stream batch is closed; make a new one with "
                             "codec.stream_batch()")
        if self.codec.weights is None:
            raise InputError("the codec of this stream batch is closed")

    def close(self) -> None:
        for g in (getattr(self, "_graphs", None) or {}).values():
            g.close()
        self._graphs = None
        for state in getattr(self, "_states", {}).values():
            state.close()
        self._states = {}
        self._open = set()
        if getattr(self, "allocator", None) is not None:
            self.allocator.close()
            self.allocator = None


class StreamSlot(NativeResource):
    """One slot of a StreamBatch with a StreamDecoder's face: `push(codes)` decodes this
    stream alone (a push of its own), `close()` releases the slot. `slot` names it in the
    batch's pushes of several streams."""

    def __init__(self, batch: StreamBatch, slot: int):
        self.batch, self.slot = batch, slot
        self.released = False

    def push(self, codes) -> np.ndarray:
        return self.batch.push({self.slot: codes})[self.slot]

    def flush(self) -> np.ndarray:
        return np.zeros((0, self.batch.codec.channels), dtype=np.float32)

    def close(self) -> None:
        if not getattr(self, "released", True):
            self.released = True
            self.batch.release(self.slot)
