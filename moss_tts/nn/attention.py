"""Multi-head / grouped-query attention, host-built masks, and a backend-resident KV cache."""

from __future__ import annotations

import ctypes

import numpy as np

from ..errors import BackendError, ShapeError
from ..ggml import lib as _lib
from ..ggml import ops
from ..ggml.backend import Backend, Buffer, NativeResource, get_backend
from ..ggml.graph import Graph, Tensor, type_size
from ..ggml.types import F16, F32, GGMLType


def split_heads(x: Tensor, n_head: int) -> Tensor:
    """[H·Dh, T] → [Dh, H, T] (heads are contiguous blocks of Dh, as upstream's view(T, H, Dh))."""
    if x.ne[0] % n_head:
        raise ShapeError(f"split_heads: width {x.ne[0]} is not divisible by {n_head} heads")
    if not x.is_contiguous():
        x = ops.cont(x)
    return ops.reshape(x, x.ne[0] // n_head, n_head, x.ne[1])


def merge_heads(x: Tensor) -> Tensor:
    """[Dh, H, T] → [H·Dh, T]."""
    if not x.is_contiguous():
        x = ops.cont(x)
    return ops.reshape(x, x.ne[0] * x.ne[1], x.ne[2])


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


def attention(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, *, scale: float,
              flash: bool = False, v_transposed: bool = False) -> Tensor:
    """softmax(q·kᵀ·scale + mask)·v per head → [Dh·Hq, Tq].

    q [Dh, Hq, Tq], k [Dh, Hkv, Tk] and v [Dh, Hkv, Tk] — or, `v_transposed`, v [Tk, Dh, Hkv]
    (a transposed cache, softmax path only) — views of a cache are fine; Hq a multiple of Hkv:
    query head h reads kv head h // (Hq/Hkv). mask: additive [Tk, Tq] — F32 or F16 for the
    softmax path, F16 for `flash` (ggml_flash_attn_ext; K/V may be F16 there).
    """
    dh, hq, tq = q.ne[0], q.ne[1], q.ne[2]
    v_ne = (v.ne[1], v.ne[2], v.ne[0]) if v_transposed else v.ne[:3]
    if k.ne[:3] != v_ne or k.ne[0] != dh or hq % k.ne[1] or (flash and v_transposed):
        raise ShapeError(f"attention: q {list(q.ne)}, k {list(k.ne)}, v {list(v.ne)} do not fit "
                         "(need equal head dims, k == v, Hq a multiple of Hkv; flash attention "
                         "needs v untransposed)")
    qp = ops.permute(q, 0, 2, 1)                      # [Dh, Tq, Hq]
    kp = ops.permute(k, 0, 2, 1)                      # [Dh, Tk, Hkv]
    if flash:
        vp = ops.permute(v, 0, 2, 1)                  # [Dh, Tk, Hkv]
        out = ops.flash_attn(qp, kp, vp, mask, scale)  # [Dh, Hq, Tq] (ggml returns heads first)
        return ops.reshape(out, dh * hq, tq)
    # q made contiguous (a few KB) so both products take ggml's GEMM path, not per-row dots
    kq = ops.mul_mat(kp, ops.cont(qp))                # [Tk, Tq, Hq]: scores, GQA by broadcast
    kq = ops.softmax(kq, mask, scale)
    # the product contracts over keys, so V must have keys fastest: a transposed cache is read
    # in place, an untransposed one is copied (a strided transpose — slow for long caches)
    vt = v if v_transposed else ops.cont(ops.permute(v, 1, 2, 0))   # [Tk, Dh, Hkv]
    out = ops.mul_mat(vt, kq)                         # [Dh, Tq, Hq]
    out = ops.cont(ops.permute(out, 0, 2, 1))         # [Dh, Hq, Tq]
    return ops.reshape(out, dh * hq, tq)


def cached_self_attention(qkv: Tensor, cache: "KVCache", il: int, *, n_heads: int,
                          positions: Tensor, slots: Tensor, mask: Tensor, n_slots: int | None,
                          rope_mode: str, rope_base: float, flash: bool = True) -> Tensor:
    """Fused q|k|v rows [3·H·Dh, T] → attention output [H·Dh, T] over the cache of layer il.

    Heads are contiguous blocks of Dh inside each third (upstream view(T, 3, H, Dh)); RoPE
    rotates q and k at `positions`; K is cached after RoPE, at `slots`; `mask` [n_slots, T] is
    the cache's own (F16 for the flash path). The softmax scale is 1/√Dh. A cache with
    transposed V (`KVCache(v_trans=True)`) always takes the softmax path.
    """
    d = qkv.ne[0] // 3
    dh = d // n_heads
    t = qkv.ne[1]
    # three strided views of the qkv rows, no copy: [Dh, H, T] each
    q, k, v = (ops.view(qkv, (dh, n_heads, t), (dh * 4, qkv.nb[1]), i * d * 4) for i in range(3))
    q = ops.rope(q, positions, mode=rope_mode, base=rope_base)
    k = ops.rope(k, positions, mode=rope_mode, base=rope_base)
    cache.store(il, k, v, slots)
    g = qkv.graph
    return attention(q, cache.keys(g, il, n_slots), cache.values(g, il, n_slots), mask,
                     scale=dh ** -0.5, flash=flash and not cache.v_trans,
                     v_transposed=cache.v_trans)


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
    """

    def __init__(self, n_layer: int, n_kv_head: int, head_dim: int, capacity: int, *,
                 backend: "Backend | str | None" = None, dtype: GGMLType = F32,
                 v_trans: bool = False):
        if min(n_layer, n_kv_head, head_dim, capacity) < 1:
            raise ShapeError("KVCache: layers, heads, head_dim and capacity must be positive")
        if dtype not in (F32, F16):
            raise ShapeError(f"KVCache: dtype must be F32 or F16, got {GGMLType(dtype).name}")
        self.backend = get_backend(backend)
        L = self.lib = self.backend.lib
        self.n_layer, self.n_kv_head, self.head_dim = n_layer, n_kv_head, head_dim
        self.capacity, self.dtype, self.v_trans = capacity, GGMLType(dtype), bool(v_trans)
        self._ctx = L.ggml_init(_lib.ggml_init_params(
            (2 * n_layer + 4) * L.ggml_tensor_overhead(), None, True))
        if not self._ctx:
            raise BackendError("KVCache: ggml_init failed")
        # one row of Dh·Hkv values per slot: set_rows writes rows, views split heads for reading
        ne = (ctypes.c_int64 * 2)(head_dim * n_kv_head, capacity)
        ne_v = (ctypes.c_int64 * 2)(capacity, head_dim * n_kv_head) if v_trans else ne
        self._k, self._v = [], []
        for il in range(n_layer):
            for store, what, shape in ((self._k, "k", ne), (self._v, "v", ne_v)):
                p = L.ggml_new_tensor(self._ctx, int(self.dtype), 2, shape)
                L.ggml_set_name(p, f"cache.{il}.{what}".encode())
                store.append(Tensor.from_ptr(p, None, self))
        self.buffer = Buffer(L, L.ggml_backend_alloc_ctx_tensors(self._ctx, self.backend.ptr))
        self.positions = np.full(capacity, -1, dtype=np.int64)  # slot → absolute position
        self.evicted_max = -1  # newest position a ring overwrite has dropped
        self.reset()

    @property
    def nbytes(self) -> int:
        return self.buffer.size

    def reset(self) -> None:
        """Forget every row (the memory is zeroed, the slot map emptied)."""
        self.buffer.clear(0)
        self.positions[:] = -1
        self.evicted_max = -1

    @property
    def n_filled(self) -> int:
        return int((self.positions >= 0).sum())

    def reserve(self, positions, *, ring: bool = False) -> np.ndarray:
        """Assign slots to new absolute positions; returns I32 slot indices for `store`.

        Linear mode fills slots in order and fails when full; ring mode puts position p in
        slot p % capacity, overwriting the oldest row (a sliding window of `capacity` keys).
        """
        pos = np.asarray(positions, dtype=np.int64).reshape(-1)
        if ring:
            if len(pos) > self.capacity:
                raise ShapeError(f"KVCache: {len(pos)} new rows exceed the ring of {self.capacity}")
            slots = pos % self.capacity
            dropped = self.positions[slots]
            if (dropped >= 0).any():
                self.evicted_max = max(self.evicted_max, int(dropped.max()))
        else:
            start = self.n_filled
            if start + len(pos) > self.capacity:
                raise ShapeError(f"KVCache: {start} + {len(pos)} rows exceed capacity "
                                 f"{self.capacity}; make a larger cache")
            slots = np.arange(start, start + len(pos))
        self.positions[slots] = pos
        return slots.astype(np.int32)

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

    def store(self, il: int, k: Tensor, v: Tensor, slots: Tensor) -> None:
        """Write k, v of layer il into the slots given by I32 `slots` [T]. Each is [Dh, Hkv, T]
        (a strided view is fine while each row's heads are packed) or [Dh·Hkv, T]."""
        n = slots.ne[0]
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

    def keys(self, g: Graph, il: int, n_slots: int | None = None) -> Tensor:
        """View [Dh, Hkv, n_slots] of layer il's K rows in graph g (default: every slot)."""
        return self._view(g, self._k[il], n_slots)

    def values(self, g: Graph, il: int, n_slots: int | None = None) -> Tensor:
        """As keys(); with `v_trans` the view is [n_slots, Dh, Hkv] (slots fastest)."""
        if not self.v_trans:
            return self._view(g, self._v[il], n_slots)
        n = self._n_slots(n_slots)
        cache = self._v[il]
        return ops.view(cache, (n, self.head_dim, self.n_kv_head),
                        (cache.nb[1], self.head_dim * cache.nb[1]), graph=g)

    def _n_slots(self, n_slots: int | None) -> int:
        n = self.capacity if n_slots is None else n_slots
        if not 1 <= n <= self.capacity:
            raise ShapeError(f"KVCache: {n} slots requested of {self.capacity}")
        return n

    def _view(self, g: Graph, cache: Tensor, n_slots: int | None) -> Tensor:
        n = self._n_slots(n_slots)
        dh_bytes = self.head_dim * type_size(cache.type)[0]
        return ops.view(cache, (self.head_dim, self.n_kv_head, n), (dh_bytes, cache.nb[1]),
                        graph=g)

    def close(self) -> None:
        if self.buffer is not None:
            self.buffer.close()
            self.buffer = None
        if self._ctx:
            self.lib.ggml_free(self._ctx)
            self._ctx = None
