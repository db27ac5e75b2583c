"""KV-cache parity set (design §5) for `KVCache` in moss_tts/nn/attention.py.

A 2-layer GPT-2 + RoPE stack (docs/upstream-notes.md §nano-2.2) and a codec-style windowed stack
(docs/upstream-notes.md §codecs-1.4) are built here from `nn` functions; every cached schedule
(prefill + decode, chunked prefill, single-row steps, a replayed fixed-capacity graph, a ring
buffer) is compared with fixtures/reference/transformer.py run over the full sequence.
"""

import functools

import numpy as np
import pytest

from fixtures.compare import assert_close, assert_differs
from fixtures.reference import shared_cache as shared_ref
from fixtures.reference import transformer as ref
from moss_tts import nn
from moss_tts.errors import ShapeError
from moss_tts.ggml import F16, F32, I32, Graph, ops

N_LAYER, D, N_HEAD, FF = 2, 32, 4, 128
DH = D // N_HEAD
EPS, ROPE_BASE = 1e-5, 10000.0
CAPACITY = 16
WINDOW = 4

# f32 cache: two layers of f32 matmuls, norms and softmax against the float64 reference; with
# a residual stream of size up to ~7, rounding reaches ~1e-5 (measured ≤ 9.5e-6).
F32_ATOL = 5e-5
# f16 cache: each K/V value is stored with rel. error 2^-11 and the kernels round q to f16 for
# the q·k dot (flash also accumulates V in f16); through two layers the output moves by
# ~1e-2 (measured ≤ 8.4e-3). Every guard below still moves the result far past this.
F16_ATOL = 5e-2
# The same graph and the same inputs (after reset) must reproduce the result bit for bit: ggml's
# CPU kernels give each output element to one thread, so there is no reduction-order noise.
REPEAT_ATOL = 0.0

# Attention paths: "softmax" (mul_mat + soft_max), "flash" (ggml_flash_attn_ext, F16 mask),
# "vtrans" (softmax over a cache that stores V transposed, KVCache(v_trans=True)) and
# "flash_heads" (flash over a cache that keeps each head's slots together, head_major=True).
# (id, cache type, attention path, tolerance)
PATHS = [("f32_cache", F32, "softmax", F32_ATOL), ("f32_cache_flash", F32, "flash", F32_ATOL),
         ("f32_cache_vtrans", F32, "vtrans", F32_ATOL),
         ("f32_cache_flash_heads", F32, "flash_heads", F32_ATOL),
         ("f16_cache", F16, "softmax", F16_ATOL), ("f16_cache_flash", F16, "flash", F16_ATOL),
         ("f16_cache_vtrans", F16, "vtrans", F16_ATOL),
         ("f16_cache_flash_heads", F16, "flash_heads", F16_ATOL)]
path_param = pytest.mark.parametrize("path", PATHS, ids=[p[0] for p in PATHS])

GPT2_SHAPES = {
    "ln_1.weight": (D,), "ln_1.bias": (D,), "attn.c_attn.weight": (3 * D, D),
    "attn.c_attn.bias": (3 * D,), "attn.c_proj.weight": (D, D), "attn.c_proj.bias": (D,),
    "ln_2.weight": (D,), "ln_2.bias": (D,), "mlp.fc_in.weight": (FF, D), "mlp.fc_in.bias": (FF,),
    "mlp.fc_out.weight": (D, FF), "mlp.fc_out.bias": (D,),
}
CODEC_SHAPES = {
    "norm1.weight": (D,), "norm1.bias": (D,), "self_attn.in_proj.weight": (3 * D, D),
    "self_attn.out_proj.weight": (D, D), "layer_scale_1.scale": (D,), "norm2.weight": (D,),
    "norm2.bias": (D,), "ffn.0.weight": (FF, D), "ffn.2.weight": (D, FF),
    "layer_scale_2.scale": (D,),
}
assert set(GPT2_SHAPES) == set(ref.GPT2_KEYS) and set(CODEC_SHAPES) == set(ref.CODEC_KEYS)


# --- the stacks under test, built from nn functions ---------------------------------------------
def _cached_attention(qkv, *, g, cache, il, pos, slots, mask, n_slots, attn):
    """Fused qkv [3D, T] → [D, T]: split q|k|v, RoPE, write k, v into the cache, attend over it."""
    t = qkv.ne[1]
    # qkv[:, i·D:(i+1)·D] for q, k, v: column views of the fused projection
    q, k, v = (nn.split_heads(qkv.view((D, t), (qkv.nb[1],), i * D * 4), N_HEAD)
               for i in range(3))                                           # [Dh, H, T] each
    q = nn.rope(q, pos, mode="normal", base=ROPE_BASE)
    k = nn.rope(k, pos, mode="normal", base=ROPE_BASE)                      # cached after RoPE
    cache.store(il, k, v, slots)
    # keys [Dh, H, n_slots]; values the same, or [n_slots, Dh, H] from a transposed cache
    keys, values = cache.keys(g, il, n_slots), cache.values(g, il, n_slots)
    assert cache.v_trans == (attn == "vtrans") and cache.head_major == (attn == "flash_heads")
    return nn.attention(q, keys, values, mask, scale=DH ** -0.5, flash=_flash(attn),
                        v_transposed=cache.v_trans)                         # [D, T]


def _gpt2_layer(x, w, attend):
    """Pre-LN GPT-2 block with RoPE: x += c_proj(attn(ln_1 x)); x += mlp(ln_2 x)."""
    h = nn.layer_norm(x, w["ln_1.weight"], w["ln_1.bias"], eps=EPS)
    o = attend(nn.linear(h, w["attn.c_attn.weight"], w["attn.c_attn.bias"]))
    x = x + nn.linear(o, w["attn.c_proj.weight"], w["attn.c_proj.bias"])
    m = nn.layer_norm(x, w["ln_2.weight"], w["ln_2.bias"], eps=EPS)
    return x + nn.mlp(m, w["mlp.fc_in.weight"], w["mlp.fc_out.weight"], activation="gelu_tanh",
                      b_in=w["mlp.fc_in.bias"], b_out=w["mlp.fc_out.bias"])


def _codec_layer(x, w, attend):
    """Codec layer: x += ls1·out_proj(attn(norm1 x)); x += ls2·ffn(norm2 x) (no biases)."""
    h = nn.layer_norm(x, w["norm1.weight"], w["norm1.bias"], eps=EPS)
    o = attend(nn.linear(h, w["self_attn.in_proj.weight"]))
    x = x + nn.layer_scale(nn.linear(o, w["self_attn.out_proj.weight"]), w["layer_scale_1.scale"])
    m = nn.layer_norm(x, w["norm2.weight"], w["norm2.bias"], eps=EPS)
    f = nn.mlp(m, w["ffn.0.weight"], w["ffn.2.weight"], activation="gelu_erf")
    return x + nn.layer_scale(f, w["layer_scale_2.scale"])


def _flash(attn: str) -> bool:
    return attn.startswith("flash")


FAMILIES = {"gpt2": (GPT2_SHAPES, _gpt2_layer), "codec": (CODEC_SHAPES, _codec_layer)}


def build_stack(cache, family, t, *, n_slots=None, attn="softmax"):
    """Graph over t new rows. Inputs: x (T, D), pos and slots I32 (T,), mask (T, n_slots) (F16
    for flash), weights `backbone.<il>.<name>`. Output y (T, D). n_slots defaults to the whole
    cache, which gives a fixed-shape graph that can be replayed."""
    n = cache.capacity if n_slots is None else n_slots
    g = Graph(name=f"{family}_stack")
    x = g.input("x", (t, D))                                                  # [D, T]
    pos, slots = g.input("pos", (t,), I32), g.input("slots", (t,), I32)
    mask = g.input("mask", (t, n), F16 if _flash(attn) else F32)         # [n, T] additive
    shapes, layer = FAMILIES[family]
    for il in range(N_LAYER):
        w = {name: g.input(f"backbone.{il}.{name}", shape) for name, shape in shapes.items()}
        attend = functools.partial(_cached_attention, g=g, cache=cache, il=il, pos=pos,
                                   slots=slots, mask=mask, n_slots=n, attn=attn)
        x = ops.name(layer(x, w, attend), f"backbone.{il}.out")
    g.output(x, "y", ndim=2)
    return g


def run_rows(cache, family, weights, x, positions, *, attn="softmax", ring=False, window=None,
             exact_prefix=False, graph=None, hide_key=None):
    """Host side of one step: reserve slots, build the mask, build (or replay `graph`), run.

    exact_prefix views only the filled slots (linear caches); hide_key masks one more slot."""
    positions = np.asarray(positions, dtype=np.int32)
    slots = cache.reserve(positions, ring=ring)
    n = cache.n_filled if exact_prefix else None
    mask = cache.mask(positions, window=window, n_slots=n,
                      dtype=np.float16 if _flash(attn) else np.float32)
    if hide_key is not None:
        mask[:, hide_key] = -np.inf
    g = graph or build_stack(cache, family, len(positions), n_slots=n, attn=attn)
    feed = {"x": x, "pos": positions, "slots": slots, "mask": mask}
    for il, w in enumerate(weights):
        feed |= {f"backbone.{il}.{name}": a for name, a in w.items()}
    return g.run(feed)["y"]


# --- references and inputs ------------------------------------------------------------------------
def reference_stack(family, x, positions, weights, *, window=None):
    for w in weights:
        if family == "gpt2":
            x = ref.gpt2_block(x, positions, w, n_head=N_HEAD, rope_mode="normal",
                               rope_base=ROPE_BASE, eps=EPS)
        else:
            x = ref.codec_block(x, positions, w, n_head=N_HEAD, window=window,
                                rope_base=ROPE_BASE, eps=EPS)
    return x


def random_weights(rng, family):
    """Per-layer weight dicts: norm gains/layer scales in [0.5, 1.5], small biases, matrices
    ~1/√in — except qkv at 0.3, so attention scores reach ~3 and the softmax is peaked."""
    layers = []
    for _ in range(N_LAYER):
        w = {}
        for name, shape in FAMILIES[family][0].items():
            if name.endswith((".scale", "ln_1.weight", "ln_2.weight", "norm1.weight",
                              "norm2.weight")):
                a = rng.uniform(0.5, 1.5, shape)
            elif len(shape) == 1:
                a = 0.1 * rng.standard_normal(shape)
            else:
                std = 0.3 if ("c_attn" in name or "in_proj" in name) else shape[1] ** -0.5
                a = std * rng.standard_normal(shape)
            w[name] = a.astype(np.float32)
        layers.append(w)
    return layers


def random_rows(rng, t):
    return rng.standard_normal((t, D)).astype(np.float32)


@pytest.fixture
def make_cache():
    made = []

    def make(capacity=CAPACITY, dtype=F32, attn="softmax"):
        cache = nn.KVCache(N_LAYER, N_HEAD, DH, capacity, dtype=dtype, v_trans=attn == "vtrans",
                           head_major=attn == "flash_heads")
        made.append(cache)
        return cache

    yield make
    for cache in made:
        cache.close()


# --- (a) prefill + decode, and the three sensitivity guards --------------------------------------
@path_param
def test_cached_decode_matches_full_recompute(rng, make_cache, path):
    _, dtype, attn, atol = path
    n = 9
    weights, x = random_weights(rng, "gpt2"), random_rows(rng, n + 1)
    full = reference_stack("gpt2", x, np.arange(n + 1), weights)
    cache = make_cache(dtype=dtype, attn=attn)
    prefill = run_rows(cache, "gpt2", weights, x[:n], np.arange(n), attn=attn)
    decode = run_rows(cache, "gpt2", weights, x[n:], [n], attn=attn)
    assert_close(prefill, full[:n], atol=atol, what="prefill rows")
    assert_close(decode, full[n:], atol=atol, what="decode row vs full recompute, last row")


@path_param
def test_cached_decode_guards_wrong_position_prefix_and_mask(rng, make_cache, path):
    """Each deliberately wrong input must move the decode row past the tolerance."""
    _, dtype, attn, atol = path
    n = 9
    weights, x = random_weights(rng, "gpt2"), random_rows(rng, n + 1)
    want = reference_stack("gpt2", x, np.arange(n + 1), weights)[n:]
    cache = make_cache(dtype=dtype, attn=attn)

    def decode(prompt, pos, hide_key=None):
        cache.reset()
        run_rows(cache, "gpt2", weights, prompt, np.arange(len(prompt)), attn=attn)
        return run_rows(cache, "gpt2", weights, x[n:], [pos], attn=attn, hide_key=hide_key)

    assert_close(decode(x[:n], n), want, atol=atol, what="decode (control)")
    assert_differs(decode(x[:n], n + 1), want, atol=atol, what="decode row at position n+1")
    assert_differs(decode(random_rows(rng, n), n), want, atol=atol, what="other prompt cached")
    assert_differs(decode(x[:n], n, hide_key=3), want, atol=atol, what="mask hides key 3")


# --- (b) chunked prefill ---------------------------------------------------------------------------
@path_param
def test_chunked_prefill_matches_one_shot_prefill(rng, make_cache, path):
    _, dtype, attn, atol = path
    t, bounds = 12, [0, 5, 9, 12]                      # three chunks: 5, 4, 3 rows
    weights, x = random_weights(rng, "gpt2"), random_rows(rng, t)
    full = reference_stack("gpt2", x, np.arange(t), weights)
    one_shot = run_rows(make_cache(dtype=dtype, attn=attn), "gpt2", weights, x, np.arange(t), attn=attn,
                        exact_prefix=True)
    cache = make_cache(dtype=dtype, attn=attn)
    chunked = np.concatenate([
        run_rows(cache, "gpt2", weights, x[a:b], np.arange(a, b), attn=attn, exact_prefix=True)
        for a, b in zip(bounds, bounds[1:])])
    assert_close(chunked, one_shot, atol=atol, what="chunked vs one-shot prefill")
    assert_close(chunked, full, atol=atol, what="chunked prefill vs reference")
    # guard: the last chunk placed one position late must differ
    cache.reset()
    for a, b in zip(bounds, bounds[1:]):
        shift = 1 if b == t else 0
        late = run_rows(cache, "gpt2", weights, x[a:b], np.arange(a, b) + shift, attn=attn,
                        exact_prefix=True)
    assert_differs(late, full[bounds[-2]:], atol=atol, what="last chunk one position late")


# --- (c) a chain of single-row steps -------------------------------------------------------------
@path_param
def test_single_row_steps_match_full_recompute(rng, make_cache, path):
    _, dtype, attn, atol = path
    t = 10
    weights, x = random_weights(rng, "gpt2"), random_rows(rng, t)
    full = reference_stack("gpt2", x, np.arange(t), weights)
    cache = make_cache(dtype=dtype, attn=attn)
    steps = np.concatenate([run_rows(cache, "gpt2", weights, x[i:i + 1], [i], attn=attn,
                                     exact_prefix=True) for i in range(t)])
    assert_close(steps, full, atol=atol, what="single-row steps vs full recompute")
    # guard: a chain that skips position 5 (a gap in the cache) must differ from row 5 on
    cache.reset()
    gap = np.concatenate([run_rows(cache, "gpt2", weights, x[i:i + 1], [i + (i >= 5)],
                                   attn=attn, exact_prefix=True) for i in range(t)])
    assert_differs(gap[5:], full[5:], atol=atol, what="chain with a skipped position")


# --- (d) reset ---------------------------------------------------------------------------------------
def test_reset_then_same_prompt_reproduces_first_result(rng, make_cache):
    n = 7
    weights, x = random_weights(rng, "gpt2"), random_rows(rng, n + 1)
    cache = make_cache()

    def prompt_then_decode():
        first = run_rows(cache, "gpt2", weights, x[:n], np.arange(n))
        return np.concatenate([first, run_rows(cache, "gpt2", weights, x[n:], [n])])

    before = prompt_then_decode()
    cache.reset()
    run_rows(cache, "gpt2", weights, random_rows(rng, 12), np.arange(12))   # another request
    cache.reset()
    assert cache.n_filled == 0 and np.all(cache.positions == -1)
    after = prompt_then_decode()
    assert_close(after, before, atol=REPEAT_ATOL, what="same prompt after reset")
    assert_close(after, reference_stack("gpt2", x, np.arange(n + 1), weights), atol=F32_ATOL,
                 what="after reset vs reference")


# --- (e) one fixed-capacity decode graph, built once, replayed ------------------------------------
@path_param
def test_fixed_capacity_decode_graph_built_once_replays_every_step(rng, make_cache, path):
    _, dtype, attn, atol = path
    n_prompt, t = 6, 12
    weights, x = random_weights(rng, "gpt2"), random_rows(rng, t)
    full = reference_stack("gpt2", x, np.arange(t), weights)
    cache = make_cache(dtype=dtype, attn=attn)
    prefill = run_rows(cache, "gpt2", weights, x[:n_prompt], np.arange(n_prompt), attn=attn)
    assert_close(prefill, full[:n_prompt], atol=atol, what="prefill")

    graph = build_stack(cache, "gpt2", 1, attn=attn)          # mask over all CAPACITY slots
    builds = []
    build = graph.build
    graph.build = lambda: builds.append(1) or build()
    nodes, cgraph = None, None
    for i in range(n_prompt, t):
        y = run_rows(cache, "gpt2", weights, x[i:i + 1], [i], attn=attn, graph=graph)
        assert_close(y, full[i:i + 1], atol=atol, what=f"replayed decode step at position {i}")
        if cgraph is None:
            nodes, cgraph = graph.n_nodes, graph.cgraph
        assert graph.cgraph == cgraph and graph.n_nodes == nodes
    assert len(builds) == 1, f"decode graph built {len(builds)} times for {t - n_prompt} steps"


# --- (f) sliding window: ring buffer and windowed mask ---------------------------------------------
WINDOW_CASES = [  # (id, ring, capacity, chunk sizes) over 3·WINDOW rows
    ("ring_capacity_eq_window", True, WINDOW, [WINDOW] + [1] * (2 * WINDOW)),
    ("ring_capacity_window_plus_chunk", True, WINDOW + 2, [3] * 4),
    ("linear_cache_window_mask", False, 3 * WINDOW, [5, 4, 3]),
]


@path_param
@pytest.mark.parametrize("case", WINDOW_CASES, ids=[c[0] for c in WINDOW_CASES])
def test_windowed_cache_matches_reference_over_long_sequence(rng, make_cache, case, path):
    _, ring, capacity, chunks = case
    _, dtype, attn, atol = path
    t = 3 * WINDOW
    weights, x = random_weights(rng, "codec"), random_rows(rng, t)
    pos = np.arange(t)
    full = reference_stack("codec", x, pos, weights, window=WINDOW)
    cache = make_cache(capacity=capacity, dtype=dtype, attn=attn)
    bounds = np.cumsum([0] + chunks)
    got = np.concatenate([
        run_rows(cache, "codec", weights, x[a:b], pos[a:b], attn=attn, ring=ring, window=WINDOW)
        for a, b in zip(bounds, bounds[1:])])
    assert_close(got, full, atol=atol, what=f"{case[0]} vs reference (window {WINDOW})")
    # guard: one more key in the window is a different model
    wider = reference_stack("codec", x, pos, weights, window=WINDOW + 1)
    assert_differs(got, wider, atol=atol, what="window + 1")


def test_ring_cache_never_silently_drops_keys_a_chunk_still_needs(rng, make_cache):
    """capacity == window and a 3-row chunk once the ring is full: writing the chunk evicts keys
    its own first rows still need (position p needs p−W+1 … p). The cache must refuse (ShapeError)
    or still give the right answer — never a silently wrong result."""
    t, chunks = 3 * WINDOW, [WINDOW, 3, 3, 2]
    weights, x = random_weights(rng, "codec"), random_rows(rng, t)
    pos = np.arange(t)
    full = reference_stack("codec", x, pos, weights, window=WINDOW)
    cache = make_cache(capacity=WINDOW)
    bounds = np.cumsum([0] + chunks)
    try:
        got = np.concatenate([
            run_rows(cache, "codec", weights, x[a:b], pos[a:b], ring=True, window=WINDOW)
            for a, b in zip(bounds, bounds[1:])])
    except ShapeError:
        return
    assert_close(got, full, atol=F32_ATOL, what="ring of capacity == window, 3-row chunks")


# --- (g) f16 cache -----------------------------------------------------------------------------------
@pytest.mark.parametrize("attn", ["softmax", "flash", "vtrans", "flash_heads"])
def test_f16_cache_matches_f32_reference_within_f16_tolerance(rng, make_cache, attn):
    """Prefill + decode through an F16 cache against the f32/f64 reference; the guard shows the
    f16 rounding is real (the F16 run is not bit-identical to the F32 run)."""
    n = 10
    weights, x = random_weights(rng, "gpt2"), random_rows(rng, n + 2)
    full = reference_stack("gpt2", x, np.arange(n + 2), weights)
    outs = {}
    for dtype in (F16, F32):
        cache = make_cache(dtype=dtype, attn=attn)
        rows = [run_rows(cache, "gpt2", weights, x[:n], np.arange(n), attn=attn)]
        rows += [run_rows(cache, "gpt2", weights, x[i:i + 1], [i], attn=attn)
                 for i in (n, n + 1)]
        outs[dtype] = np.concatenate(rows)
    half = make_cache(dtype=F16).nbytes
    assert half < make_cache(dtype=F32).nbytes
    assert_close(outs[F16], full, atol=F16_ATOL, what="f16 cache vs reference")
    assert_close(outs[F32], full, atol=F32_ATOL, what="f32 cache vs reference")
    assert_differs(outs[F16], outs[F32], atol=0.0, what="f16 cache vs f32 cache")


def test_cache_rejects_overflow_and_mismatched_rows(make_cache):
    cache = make_cache(capacity=4)
    cache.reserve(np.arange(3))
    with pytest.raises(ShapeError):
        cache.reserve(np.arange(3, 5))
    with pytest.raises(ShapeError):
        cache.reserve(np.arange(5), ring=True)
    g = Graph(name="bad_store")
    k = g.input("k", (2, N_HEAD, DH))
    with pytest.raises(ShapeError):
        cache.store(0, k, k, g.input("slots", (3,), I32))
    with pytest.raises(ShapeError):
        cache.keys(g, 0, 5)


def test_transposed_cache_views_and_flash_refusal(make_cache):
    """A v_trans cache hands out V as [n_slots, Dh, H] (slots fastest) and K as usual; flash
    attention, which needs V rows per slot, refuses it with a ShapeError rather than a wrong
    answer or an abort inside ggml."""
    cache = make_cache(attn="vtrans")
    g = Graph(name="vtrans_views")
    keys, values = cache.keys(g, 0, 8), cache.values(g, 0, 8)
    assert keys.ne[:3] == (DH, N_HEAD, 8) and values.ne[:3] == (8, DH, N_HEAD)
    assert values.nb[1] == CAPACITY * 4 and values.nb[2] == DH * CAPACITY * 4
    q = g.input("q", (2, N_HEAD, DH))
    mask = g.input("mask", (2, 8), F16)
    with pytest.raises(ShapeError, match="untransposed"):
        nn.attention(q, keys, values, mask, scale=1.0, flash=True, v_transposed=True)
    with pytest.raises(ShapeError):
        nn.attention(q, keys, values, mask, scale=1.0)       # shape says transposed: refused


@pytest.mark.parametrize("dtype", [F32, F16], ids=["f32", "f16"])
def test_head_major_cache_attends_bit_equal_to_slot_major(rng, make_cache, dtype):
    """A head-major cache only moves where each (slot, head) row lives: flash attention reads the
    same values in the same order, so prefill and single-row steps give bit-equal outputs; the
    guard (one key hidden) shows the comparison sees the cache."""
    n = 9
    weights, x = random_weights(rng, "gpt2"), random_rows(rng, n + 3)
    outs = {}
    for attn in ("flash", "flash_heads"):
        cache = make_cache(dtype=dtype, attn=attn)
        rows = [run_rows(cache, "gpt2", weights, x[:n], np.arange(n), attn=attn)]
        rows += [run_rows(cache, "gpt2", weights, x[i:i + 1], [i], attn=attn)
                 for i in range(n, n + 3)]
        outs[attn] = np.concatenate(rows)
    assert_close(outs["flash_heads"], outs["flash"], atol=REPEAT_ATOL, what="head-major cache")
    cache = make_cache(dtype=dtype, attn="flash_heads")
    run_rows(cache, "gpt2", weights, x[:n], np.arange(n), attn="flash_heads")
    hidden = run_rows(cache, "gpt2", weights, x[n:n + 1], [n], attn="flash_heads", hide_key=3)
    assert_differs(hidden, outs["flash"][n:n + 1], atol=F32_ATOL, what="a hidden key")


def test_head_major_cache_views_and_transposed_refusal(make_cache):
    """A head-major cache hands out K and V as [Dh, H, n_slots] with each head's slots one row
    apart (heads `capacity` rows apart), and refuses to be transposed too."""
    cache = make_cache(attn="flash_heads")
    g = Graph(name="head_major_views")
    keys, values = cache.keys(g, 0, 8), cache.values(g, 0, 8)
    assert keys.ne[:3] == values.ne[:3] == (DH, N_HEAD, 8)
    assert keys.nb[1] == CAPACITY * DH * 4 and keys.nb[2] == DH * 4
    with pytest.raises(ShapeError, match="head-major"):
        nn.KVCache(N_LAYER, N_HEAD, DH, CAPACITY, v_trans=True, head_major=True)


# --- (h) several sequences in one cache ----------------------------------------------------------
def _seen(cache, seq, q_pos):
    """What rows of `seq` at positions q_pos see through its region's window mask, as
    (sequence, position) pairs read from the slot table."""
    first, size = cache.region(seq)
    mask = cache.window_mask(q_pos, first, size)
    return shared_ref.seen_through_mask(mask, cache.seq_ids[first:first + size],
                                        cache.positions[first:first + size])


def test_shared_cache_regions_keep_each_row_to_its_own_sequence(make_cache):
    """Three sequences in regions of their own, written interleaved (as a batched decode
    writes them); one released and its region taken by a fourth: position p of a sequence lies
    in slot first + p, and each query row sees exactly its own sequence's rows at positions ≤
    its own (fixtures/reference/shared_cache.py), never another's."""
    cache = make_cache(capacity=40)
    assert [cache.place(s, n) for s, n in ((0, 8), (1, 8), (2, 16))] == [0, 8, 16]
    written = {0: [], 1: [], 2: []}

    def write(seq, positions):
        slots = cache.reserve(positions, seq=seq)
        np.testing.assert_array_equal(slots, cache.region(seq)[0] + np.asarray(positions))
        written.setdefault(seq, []).extend(positions)

    write(0, [0, 1, 2])
    write(1, [0, 1])
    for p in range(2):                       # batched steps: one row of each sequence
        cache.reserve([3 + p, 2 + p, p], seq=np.array([0, 1, 2]))
        for s, q in ((0, 3 + p), (1, 2 + p), (2, p)):
            written[s].append(q)
    for seq, q_pos in ((0, [4, 2]), (1, [3]), (2, [1, 0])):
        assert _seen(cache, seq, q_pos) == shared_ref.visible_rows([seq] * len(q_pos), q_pos,
                                                                   written)
    assert cache.free(0) == 5 and cache.n_filled == 6 and not cache.fits(9)
    del written[0]
    assert cache.place(3, 8) == 0 and not cache.fits(9)   # the first fit: the freed region
    write(3, list(range(7)))
    for seq, q_pos in ((3, [6, 2]), (1, [3])):
        assert _seen(cache, seq, q_pos) == shared_ref.visible_rows([seq] * len(q_pos), q_pos,
                                                                   written)
    # guard: a mask over the whole cache, not the region, sees other sequences' rows
    loose = shared_ref.seen_through_mask(cache.mask([6]), cache.seq_ids, cache.positions)
    assert loose != shared_ref.visible_rows([3], [6], written)


def test_one_sequence_cache_fills_slots_in_order_as_before(make_cache):
    cache = make_cache(capacity=8)
    assert list(cache.reserve([0, 1, 2])) == [0, 1, 2] and list(cache.reserve([3])) == [3]
    assert cache.span == cache.n_filled == 4 and np.all(cache.seq_ids == -1)
    np.testing.assert_array_equal(cache.mask([3], n_slots=4),
                                  nn.causal_mask([3], [0, 1, 2, 3]))


def test_shared_cache_refuses_a_ring_an_unplaced_sequence_and_overflow(make_cache):
    cache = make_cache(capacity=8)
    with pytest.raises(ShapeError, match="ring holds one sequence"):
        cache.reserve([0], ring=True, seq=0)
    with pytest.raises(ShapeError, match="no region"):
        cache.reserve([0], seq=0)
    cache.place(0, 4)
    cache.reserve([0, 1, 2], seq=0)
    with pytest.raises(ShapeError, match="outside sequence 0's region of 4"):
        cache.reserve([3, 4], seq=0)
    with pytest.raises(ShapeError, match="no region of 5 slots"):
        cache.place(1, 5)
    with pytest.raises(ShapeError, match="no region"):
        cache.place(0, 2)                        # it has one already
