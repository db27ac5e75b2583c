"""The Qwen3 backbone (models/qwen3.py) through the real GGUF writer and loader and a
DecodeSession, against the float64 Qwen3 layer reference: GQA 4:1, head_dim ≠ hidden/heads,
q/k RMSNorm, NEOX RoPE at θ = 1e6, SwiGLU; prefill then replayed one-row steps."""

import numpy as np
import pytest

from converters.gguf_io import write_gguf
from fixtures.compare import assert_close, assert_differs
from fixtures.reference import ops as ref_ops
from fixtures.reference.transformer import QWEN3_KEYS, qwen3_block
from moss_tts.errors import ConfigError
from moss_tts.ggml import GGUFFile, Weights, get_backend
from moss_tts.models import qwen3
from moss_tts.nn.session import DecodeSession

CFG = qwen3.Qwen3Config(hidden_size=48, num_hidden_layers=2, num_attention_heads=8,
                        num_key_value_heads=2, head_dim=16, intermediate_size=80,
                        rope_theta=1e6)
PROMPT, STEPS = 9, 6
# f32 through two blocks against float64 (|x| ≲ 6, ≤ 128-term dots, positions < 16 so RoPE
# angles are exact to ~1e-6): measured ≤ 4e-6
F32_ATOL = 5e-5


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    rng = np.random.default_rng(21)
    tensors = {}
    for name, shape in CFG.tensor_shapes().items():
        if name.endswith("norm.weight"):
            a = rng.uniform(0.6, 1.4, shape)
        else:
            a = rng.standard_normal(shape) * (0.5 if "attn_q" in name or "attn_k" in name
                                              else shape[1] ** -0.5)
        tensors[name] = a.astype(np.float32)
    path = write_gguf(tmp_path_factory.mktemp("qwen3") / "qwen3.gguf", tensors,
                      CFG.to_metadata(), kind="test", version=1)
    weights = Weights.load(path, get_backend(None, 1))
    yield path, tensors, weights
    weights.close()


def reference(tensors, x, rope_base=CFG.rope_theta):
    pos = np.arange(len(x))
    for i in range(CFG.num_hidden_layers):
        w = {n: tensors[f"blk.{i}.{n}"] for n in QWEN3_KEYS}
        x = qwen3_block(x, pos, w, n_head=CFG.num_attention_heads,
                        n_kv_head=CFG.num_key_value_heads, head_dim=CFG.head_dim,
                        rope_base=rope_base)
    return ref_ops.rms_norm(x, tensors["output_norm.weight"], 1e-6)


def session(weights):
    w = weights.require(CFG.tensor_shapes())
    layers = qwen3.layers_from_tensors(w, CFG)

    def build(g, n_rows, kv, variant):
        x = g.input("x", (n_rows, CFG.hidden_size))
        g.output(qwen3.forward(x, layers, w["output_norm.weight"], CFG, kv=kv), "h", ndim=2)

    return DecodeSession(build, backend=weights.backend, n_layer=CFG.num_hidden_layers,
                         n_kv_head=CFG.num_key_value_heads, head_dim=CFG.head_dim, capacity=64,
                         prefix="kv", name="test.qwen3")


def test_config_reads_back_from_llama_cpp_metadata_keys(model):
    path, _, _ = model
    with GGUFFile(path) as f:
        assert qwen3.Qwen3Config.from_gguf(f) == CFG
        assert f["qwen3.attention.head_count_kv"] == 2 and f["qwen3.rope.freq_base"] == 1e6


def test_prefill_and_cached_steps_match_reference(model, rng):
    _, tensors, weights = model
    x = rng.standard_normal((PROMPT + STEPS, CFG.hidden_size)).astype(np.float32)
    want = reference(tensors, x)
    with session(weights) as s:
        got = [s.run({"x": x[:PROMPT]}, PROMPT)["h"]]
        got += [s.run({"x": x[k:k + 1]}, 1)["h"] for k in range(PROMPT, PROMPT + STEPS)]
        assert list(s.step_graphs) == [(None, 32)]
    got = np.concatenate(got)
    assert_close(got, want, atol=F32_ATOL, what="qwen3 prefill + steps")
    # guard: the same model at θ = 1e4 (the GPT-2 default) is a different result
    assert_differs(got, reference(tensors, x, rope_base=1e4), atol=F32_ATOL, what="θ = 1e4")


def test_step_at_a_shifted_position_is_detected(model, rng):
    _, tensors, weights = model
    x = rng.standard_normal((PROMPT + 1, CFG.hidden_size)).astype(np.float32)
    with session(weights) as s:
        s.run({"x": x[:PROMPT]}, PROMPT)
        s.position += 1
        got = s.run({"x": x[PROMPT:]}, 1)["h"]
    assert_differs(got, reference(tensors, x)[-1:], atol=F32_ATOL, what="position + 1")


def test_config_rejects_inconsistent_heads():
    with pytest.raises(ConfigError, match="not a multiple"):
        qwen3.Qwen3Config(48, 2, 8, 3, 16, 80, 1e6)
    with pytest.raises(ConfigError, match="even head_dim"):
        qwen3.Qwen3Config(48, 2, 8, 2, 15, 80, 1e6)
