"""A backend-resident KV cache (slots assigned on the host, rows written inside graphs), the
host-built additive masks over its slots, and the per-graph view that attention layers take."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..errors import ShapeError
from ..ggml import ops
from ..ggml.backend import Backend, NativeResource, get_backend
from ..ggml.graph import Graph, Tensor, type_size
from ..ggml.types import F16, F32, I32, GGMLType
from ..ggml.weights import TensorStore


def causal_mask(q_pos, k_pos, *, window: int | None = None, valid=None,
                dtype=np.float32) -> np.ndarray:
    """Additive mask (Tq, Tk) for the host: 0 where key k may be seen from query q, −inf elsewhere.

    Allowed iff k_pos ≤ q_pos, and q_pos − k_pos < window (a window of exactly `window` keys,
    itself included), and valid[k]. Slots with k_pos < 0 (an empty cache slot) are never seen.
    """
    # int32 positions and one difference matrix: this runs on the host for every chunk of every
    # stage (16 M entries at 400 Hz with 10 s chunks), so it is kept to a few passes
    q = np.asarray(q_pos, dtype=np.int32)[:, None]
    k = np.asarray(k_pos, dtype=np.int32)[None, :]
    d = q - k
    ok = d >= 0
    ok &= k >= 0
    if window is not None:
        ok &= d < window
    if valid is not None:
        ok &= np.asarray(valid, dtype=bool)[None, :]
    dtype = np.dtype(dtype).type
    return np.where(ok, dtype(0), dtype(-np.inf))


class KVCache(NativeResource):
    """Per-layer K and V rows on the backend, `capacity` slots each, written inside the graph.

    Slots are assigned on the host (`reserve`), so the same cache serves a growing prefix and a
    ring buffer over a sliding window (keys are stored after RoPE, so a slot's age never changes
    its rotation; the mask, built from the slot → position map, does the rest). Writes go
    through `ggml_set_rows` with the slot indices as a graph input, so a fixed-capacity decode
    graph can be built once and replayed.

    `v_trans` stores V transposed (a row of `capacity` slots per channel, as llama.cpp does
    without flash attention) so the softmax path multiplies by it in place. Worth it where
    few query rows meet many keys (streaming codec pushes): ggml's CPU flash attention only
    tiles from 64 query rows and below that runs one scalar exp and dot per key.

    Several sequences may share the cache (design §3), each in a region of its own (`place`):
    its position p lives in slot first + p, so a sequence's rows lie in its region as a cache
    of its own holds them (slot = position), and attention over the region's first slots
    (`keys(..., first=)`, `window_mask`) meets them in the same order and tiles — the same
    sums, bit for bit, whoever shares the cache (issue 31: a shared span made ggml's flash
    attention visit a sequence's keys in another order, and its f16 V accumulation turned
    that into another draw). `free(seq)` empties the region for the next sequence. Linear
    mode only: a ring is one sequence's window.

    `head_major` stores each head's slots together ([Hkv, capacity, Dh], numpy order) instead
    of each slot's heads: a one-row query's flash attention walks one head's keys at a time,
    so they are read as one stream, not one Dh-long row every slot width apart (the same
    values in the same order: the result is unchanged).
    """

    def __init__(self, n_layer: int, n_kv_head: int, head_dim: int, capacity: int, *,
                 backend: "Backend | str | None" = None, dtype: GGMLType = F32,
                 v_trans: bool = False, head_major: bool = False):
        if min(n_layer, n_kv_head, head_dim, capacity) < 1:
            raise ShapeError("KVCache: layers, heads, head_dim and capacity must be positive")
        if dtype not in (F32, F16):
            raise ShapeError(f"KVCache: dtype must be F32 or F16, got {GGMLType(dtype).name}")
        self.backend = get_backend(backend)
        self.n_layer, self.n_kv_head, self.head_dim = n_layer, n_kv_head, head_dim
        if v_trans and head_major:
            raise ShapeError("KVCache: a transposed V cache cannot also be head-major")
        self.capacity, self.dtype, self.v_trans = capacity, GGMLType(dtype), bool(v_trans)
        self.head_major = bool(head_major)
        # one row of Dh·Hkv values per slot: set_rows writes rows, views split heads for reading;
        # a transposed V holds a row of `capacity` slots per channel; head-major, a row of Dh per
        # (head, slot) (numpy shapes below)
        rows = (capacity, head_dim * n_kv_head)
        if head_major:
            rows = (n_kv_head, capacity, head_dim)
        specs = {}
        for il in range(n_layer):
            specs[f"cache.{il}.k"] = (rows, self.dtype)
            specs[f"cache.{il}.v"] = (rows[::-1] if v_trans else rows, self.dtype)
        self._store = TensorStore(specs, self.backend)
        self._k = [self._store[f"cache.{il}.k"] for il in range(n_layer)]
        self._v = [self._store[f"cache.{il}.v"] for il in range(n_layer)]
        self.positions = np.full(capacity, -1, dtype=np.int64)  # slot → absolute position
        self.seq_ids = np.full(capacity, -1, dtype=np.int64)    # slot → sequence id (−1: none)
        self.regions: dict[int, tuple[int, int]] = {}   # sequence id → (first slot, slots)
        self.evicted_max = -1  # newest position a ring overwrite has dropped
        self.reset()

    @property
    def nbytes(self) -> int:
        return self._store.nbytes

    def reset(self) -> None:
        """Forget every row (the memory is zeroed, the slot map emptied)."""
        self._store.buffer.clear(0)
        self.positions[:] = -1
        self.seq_ids[:] = -1
        self.regions.clear()
        self.evicted_max = -1

    @property
    def n_filled(self) -> int:
        return int((self.positions >= 0).sum())

    @property
    def span(self) -> int:
        """1 + the highest filled slot (0 when empty): the slots a one-sequence graph attends
        over (equal to n_filled there; sequences sharing the cache attend over their regions)."""
        filled = np.flatnonzero(self.positions >= 0)
        return int(filled[-1]) + 1 if len(filled) else 0

    def free(self, seq: int) -> int:
        """Forget sequence `seq`'s rows and its region. Returns how many rows it held."""
        drop = self.seq_ids == seq
        self.positions[drop] = -1
        self.seq_ids[drop] = -1
        self.regions.pop(int(seq), None)
        return int(drop.sum())

    def _first_fit(self, slots: int) -> int | None:
        start = 0
        for first, size in sorted(self.regions.values()):
            if first - start >= slots:
                break
            start = max(start, first + size)
        return start if start + slots <= self.capacity else None

    def fits(self, slots: int) -> bool:
        """Whether a region of `slots` slots would fit now."""
        return self._first_fit(slots) is not None

    def place(self, seq: int, slots: int) -> int:
        """Give sequence `seq` a region of `slots` slots, the lowest run that fits → its
        first slot."""
        seq = int(seq)
        first = self._first_fit(slots)
        if seq in self.regions or first is None or slots < 1:
            raise ShapeError(f"KVCache: no region of {slots} slots for sequence {seq} (it has "
                             f"one already, or {self.capacity} slots hold no such free run)")
        self.regions[seq] = (first, slots)
        return first

    def reserve(self, positions, *, ring: bool = False, seq=None) -> np.ndarray:
        """Assign slots to new absolute positions; returns I32 slot indices for `store`.

        Linear mode takes the lowest free slots in order (one sequence fills 0, 1, 2, …) and
        fails when full; ring mode puts position p in slot p % capacity, overwriting the oldest
        row (a sliding window of `capacity` keys). `seq`: the rows' sequence id(s), one or one
        per row: position p of a placed sequence goes to slot first + p of its region.
        """
        pos = np.asarray(positions, dtype=np.int64).reshape(-1)
        if ring and seq is not None:
            raise ShapeError("KVCache: a ring holds one sequence; shared caches are linear")
        if seq is not None:
            slots = self._in_regions(pos, np.broadcast_to(np.asarray(seq), pos.shape))
        elif ring:
            if len(pos) > self.capacity:
                raise ShapeError(f"KVCache: {len(pos)} new rows exceed the ring of {self.capacity}")
            slots = pos % self.capacity
            dropped = self.positions[slots]
            if (dropped >= 0).any():
                self.evicted_max = max(self.evicted_max, int(dropped.max()))
        else:
            free = np.flatnonzero(self.positions < 0)
            if len(pos) > len(free):
                raise ShapeError(f"KVCache: {self.n_filled} + {len(pos)} rows exceed capacity "
                                 f"{self.capacity}; make a larger cache")
            slots = free[:len(pos)]
        self.positions[slots] = pos
        if seq is not None:
            self.seq_ids[slots] = seq
        return slots.astype(np.int32)

    def _in_regions(self, pos: np.ndarray, seqs: np.ndarray) -> np.ndarray:
        slots = np.empty(len(pos), dtype=np.int64)
        for s in np.unique(seqs):       # a prompt chunk is one sequence, a step one row each
            rows = seqs == s
            first, size = self.region(int(s))
            outside = (pos[rows] < 0) | (pos[rows] >= size)
            if outside.any():
                raise ShapeError(f"KVCache: position {pos[rows][outside][0]} is outside "
                                 f"sequence {s}'s region of {size} slots")
            slots[rows] = first + pos[rows]
        return slots

    def region(self, seq: int) -> tuple[int, int]:
        """(first slot, slots) of sequence `seq`'s region."""
        try:
            return self.regions[int(seq)]
        except KeyError:
            raise ShapeError(f"KVCache: sequence {seq} has no region (place it first)") from None

    def window_mask(self, q_positions, first: int, n_slots: int, *,
                    dtype=np.float32) -> np.ndarray:
        """Additive (Tq, n_slots) mask over slots [first, first + n_slots): one sequence's
        region, seen as its own cache sees it."""
        return causal_mask(q_positions, self.positions[first:first + n_slots], dtype=dtype)

    def mask(self, q_positions, *, window: int | None = None, n_slots: int | None = None,
             dtype=np.float32) -> np.ndarray:
        """Additive (Tq, n_slots) mask over the first n_slots slots (default all).

        Fails, rather than silently attending to fewer keys, when a ring overwrite already
        dropped a key some query still needs (capacity must be ≥ window + chunk − 1).
        """
        n = self.capacity if n_slots is None else n_slots
        oldest_needed = max(0, int(np.min(q_positions)) - window + 1) if window is not None else 0
        if self.evicted_max >= oldest_needed:
            raise ShapeError(
                f"KVCache: the ring of {self.capacity} slots already dropped position "
                f"{self.evicted_max}, which a query still needs (window {window}); use a "
                f"capacity of at least window + chunk − 1")
        return causal_mask(q_positions, self.positions[:n], window=window, dtype=dtype)

    def feed(self, positions, n_slots: int, *, flash: bool = True,
             prefix: str = "kv") -> dict[str, np.ndarray]:
        """Host inputs of a `CacheView` for new rows at `positions` (reserves their slots)."""
        pos = np.asarray(positions, dtype=np.int32)
        return self.placed(pos, self.reserve(pos), n_slots, flash=flash, prefix=prefix)

    def placed(self, positions, slots, n_slots: int, *, flash: bool = True, prefix: str = "kv",
               windows: tuple[Window, ...] = ()) -> dict[str, np.ndarray]:
        """Host inputs of a `CacheView` for rows already reserved at `slots`: their mask over
        the first n_slots slots, or with `windows` each group of rows' over its window."""
        pos = np.asarray(positions, dtype=np.int32)
        dtype = np.float16 if flash else np.float32
        if windows:
            starts = np.cumsum([0] + [rows for _, _, rows in windows])
            mask = np.concatenate([self.window_mask(pos[a:b], first, n, dtype=dtype).ravel()
                                   for (first, n, _), a, b in zip(windows, starts, starts[1:])])
        else:
            mask = self.mask(pos, n_slots=n_slots, dtype=dtype)
        return {f"{prefix}.pos": pos, f"{prefix}.slots": np.asarray(slots, np.int32),
                f"{prefix}.mask": mask}

    def store(self, il: int, k: Tensor, v: Tensor, slots: Tensor) -> None:
        """Write k, v of layer il into the slots given by I32 `slots` [T]. Each is [Dh, Hkv, T]
        (a strided view is fine while each row's heads are packed) or [Dh·Hkv, T]."""
        n = slots.ne[0]
        if self.head_major:
            # [Dh, cap, Hkv] ← [Dh, T, Hkv]: the slot indices broadcast over the heads
            ops.set_rows(self._k[il], self._head_rows(k, n), slots)
            ops.set_rows(self._v[il], self._head_rows(v, n), slots)
            return
        ops.set_rows(self._k[il], self._rows(k, n), slots)
        v = self._rows(v, n)
        if not self.v_trans:
            ops.set_rows(self._v[il], v, slots)
            return
        # transposed: each channel is a row of slots, so write one-element rows,
        # [1, capacity, C] ← [1, T, C], the slot indices broadcast over the channels
        cache, width = self._v[il], v.ne[0]
        dst = ops.view(cache, (1, self.capacity, width), (cache.nb[0], cache.nb[1]), graph=v.graph)
        ops.set_rows(dst, ops.view(v, (1, n, width), (v.nb[1], type_size(v.type)[0])), slots)

    def _rows(self, t: Tensor, n: int) -> Tensor:
        """t as [Dh·Hkv, n] with contiguous rows, by a view where the strides allow it."""
        width, dh = self.head_dim * self.n_kv_head, self.head_dim
        size = type_size(t.type)[0]
        if t.ne == (width, n, 1, 1):
            rows = t
        elif t.ne == (dh, self.n_kv_head, n, 1):
            rows = (ops.view(t, (width, n), (t.nb[2],)) if t.nb[1] == dh * size
                    else ops.reshape(ops.cont(t), width, n))
        else:
            raise ShapeError(f"KVCache.store: got {list(t.ne)}, expected [{dh}, "
                             f"{self.n_kv_head}, {n}] or [{width}, {n}]")
        return rows if rows.nb[0] == size else ops.cont(rows)

    def _head_rows(self, t: Tensor, n: int) -> Tensor:
        """t as [Dh, n, Hkv] (a permuted view: each (row, head) stays Dh contiguous values)."""
        width, dh = self.head_dim * self.n_kv_head, self.head_dim
        if t.ne == (width, n, 1, 1):
            t = ops.reshape(t if t.is_contiguous() else ops.cont(t), dh, self.n_kv_head, n)
        elif t.ne != (dh, self.n_kv_head, n, 1):
            raise ShapeError(f"KVCache.store: got {list(t.ne)}, expected [{dh}, "
                             f"{self.n_kv_head}, {n}] or [{width}, {n}]")
        if t.nb[0] != type_size(t.type)[0]:
            t = ops.cont(t)
        return ops.permute(t, 0, 2, 1)

    def keys(self, g: Graph, il: int, n_slots: int | None = None, first: int = 0) -> Tensor:
        """View [Dh, Hkv, n_slots] of layer il's K rows from slot `first` in graph g
        (default: every slot)."""
        return self._view(g, self._k[il], n_slots, first)

    def values(self, g: Graph, il: int, n_slots: int | None = None, first: int = 0) -> Tensor:
        """As keys(); with `v_trans` the view is [n_slots, Dh, Hkv] (slots fastest)."""
        if not self.v_trans:
            return self._view(g, self._v[il], n_slots, first)
        n = self._n_slots(n_slots, first)
        cache = self._v[il]
        return ops.view(cache, (n, self.head_dim, self.n_kv_head),
                        (cache.nb[1], self.head_dim * cache.nb[1]), first * cache.nb[0], graph=g)

    def _n_slots(self, n_slots: int | None, first: int = 0) -> int:
        n = self.capacity - first if n_slots is None else n_slots
        if not 1 <= n <= self.capacity - first or first < 0:
            raise ShapeError(f"KVCache: slots [{first}, {first + n}) requested of "
                             f"{self.capacity}")
        return n

    def _view(self, g: Graph, cache: Tensor, n_slots: int | None, first: int) -> Tensor:
        n = self._n_slots(n_slots, first)
        if self.head_major:   # cache [Dh, capacity, Hkv]: heads capacity rows apart
            return ops.view(cache, (self.head_dim, self.n_kv_head, n), (cache.nb[2], cache.nb[1]),
                            first * cache.nb[1], graph=g)
        dh_bytes = self.head_dim * type_size(cache.type)[0]
        return ops.view(cache, (self.head_dim, self.n_kv_head, n), (dh_bytes, cache.nb[1]),
                        first * cache.nb[1], graph=g)

    def close(self) -> None:
        if getattr(self, "_store", None) is not None:
            self._store.close()
            self._store = None


# (first slot, slots, rows): a group of consecutive graph rows that attends over the cache's
# slots [first, first + slots) — one sequence's region, seen as a cache of its own
Window = tuple[int, int, int]


@dataclass(frozen=True)
class CacheView:
    """What one graph's attention layers need of a cache: the cache, the graph inputs that
    place this graph's rows (I32 positions [T], I32 slots [T], additive mask [n_slots, T]) and
    how many leading slots the graph attends over (a bucket of the filled prefix). With
    `windows`, each group of rows attends over its own window instead (a sequence's region
    of a shared cache), through its own mask (`masks`, views of one mask input)."""

    cache: KVCache
    positions: Tensor
    slots: Tensor
    mask: Tensor
    n_slots: int
    flash: bool = True
    windows: tuple[Window, ...] = ()
    masks: tuple[Tensor, ...] = ()

    @classmethod
    def inputs(cls, g: Graph, cache: KVCache, n_rows: int, n_slots: int, *, flash: bool = True,
               prefix: str = "kv", windows: tuple[Window, ...] = ()) -> "CacheView":
        """Declare the inputs `<prefix>.pos`, `.slots`, `.mask` (F16 for flash) in graph g;
        with `windows` the mask holds each group's [slots, rows] mask in turn."""
        dtype = F16 if flash else F32
        pos = g.input(f"{prefix}.pos", (n_rows,), I32)
        slots = g.input(f"{prefix}.slots", (n_rows,), I32)
        if not windows:
            return cls(cache, pos, slots, g.input(f"{prefix}.mask", (n_rows, n_slots), dtype),
                       n_slots, flash)
        if sum(rows for _, _, rows in windows) != n_rows:
            raise ShapeError(f"CacheView: windows {windows} do not cover {n_rows} rows")
        mask = g.input(f"{prefix}.mask", (sum(n * rows for _, n, rows in windows),), dtype)
        size, masks, offset = type_size(dtype)[0], [], 0
        for _, n, rows in windows:      # group g's mask: numpy (rows, n) at its offset
            masks.append(ops.view(mask, (n, rows), (n * size,), offset * size))
            offset += n * rows
        return cls(cache, pos, slots, mask, max(n for _, n, _ in windows), flash,
                   tuple(windows), tuple(masks))
