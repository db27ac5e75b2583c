"""Parity of moss_tts/nn/attention.py (attention, causal_mask, split/merge_heads) with the
numpy reference: MHA and GQA, causal and sliding-window masks, softmax and flash paths."""

import functools

import numpy as np
import pytest

from fixtures.compare import assert_close, assert_differs
from fixtures.reference import ops as ref
from fixtures.reference import transformer as ref_transformer
from moss_tts import nn
from moss_tts.errors import ShapeError
from moss_tts.ggml import F16, F32, Graph

# Softmax path, f32 K/V: two f32 matmuls and an f32 softmax over ≤ 12 keys; outputs ~1 are good
# to ~1e-6.
F32_ATOL = 1e-5
# K/V stored in f16 (rel. 2^-11 ≈ 5e-4 per value); the kernels also round q to f16 for the
# q·k dot, and flash on CPU accumulates V·softmax in f16 — compared against the f32-input
# reference the error is a few 1e-3.
F16_ATOL = 1e-2
# Flash path with f32 K/V: q is not rounded (K's vec-dot type is f32), so only the online
# softmax's reordering and the f16 mask (0 / −inf, exact) differ from the reference.
FLASH_F32_ATOL = 1e-5

DH = 16
HEADS = [(4, 4), (4, 2), (4, 1)]          # (Hq, Hkv): MHA, GQA 2:1, multi-query
# (name, Tq, Tk, window): queries are the last Tq of Tk positions
MASKS = [("causal_prefill", 12, 12, None), ("causal_tail", 5, 12, None),
         ("window_prefill", 12, 12, 4), ("window_tail", 5, 12, 4)]
# (name, flash, kv type, mask dtype, atol, V given transposed)
PATHS = [("softmax_f32", False, F32, np.float32, F32_ATOL, False),
         ("softmax_f16kv", False, F16, np.float32, F16_ATOL, False),
         ("softmax_vtrans_f32", False, F32, np.float32, F32_ATOL, True),
         ("softmax_vtrans_f16kv", False, F16, np.float16, F16_ATOL, True),
         ("flash_f16kv", True, F16, np.float16, F16_ATOL, False),
         ("flash_f32kv", True, F32, np.float16, FLASH_F32_ATOL, False)]


def _attention(q, k, v, mask, *, scale, flash, kv_type, v_transposed=False, rowwise=False):
    tq, hq, dh = q.shape
    tk, hkv, _ = k.shape
    g = Graph(name="attention", rowwise=rowwise)
    qt = g.input("q", (tq, hq, dh))                               # [Dh, Hq, Tq]
    kt = g.input("k", (tk, hkv, dh), kv_type)                     # [Dh, Hkv, Tk]
    if v_transposed:                                              # [Tk, Dh, Hkv], keys fastest
        vt = g.input("v", (hkv, dh, tk), kv_type)
        v = v.transpose(1, 2, 0)
    else:
        vt = g.input("v", (tk, hkv, dh), kv_type)
    mt = g.input("mask", (tq, tk), F16 if mask.dtype == np.float16 else F32)  # [Tk, Tq]
    g.output(nn.attention(qt, kt, vt, mt, scale=scale, flash=flash, v_transposed=v_transposed),
             "y", ndim=2)                                         # [Dh·Hq, Tq]
    return g.run({"q": q, "k": k, "v": v, "mask": mask})["y"]


def _qkv(rng, tq, tk, hq, hkv):
    q = (rng.standard_normal((tq, hq, DH)) * 1.5).astype(np.float32)  # peaked, not uniform
    k = rng.standard_normal((tk, hkv, DH)).astype(np.float32)
    v = rng.standard_normal((tk, hkv, DH)).astype(np.float32)
    return q, k, v


@pytest.mark.parametrize("path", PATHS, ids=lambda p: p[0])
@pytest.mark.parametrize("masking", MASKS, ids=lambda m: m[0])
@pytest.mark.parametrize("heads", HEADS, ids=lambda h: f"hq{h[0]}_hkv{h[1]}")
def test_attention_matches_reference(rng, heads, masking, path):
    hq, hkv = heads
    _, tq, tk, window = masking
    _, flash, kv_type, mask_dtype, atol, v_transposed = path
    q, k, v = _qkv(rng, tq, tk, hq, hkv)
    k_pos = np.arange(tk)
    q_pos = k_pos[tk - tq:]
    scale = 1.0 / np.sqrt(DH)
    mask = nn.causal_mask(q_pos, k_pos, window=window, dtype=mask_dtype)
    got = _attention(q, k, v, mask, scale=scale, flash=flash, kv_type=kv_type,
                     v_transposed=v_transposed)
    want = ref.attention(q, k, v, q_pos=q_pos, k_pos=k_pos, scale=scale, window=window)
    assert_close(got, want.reshape(tq, hq * DH), atol=atol, what="attention")
    # guard: a mask one key wider (window + 1, or one future key for causal) must differ
    if window is not None:
        wider = ref.attention(q, k, v, q_pos=q_pos, k_pos=k_pos, scale=scale, window=window + 1)
    else:
        wider = ref.attention(q, k, v, q_pos=q_pos + 1, k_pos=k_pos, scale=scale, causal=True)
    assert_differs(got, wider.reshape(tq, hq * DH), atol=atol, what="mask off by one")


@pytest.mark.parametrize("path", [p for p in PATHS if not p[1]], ids=lambda p: p[0])
def test_a_query_row_alone_equals_that_row_among_others_in_a_row_wise_graph(rng, path):
    """A streaming codec push holds as many frames as the clock lets pile up: in a row-wise
    graph a lone query row must give, bit for bit, what it gives among other rows (ggml
    multiplies one row through another kernel than two or more), and still the reference."""
    _, _, kv_type, mask_dtype, atol, v_transposed = path
    tk = 48
    q, k, v = _qkv(rng, 3, tk, 4, 2)
    k_pos = np.arange(tk)
    mask = nn.causal_mask(k_pos[-3:], k_pos, dtype=mask_dtype)
    run = functools.partial(_attention, k=k, v=v, scale=DH ** -0.5, flash=False, kv_type=kv_type,
                            v_transposed=v_transposed, rowwise=True)
    among = run(q, mask=mask)
    alone = run(q[2:], mask=mask[2:])
    assert np.array_equal(alone, among[2:]), np.abs(alone - among[2:]).max()
    want = ref.attention(q[2:], k, v, q_pos=k_pos[-1:], k_pos=k_pos, scale=DH ** -0.5)
    assert_close(alone, want.reshape(1, -1), atol=atol, what="the lone row")


@pytest.mark.parametrize("flash", [False, True], ids=["softmax", "flash"])
def test_attention_window_off_by_one_changes_result(rng, flash):
    """The ggml result itself must move when the mask's window is one key wider."""
    hq, hkv, t, window = 4, 2, 10, 3
    q, k, v = _qkv(rng, t, t, hq, hkv)
    pos = np.arange(t)
    dtype, kv_type = (np.float16, F16) if flash else (np.float32, F32)
    atol = F16_ATOL if flash else F32_ATOL
    run = lambda w: _attention(q, k, v, nn.causal_mask(pos, pos, window=w, dtype=dtype),  # noqa: E731
                               scale=DH ** -0.5, flash=flash, kv_type=kv_type)
    want = ref.attention(q, k, v, q_pos=pos, k_pos=pos, window=window).reshape(t, hq * DH)
    assert_close(run(window), want, atol=atol, what="window")
    assert_differs(run(window + 1), run(window), atol=atol, what="window + 1")


def test_gqa_maps_query_head_to_kv_head_by_integer_division(rng):
    """Hq=4, Hkv=2: query heads 0,1 read kv head 0 and 2,3 read kv head 1 (not h % Hkv)."""
    hq, hkv, t = 4, 2, 6
    q, k, v = _qkv(rng, t, t, hq, hkv)
    pos = np.arange(t)
    got = _attention(q, k, v, nn.causal_mask(pos, pos), scale=0.25, flash=False, kv_type=F32)
    want = ref.attention(q, k, v, q_pos=pos, k_pos=pos, scale=0.25)
    assert_close(got, want.reshape(t, -1), atol=F32_ATOL, what="gqa")
    # guard: interleaved mapping h % Hkv (heads 0,2 → kv 0) is a different result
    order = np.arange(hq) % hkv * (hq // hkv) + np.arange(hq) // hkv
    interleaved = ref.attention(q[:, order], k, v, q_pos=pos, k_pos=pos, scale=0.25)
    unshuffled = np.empty_like(interleaved)
    unshuffled[:, order] = interleaved
    assert_differs(got, unshuffled.reshape(t, -1), atol=F32_ATOL, what="h % Hkv mapping")


@pytest.mark.parametrize("window", [None, 1, 3])
def test_causal_mask_matches_reference_allowed_set(window):
    q_pos = np.array([0, 3, 4, 9])
    k_pos = np.array([-1, 0, 1, 2, 3, 4, 5, 8, 9, -1])      # −1: an empty cache slot
    valid = np.array([1, 1, 1, 0, 1, 1, 1, 1, 1, 1], bool)
    mask = nn.causal_mask(q_pos, k_pos, window=window, valid=valid)
    allowed = ref.attention_allowed(q_pos, k_pos, window=window, key_mask=valid & (k_pos >= 0))
    assert mask.dtype == np.float32 and mask.shape == (4, 10)
    np.testing.assert_array_equal(mask == 0, allowed)
    assert np.all(np.isneginf(mask[~allowed]))
    assert nn.causal_mask(q_pos, k_pos, dtype=np.float16).dtype == np.float16


def test_split_and_merge_heads_match_reference_layout(rng):
    """[H·Dh, T] → [Dh, H, T] takes heads as contiguous blocks of Dh (upstream view(T, H, Dh))."""
    t, h, dh = 3, 4, 8
    x = rng.standard_normal((t, h * dh)).astype(np.float32)
    g = Graph(name="heads")
    heads = nn.split_heads(g.input("x", (t, h * dh)), h)
    g.output(heads, "heads", ndim=3)
    g.output(nn.merge_heads(heads), "merged", ndim=2)
    out = g.run({"x": x})
    assert_close(out["heads"], x.reshape(t, h, dh), atol=0.0, what="split_heads")
    assert_close(out["merged"], x, atol=0.0, what="merge_heads")
    assert_differs(out["heads"], x.reshape(t, dh, h).transpose(0, 2, 1), atol=1e-3,
                   what="heads interleaved")


def test_attention_rejects_incompatible_heads():
    g = Graph(name="bad")
    q = g.input("q", (2, 4, DH))
    k, v = g.input("k", (2, 3, DH)), g.input("v", (2, 3, DH))
    with pytest.raises(ShapeError):
        nn.attention(q, k, v, None, scale=1.0)
    with pytest.raises(ShapeError):
        nn.attention(q, g.input("k8", (2, 2, 8)), g.input("v8", (2, 2, 8)), None, scale=1.0)
    with pytest.raises(ShapeError):
        nn.split_heads(g.input("x", (2, 30)), 4)


# --- split-head attention over a KV cache (project_heads + cached_attention) --------------------
# (D, Hq, Hkv, Dh): GQA 4:1 (a 32/8-like grouping) with Dh ≠ D/Hq, MHA, multi-query with Dh > D/Hq
SPLIT_SHAPES = [(48, 8, 2, 16), (32, 4, 4, 8), (24, 4, 1, 12)]
# (rope mode, theta): Qwen3's NEOX halves at 1e6, the interleaved pairs of GPT-2/GPT-J at 1e4
ROPES = [("neox", 1e6), ("normal", 1e4)]
# f32 against float64 at positions ~3000: ggml computes each RoPE angle p·θ^(−2i/Dh) in f32,
# so the low pairs rotate by up to ~3000·2^-24 ≈ 2e-4 rad off; measured ≤ 1.2e-4 on outputs
# |o| ≲ 3 (the projections and softmax alone are good to ~1e-6)
SPLIT_ATOL = 5e-4
PROMPT_ROWS = 7


def _split_weights(rng, d, hq, hkv, dh, qk_norm):
    w = {"q": rng.standard_normal((hq * dh, d)) * 0.4, "k": rng.standard_normal((hkv * dh, d)) * 0.4,
         "v": rng.standard_normal((hkv * dh, d)) * d ** -0.5}
    if qk_norm:
        w |= {"q_norm": rng.uniform(0.5, 2.0, dh), "k_norm": rng.uniform(0.5, 2.0, dh)}
    return {n: a.astype(np.float32) for n, a in w.items()}


def _split_attention(cache, w, a, positions, *, hq, hkv, dh, rope_mode, rope_base, flash):
    """ggml: rows a (T, D) at positions → attention output (T, Hq·Dh) through the cache
    (attending over every filled slot)."""
    t, d = a.shape
    n_slots = cache.n_filled + t
    g = Graph(name="split_attention")
    x = g.input("a", (t, d))
    ws = {n: g.input(n, arr.shape) for n, arr in w.items()}
    kv = nn.CacheView.inputs(g, cache, t, n_slots, flash=flash)
    q, k, v = nn.project_heads(x, ws["q"], ws["k"], ws["v"], n_head=hq, n_kv_head=hkv, head_dim=dh)
    o = nn.cached_attention(q, k, v, kv, 0, rope_mode=rope_mode, rope_base=rope_base,
                            q_norm=ws.get("q_norm"), k_norm=ws.get("k_norm"))
    g.output(o, "o", ndim=2)
    try:
        return g.run({"a": a, **w, **cache.feed(positions, n_slots, flash=flash)})["o"]
    finally:
        g.close()


@pytest.mark.parametrize("flash", [False, True], ids=["softmax", "flash"])
@pytest.mark.parametrize("qk_norm", [True, False], ids=["qk_norm", "no_qk_norm"])
@pytest.mark.parametrize("rope_cfg", ROPES, ids=lambda r: f"{r[0]}_{r[1]:g}")
@pytest.mark.parametrize("shape", SPLIT_SHAPES, ids=lambda s: "d{}_hq{}_hkv{}_dh{}".format(*s))
def test_split_head_attention_matches_reference(rng, shape, rope_cfg, qk_norm, flash):
    """Prefill PROMPT_ROWS rows, then one decode row, against the float64 reference over the
    whole sequence; guards: the other RoPE mode, and dropping the q/k norm, move the result."""
    d, hq, hkv, dh = shape
    mode, base = rope_cfg
    w = _split_weights(rng, d, hq, hkv, dh, qk_norm)
    a = rng.standard_normal((PROMPT_ROWS + 1, d)).astype(np.float32)
    # positions far from 0, where θ = 1e6 and 1e4 rotate the low pairs very differently
    pos = np.arange(PROMPT_ROWS + 1) + 3000
    want, _, _ = ref_transformer.split_head_attention_cached(
        a, pos, w, n_head=hq, n_kv_head=hkv, head_dim=dh, rope_mode=mode, rope_base=base)
    cache = nn.KVCache(1, hkv, dh, 32, dtype=F32)
    try:
        run = functools.partial(_split_attention, cache, w, hq=hq, hkv=hkv, dh=dh,
                                rope_mode=mode, rope_base=base, flash=flash)
        prefill = run(a[:PROMPT_ROWS], pos[:PROMPT_ROWS])
        decode = run(a[PROMPT_ROWS:], pos[PROMPT_ROWS:])
    finally:
        cache.close()
    assert_close(prefill, want[:PROMPT_ROWS], atol=SPLIT_ATOL, what="prefill")
    assert_close(decode, want[PROMPT_ROWS:], atol=SPLIT_ATOL, what="decode row")
    other = "normal" if mode == "neox" else "neox"
    wrong_mode, _, _ = ref_transformer.split_head_attention_cached(
        a, pos, w, n_head=hq, n_kv_head=hkv, head_dim=dh, rope_mode=other, rope_base=base)
    assert_differs(prefill, wrong_mode[:PROMPT_ROWS], atol=SPLIT_ATOL, what=f"RoPE {other}")
    if qk_norm:
        plain = {n: w[n] for n in ("q", "k", "v")}
        no_norm, _, _ = ref_transformer.split_head_attention_cached(
            a, pos, plain, n_head=hq, n_kv_head=hkv, head_dim=dh, rope_mode=mode, rope_base=base)
        assert_differs(prefill, no_norm[:PROMPT_ROWS], atol=SPLIT_ATOL, what="no q/k norm")


def test_fused_heads_adapter_equals_split_projections(rng):
    """The fused-QKV form is an adapter: one [3D, D] matrix == q, k, v projections stacked."""
    d, h, t = 32, 4, 5
    w = _split_weights(rng, d, h, h, d // h, False)
    fused = np.concatenate([w["q"], w["k"], w["v"]])
    a = rng.standard_normal((t, d)).astype(np.float32)
    g = Graph(name="fused")
    x = g.input("a", (t, d))
    parts = nn.fused_heads(nn.linear(x, g.input("w", fused.shape)), n_head=h)
    for name, part in zip("qkv", parts):
        g.output(part, name, ndim=3)
    got = g.run({"a": a, "w": fused})
    for name in "qkv":
        want = (a.astype(np.float64) @ w[name].T.astype(np.float64)).reshape(t, h, d // h)
        assert_close(got[name], want, atol=SPLIT_ATOL, what=f"fused {name}")
    with pytest.raises(ShapeError):
        nn.fused_heads(x, n_head=5)       # 32 rows are not 3 × 5 heads
