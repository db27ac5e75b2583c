"""GGUF through ggml's C API: metadata, tensors in backend memory, and the bad-file errors."""

import subprocess
import sys

import gguf
import numpy as np
import pytest

from fixtures.compare import assert_close
from moss_tts.errors import ModelFileError
from moss_tts.ggml import GGUFFile, Graph, Weights, ops
from moss_tts.ggml.quant import quantize


def write_gguf(path, tensors: dict, meta: dict | None = None, kind: str | None = "test"):
    """tensors: name -> float32/float16/int32 array, or (raw uint8 blocks, numpy shape, qtype)."""
    w = gguf.GGUFWriter(str(path), "moss-test")
    if kind is not None:
        w.add_string("moss.kind", kind)
        w.add_uint32("moss.format_version", 1)
    for key, value in (meta or {}).items():
        if isinstance(value, bool):
            w.add_bool(key, value)
        elif isinstance(value, int):
            w.add_int64(key, value)
        elif isinstance(value, float):
            w.add_float32(key, value)
        elif isinstance(value, str):
            w.add_string(key, value)
        else:
            w.add_array(key, value)
    for name, arr in tensors.items():
        if isinstance(arr, tuple):
            raw, shape, qtype = arr  # shape: the bytes' shape (rows, row bytes)
            w.add_tensor(name, raw, raw_shape=shape, raw_dtype=qtype)
        else:
            w.add_tensor(name, arr)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


@pytest.fixture
def model_file(tmp_path, rng):
    tensors = {
        "blk.0.w": rng.standard_normal((6, 32)).astype(np.float32),
        "blk.0.h": rng.standard_normal((4, 32)).astype(np.float16),
        "tok.ids": np.arange(5, dtype=np.int32),
    }
    meta = {"moss.n_embd": 32, "moss.eps": 1e-5, "moss.name": "tiny", "moss.causal": True,
            "moss.sizes": [3, 1, 4], "moss.vocab": ["<pad>", "a", "b\u00e9"]}
    return write_gguf(tmp_path / "m.gguf", tensors, meta), tensors


def test_metadata_values_keep_their_types(model_file):
    path, _ = model_file
    with GGUFFile(path) as f:
        assert f["moss.n_embd"] == 32
        assert abs(f["moss.eps"] - 1e-5) < 1e-12
        assert f["moss.name"] == "tiny" and f["moss.causal"] is True
        assert f["moss.sizes"].tolist() == [3, 1, 4]
        assert f["moss.vocab"] == ["<pad>", "a", "b\u00e9"]
        assert f.get("moss.absent", 7) == 7 and "moss.n_embd" in f
        assert f.check_kind("test", version=1) == "test"


def test_missing_metadata_key_names_key_and_file(model_file):
    path, _ = model_file
    with GGUFFile(path) as f, pytest.raises(ModelFileError, match=r"m\.gguf.*'moss\.n_head' is missing"):
        f["moss.n_head"]


def test_tensor_table_shapes_and_types(model_file):
    path, tensors = model_file
    with GGUFFile(path) as f:
        assert f.tensors["blk.0.w"].shape == (6, 32) and f.tensors["blk.0.w"].ne == (32, 6, 1, 1)
        assert f.tensors["blk.0.h"].type.name == "F16"
        assert f.tensors["tok.ids"].type.name == "I32"


def test_weights_load_zero_copy_and_compute(model_file, rng):
    path, tensors = model_file
    with Weights.load(path) as w:
        assert w.zero_copy  # CPU backend computes from the mmap, no copy
        assert_close(w.read("blk.0.w"), tensors["blk.0.w"], atol=0, what="f32 tensor read back")
        assert_close(w.read("blk.0.h"), tensors["blk.0.h"].astype(np.float32), atol=0, what="f16")
        g = Graph(name="use-weights")
        x = g.input("x", (3, 32))
        g.output(ops.mul_mat(w["blk.0.w"], x), "y")
        xv = rng.standard_normal((3, 32)).astype(np.float32)
        assert_close(g.run({"x": xv})["y"], xv @ tensors["blk.0.w"].T, atol=1e-5, what="matmul")


def test_quantized_tensor_loads_and_dequantizes(tmp_path, rng):
    wv = rng.standard_normal((8, 64)).astype(np.float32)
    raw = quantize(wv, "q8_0")
    path = write_gguf(tmp_path / "q.gguf", {"w": (raw, raw.shape, gguf.GGMLQuantizationType.Q8_0)})
    with Weights.load(path) as w:
        back = w.read("w")
    # q8_0: per-32 block step d = max|x|/127 stored as f16: error ≤ d/2 + 127·d·2⁻¹¹ (scale rounding)
    step = np.abs(wv).reshape(8, 2, 32).max(axis=2, keepdims=True) / 127
    assert np.all(np.abs(back - wv).reshape(8, 2, 32) <= step * (0.5 + 127 / 2048) + 1e-6)
    assert np.abs(back - wv).max() > 0  # it really was quantized


def test_require_lists_every_problem_at_once(model_file):
    path, _ = model_file
    with Weights.load(path) as w:
        ok = w.require({"blk.0.w": (6, 32), "blk.0.h": (4, 32), "tok.ids": (5,),
                        "blk.0.bias": (6,)}, optional=("blk.0.bias",))
        assert ok["blk.0.bias"] is None
        with pytest.raises(ModelFileError) as e:
            w.require({"blk.0.w": (32, 6), "blk.0.missing": (2,)})
        msg = str(e.value)
        assert "4 tensor problem(s)" in msg  # wrong shape, missing, two unexpected extras
        assert "blk.0.w: expected shape (32, 6), got (6, 32)" in msg
        assert "blk.0.missing: missing" in msg and "unexpected tensor" in msg


def test_require_takes_a_numpy_shape_with_outer_ones_as_the_gguf_stores_it(model_file):
    """A (1, 6, 32) modulation-style table is written (6, 32): ggml's dimension count drops the
    outer 1s, so a declared numpy shape is compared in that form; another shape still fails."""
    path, _ = model_file
    with Weights.load(path) as w:
        assert w.require({"blk.0.w": (1, 6, 32), "blk.0.h": (1, 1, 4, 32), "tok.ids": (5,)},
                         strict=False)["blk.0.w"] is not None
        with pytest.raises(ModelFileError, match=r"blk.0.w: expected shape \(1, 32, 6\), got "
                                                 r"\(6, 32\)"):
            w.require({"blk.0.w": (1, 32, 6)}, strict=False)


def test_non_gguf_file_is_a_one_line_error(tmp_path):
    p = tmp_path / "model.safetensors"
    p.write_bytes(b"\x00" * 64)
    with pytest.raises(ModelFileError, match="not a GGUF file") as e:
        GGUFFile(p)
    assert "\n" not in str(e.value)


def test_missing_file_is_a_one_line_error(tmp_path):
    with pytest.raises(ModelFileError, match="no such file"):
        GGUFFile(tmp_path / "absent.gguf")


@pytest.mark.parametrize("where", ["header", "last tensor"])
def test_truncated_gguf_is_a_one_line_error(model_file, tmp_path, where):
    path, _ = model_file
    data = path.read_bytes()
    with GGUFFile(path) as f:
        end = f.data_offset + max(t.offset + t.nbytes for t in f.tensors.values())
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(data[: 100 if where == "header" else end - 1])
    with pytest.raises(ModelFileError, match="truncated|corrupt") as e:
        Weights.load(cut)
    assert "\n" not in str(e.value)


def test_wrong_kind_names_expected_and_found(model_file, tmp_path):
    path, _ = model_file
    with GGUFFile(path) as f, pytest.raises(ModelFileError, match="expected a codec GGUF, found a 'test' model"):
        f.check_kind("codec")
    plain = write_gguf(tmp_path / "plain.gguf", {"w": np.ones((2, 2), np.float32)}, kind=None)
    with GGUFFile(plain) as f, pytest.raises(ModelFileError, match="not a moss-tts GGUF"):
        f.check_kind("codec")
    with GGUFFile(path) as f, pytest.raises(ModelFileError, match="format version"):
        f.check_kind("test", version=2)


def test_cli_info_prints_kind_metadata_and_tensors(model_file):
    path, _ = model_file
    out = subprocess.run([sys.executable, "-m", "moss_tts", "info", str(path)],
                         capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert "kind test" in out.stdout and "moss.n_embd = 32" in out.stdout
    assert "blk.0.w" in out.stdout and "(6, 32)" in out.stdout


def test_cli_info_on_a_bad_file_prints_one_line_and_fails(tmp_path):
    p = tmp_path / "x.gguf"
    p.write_text("hello")
    out = subprocess.run([sys.executable, "-m", "moss_tts", "info", str(p)], capture_output=True,
                         text=True)
    assert out.returncode == 1 and out.stdout == ""
    assert out.stderr.count("\n") == 1 and out.stderr.startswith("error: ")
