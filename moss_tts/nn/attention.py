"""Multi-head / grouped-query attention over split heads: projections (separate q/k/v, or the
fused-QKV adapter), optional per-head q/k RMSNorm, RoPE (interleaved or NEOX), and attention
over a KV cache (nn/kv_cache.py)."""

from __future__ import annotations

import functools

from ..errors import ShapeError
from ..ggml import ops
from ..ggml.graph import Tensor, type_size
from ..ggml.rowwise import plan
from .kv_cache import CacheView, KVCache
from .linear import linear
from .norms import head_rms_norm
from .rope import rope


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
    if not flash and tq == 1 and _pairs_one_row(q.graph, k, v):
        # ggml multiplies one row through another kernel than two or more (ggml/rowwise.py),
        # so in a row-wise graph a lone query row goes as a pair and the first is kept: a
        # stream's audio is the same whatever frames a push groups (the codec streams' ladder)
        two = attention(ops.concat(q, q, 2), k, v,
                        None if mask is None else ops.concat(mask, mask, 1), scale=scale,
                        v_transposed=v_transposed)                         # [Dh·Hq, 2]
        return ops.view(two, (dh * hq, 1))
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


def _pairs_one_row(g, k: Tensor, v: Tensor) -> bool:
    """Whether a row-wise graph takes a one-row product of k's and v's types as a pair."""
    return g.rowwise and any(plan(g.backend, t.type, False).pair for t in (k, v))


def project_heads(x: Tensor, wq: Tensor, wk: Tensor, wv: Tensor, *, n_head: int,
                  n_kv_head: int, head_dim: int, bq: Tensor | None = None,
                  bk: Tensor | None = None, bv: Tensor | None = None):
    """x [D, T] → q [Dh, Hq, T], k and v [Dh, Hkv, T] through separate projections (Qwen3:
    head_dim need not be D / Hq)."""
    t = x.ne[1]
    q = linear(x, wq, bq)
    k = linear(x, wk, bk)
    v = linear(x, wv, bv)
    if q.ne[0] != n_head * head_dim or k.ne[0] != v.ne[0] or k.ne[0] != n_kv_head * head_dim:
        raise ShapeError(f"project_heads: q {q.ne[0]} / k {k.ne[0]} / v {v.ne[0]} rows do not "
                         f"fit {n_head} / {n_kv_head} heads of {head_dim}")
    return (ops.reshape(q, head_dim, n_head, t), ops.reshape(k, head_dim, n_kv_head, t),
            ops.reshape(v, head_dim, n_kv_head, t))


def fused_heads(qkv: Tensor, *, n_head: int):
    """The fused-QKV adapter: rows [3·H·Dh, T] → q, k, v [Dh, H, T] as three strided views,
    no copy (heads are contiguous blocks of Dh inside each third, upstream view(T, 3, H, Dh))."""
    d = qkv.ne[0] // 3
    if qkv.ne[0] % 3 or d % n_head:
        raise ShapeError(f"fused_heads: {qkv.ne[0]} rows are not 3 × {n_head} heads")
    dh, t = d // n_head, qkv.ne[1]
    size = type_size(qkv.type)[0]
    return tuple(ops.view(qkv, (dh, n_head, t), (dh * size, qkv.nb[1]), i * d * size)
                 for i in range(3))


def cached_attention(q: Tensor, k: Tensor, v: Tensor, kv: CacheView, il: int, *,
                     rope_mode: str | None, rope_base: float, q_norm: Tensor | None = None,
                     k_norm: Tensor | None = None, norm_eps: float = 1e-6) -> Tensor:
    """q [Dh, Hq, T], k and v [Dh, Hkv, T] of new rows → attention output [Hq·Dh, T] over the
    cache of layer il (its first kv.n_slots slots), writing this graph's k and v at kv.slots.

    q/k RMSNorm (per head, over Dh) comes before RoPE (Qwen3); K is cached after RoPE; the
    scale is 1/√Dh. rope_mode None: no positional encoding at all (MossTTSLocal's depth
    transformer, P7 — causal order is all it sees). A cache with transposed V always takes the
    softmax path.
    """
    if q_norm is not None:
        q = head_rms_norm(q, q_norm, eps=norm_eps)
    if k_norm is not None:
        k = head_rms_norm(k, k_norm, eps=norm_eps)
    if rope_mode is not None:
        q = rope(q, kv.positions, mode=rope_mode, base=rope_base)
        k = rope(k, kv.positions, mode=rope_mode, base=rope_base)
    cache = kv.cache
    cache.store(il, k, v, kv.slots)
    g = q.graph
    over = functools.partial(attention, scale=q.ne[0] ** -0.5,
                             flash=kv.flash and not cache.v_trans, v_transposed=cache.v_trans)
    if not kv.windows:
        return over(q, cache.keys(g, il, kv.n_slots), cache.values(g, il, kv.n_slots), kv.mask)
    # each group of rows over its own window (a shared cache's sequence region), each one an
    # attention of its own: the ops and sums of that sequence's graph alone
    out, row = None, 0
    for (first, n, rows), mask in zip(kv.windows, kv.masks):
        q_rows = ops.view(q, q.ne[:2] + (rows,), q.nb[1:3], row * q.nb[2])
        part = over(q_rows, cache.keys(g, il, n, first), cache.values(g, il, n, first), mask)
        out = part if out is None else ops.concat(out, part, 1)
        row += rows
    return out


def cached_self_attention(qkv: Tensor, cache: KVCache, il: int, *, n_heads: int,
                          positions: Tensor, slots: Tensor, mask: Tensor, n_slots: int | None,
                          rope_mode: str, rope_base: float, flash: bool = True) -> Tensor:
    """Fused q|k|v rows [3·H·Dh, T] → attention output [H·Dh, T] over the cache of layer il
    (`fused_heads` + `cached_attention`; mask [n_slots, T], F16 for the flash path)."""
    view = CacheView(cache, positions, slots, mask,
                     cache.capacity if n_slots is None else n_slots, flash)
    q, k, v = fused_heads(qkv, n_head=n_heads)
    return cached_attention(q, k, v, view, il, rope_mode=rope_mode, rope_base=rope_base)
