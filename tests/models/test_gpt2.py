"""The GPT-2 + RoPE backbone (models/gpt2.py) through the real GGUF writer and loader, against
the numpy block reference: one-shot prefill, and a decode graph built once and replayed."""

import numpy as np
import pytest

from converters.gguf_io import write_gguf
from fixtures.compare import assert_close, assert_differs
from fixtures.reference import ops as ref_ops
from fixtures.reference.transformer import gpt2_block
from moss_tts.errors import ConfigError, ModelFileError
from moss_tts.ggml import GGUFFile, Graph, Weights
from moss_tts.models import gpt2
from moss_tts.nn import KVCache

CFG = gpt2.GPT2Config(n_embd=64, n_head=4, n_layer=2, n_inner=96)
F32_ATOL = 5e-5   # f32 through two blocks with ~30 accumulations per dot product
PROMPT, STEPS = 7, 5


def random_tensors(seed: int) -> dict[str, np.ndarray]:
    """Every tensor of the CFG backbone: norm gains near 1, everything else ~0.3 N(0, 1)."""
    rng = np.random.default_rng(seed)
    tensors = {}
    for i in range(CFG.n_layer):
        for name, shape in CFG.layer_shapes().items():
            scale = 1.0 if name.startswith("ln_") and name.endswith("weight") else 0.0
            tensors[f"h.{i}.{name}"] = (scale + 0.3 * rng.standard_normal(shape)).astype(np.float32)
    tensors["ln_f.weight"] = (1 + 0.1 * rng.standard_normal(CFG.n_embd)).astype(np.float32)
    tensors["ln_f.bias"] = (0.1 * rng.standard_normal(CFG.n_embd)).astype(np.float32)
    return tensors


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    tensors = random_tensors(7)
    meta = {f"test.{k}": v for k, v in vars(CFG).items() if v is not None}
    path = write_gguf(tmp_path_factory.mktemp("gpt2") / "gpt2.gguf", tensors, meta, kind="test",
                      version=1)
    return path, tensors


def reference(tensors, x, pos):
    """float64 reference of the CFG backbone over rows x (T, D) at positions pos."""
    for i in range(CFG.n_layer):
        w = {n: tensors[f"h.{i}.{n}"] for n in CFG.layer_shapes()}
        x = gpt2_block(x, pos, w, n_head=CFG.n_head)
    return ref_ops.layer_norm(x, tensors["ln_f.weight"], tensors["ln_f.bias"], eps=1e-5)


def build(w, cache, n_rows, n_slots, *, flash):
    return gpt2.build_cached_graph(Graph(name="gpt2"), w, CFG, cache, n_rows, n_slots, flash=flash)


def feed(cache, x, positions, n_slots, flash):
    return gpt2.cached_feed(cache, x, positions, n_slots, flash=flash)


def test_config_reads_back_from_gguf_metadata(model):
    path, _ = model
    with GGUFFile(path) as f:
        assert gpt2.GPT2Config.from_gguf(f, "test") == CFG
        with pytest.raises(ModelFileError, match="'other.n_embd' is missing"):
            gpt2.GPT2Config.from_gguf(f, "other")


def test_config_rejects_inconsistent_values():
    with pytest.raises(ConfigError, match="not divisible"):
        gpt2.GPT2Config(n_embd=65, n_head=4, n_layer=1)
    with pytest.raises(ConfigError, match="gelu_new"):
        gpt2.GPT2Config(n_embd=64, n_head=4, n_layer=1, activation_function="relu")


@pytest.mark.parametrize("flash", [False, True], ids=["softmax", "flash"])
def test_prefill_matches_reference(model, rng, flash):
    path, tensors = model
    x = rng.standard_normal((PROMPT, CFG.n_embd)).astype(np.float32)
    pos = np.arange(PROMPT)
    with Weights.load(path) as w, KVCache(CFG.n_layer, CFG.n_head, CFG.head_dim, 16) as cache:
        g = build(w, cache, PROMPT, PROMPT, flash=flash)
        got = g.run(feed(cache, x, pos, PROMPT, flash))["hidden"]
    want = reference(tensors, x, pos)
    assert_close(got, want, atol=F32_ATOL, what="prefill hidden")
    assert_differs(got, reference(tensors, x[::-1], pos),
                   atol=F32_ATOL, what="reversed prompt")


@pytest.mark.parametrize("flash", [False, True], ids=["softmax", "flash"])
def test_reused_decode_graph_matches_full_recompute(model, rng, flash):
    path, tensors = model
    capacity = PROMPT + STEPS
    x = rng.standard_normal((capacity, CFG.n_embd)).astype(np.float32)
    with Weights.load(path) as w, KVCache(CFG.n_layer, CFG.n_head, CFG.head_dim, capacity) as cache:
        build(w, cache, PROMPT, PROMPT, flash=flash).run(
            feed(cache, x[:PROMPT], np.arange(PROMPT), PROMPT, flash))
        step = build(w, cache, 1, capacity, flash=flash)  # built once, replayed
        nodes = step.n_nodes
        for p in range(PROMPT, capacity):
            got = step.run(feed(cache, x[p:p + 1], [p], capacity, flash))["hidden"]
            want = reference(tensors, x[:p + 1], np.arange(p + 1))[-1:]
            assert_close(got, want, atol=F32_ATOL, what=f"decode step at position {p}")
        assert step.n_nodes == nodes
    # guard: the last row rotated as if one position later is a different result
    shifted = np.arange(capacity)
    shifted[-1] += 1
    wrong = reference(tensors, x, shifted)[-1:]
    assert_differs(got, wrong, atol=F32_ATOL, what="decode row fed at the wrong position")
