"""converters/gguf_io.py: what it writes reads back through ggml's GGUF reader, matmul weights
get the requested type, everything else stays f32, and a failed write leaves no file."""

import numpy as np
import pytest

from converters.gguf_io import fitted, weight_type, write_gguf
from fixtures.compare import assert_close
from moss_tts.errors import ConfigError, ShapeError
from moss_tts.ggml import GGUFFile, Weights
from moss_tts.ggml.types import GGMLType


@pytest.fixture
def tensors(rng):
    return {"blk.0.attn.weight": rng.standard_normal((8, 256)).astype(np.float32),  # fits q4_K
            "blk.0.norm.weight": rng.standard_normal(64).astype(np.float32),
            "blk.0.odd.weight": rng.standard_normal((4, 48)).astype(np.float32),  # 48 % 32 != 0
            "emb.weight": rng.standard_normal((10, 64)).astype(np.float16),
            "ids": np.arange(3, dtype=np.int64)}


@pytest.mark.parametrize("outtype", ["f32", "f16", "bf16", "q8_0", "q4_K"])
def test_types_and_values_round_trip(tmp_path, tensors, outtype):
    is_matmul = lambda name, arr: name.startswith("blk.") and arr.ndim == 2  # noqa: E731
    path = write_gguf(tmp_path / "m.gguf", tensors, {"moss.n": 3, "moss.eps": 1e-6,
                                                      "moss.names": ["a", "b"], "moss.blob": b"\x00\x01"},
                      kind="codec", version=2, outtype=outtype, is_matmul=is_matmul)
    with GGUFFile(path) as f:
        assert f.check_kind("codec", version=2) == "codec"
        assert f["moss.n"] == 3 and f["moss.eps"] == 1e-6 and f["moss.names"] == ["a", "b"]
        assert f["moss.blob"].tobytes() == b"\x00\x01"
        types = {n: t.type.name.lower() for n, t in f.tensors.items()}
    assert types["blk.0.attn.weight"] == outtype.lower()
    # rows that do not fit the block size fall back to f16 rather than fail
    assert types["blk.0.odd.weight"] == (outtype if outtype in ("f32", "f16", "bf16") else "f16")
    assert types["blk.0.norm.weight"] == "f32" and types["emb.weight"] == "f32"
    assert types["ids"] == "i32"
    with Weights.load(path) as w:
        assert_close(w.read("blk.0.norm.weight"), tensors["blk.0.norm.weight"], atol=0,
                     what="norm kept f32")
        tol = {"f32": 0, "f16": 2e-3, "bf16": 2e-2, "q8_0": 3e-2, "q4_K": 0.25}[outtype]
        assert_close(w.read("blk.0.attn.weight"), tensors["blk.0.attn.weight"], atol=tol,
                     what=f"{outtype} weight")


def test_failed_write_leaves_no_file(tmp_path, tensors):
    target = tmp_path / "m.gguf"
    with pytest.raises(ConfigError, match="cannot store"):
        write_gguf(target, tensors, {"moss.bad": object()}, kind="codec", version=1)
    assert list(tmp_path.iterdir()) == []
    with pytest.raises(ShapeError, match="unknown ggml type"):
        write_gguf(target, tensors, {}, kind="codec", version=1, outtype="q9_9")
    assert list(tmp_path.iterdir()) == []


def test_type_hook_decides_each_tensor(tmp_path, tensors):
    """`type_for(name, spec)` replaces the outtype/is_matmul policy; rows a K-quant cannot
    block still fall back to f16 through `fitted`."""
    picks = {"blk.0.attn.weight": GGMLType.Q4_K, "blk.0.odd.weight": GGMLType.Q4_K,
             "emb.weight": GGMLType.Q8_0}
    seen = []

    def type_for(name, spec):
        seen.append((name, tuple(spec.shape)))
        t = picks.get(name, GGMLType.I32 if spec.dtype.kind == "i" else GGMLType.F32)
        return fitted(t, spec)

    path = write_gguf(tmp_path / "m.gguf", tensors, {}, kind="codec", version=1,
                      outtype="q8_0", type_for=type_for)
    with GGUFFile(path) as f:
        types = {n: t.type for n, t in f.tensors.items()}
    assert seen == [(n, a.shape) for n, a in tensors.items()]
    assert types == {"blk.0.attn.weight": GGMLType.Q4_K, "blk.0.norm.weight": GGMLType.F32,
                     "blk.0.odd.weight": GGMLType.F16, "emb.weight": GGMLType.Q8_0,
                     "ids": GGMLType.I32}


@pytest.mark.parametrize("value", ["q8_1", "q8_K", "iq2_xxs"])
def test_weight_type_refuses_types_ggml_cannot_write_alone(value):
    with pytest.raises(ConfigError, match=f"{value.lower()}: not a weight type ggml can write"):
        weight_type(value)
    assert weight_type("q4_K") == GGMLType.Q4_K and weight_type("bf16") == GGMLType.BF16
