"""Reading checkpoints: a torch.save zip (pytorch_model.bin) without torch, safely."""

import io
import pickle
import zipfile

import numpy as np
import pytest

from converters.checkpoint import TorchBinCheckpoint, fuse_weight_norm, open_checkpoint
from fixtures.torch_zip import write_torch_zip
from moss_tts.errors import ModelFileError


def test_torch_zip_tensors_read_back_exactly(tmp_path, rng):
    tensors = {"w": rng.standard_normal((3, 5)).astype(np.float32),
               "h": rng.standard_normal(7).astype(np.float16),
               "ids": np.arange(4, dtype=np.int64)}
    ckpt = TorchBinCheckpoint(write_torch_zip(tmp_path / "pytorch_model.bin", tensors))
    assert sorted(ckpt.keys()) == sorted(tensors)
    for name, arr in tensors.items():
        got = ckpt[name]
        assert got.dtype == arr.dtype and np.array_equal(got, arr), name


def test_open_checkpoint_prefers_safetensors_and_falls_back_to_bin(tmp_path, rng):
    from safetensors.numpy import save_file
    write_torch_zip(tmp_path / "pytorch_model.bin", {"a": np.ones(2, np.float32)})
    assert isinstance(open_checkpoint(tmp_path), TorchBinCheckpoint)
    save_file({"b": np.zeros(2, np.float32)}, str(tmp_path / "model.safetensors"))
    assert open_checkpoint(tmp_path).keys() == ["b"]


def test_pickle_naming_anything_but_tensors_is_refused(tmp_path):
    class Evil:
        def __reduce__(self):
            import os
            return (os.getcwd, ())
    buf = io.BytesIO()
    pickle.dump({"x": Evil()}, buf, protocol=2)
    path = tmp_path / "evil.bin"
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("archive/data.pkl", buf.getvalue())
    with pytest.raises(ModelFileError, match="unsupported object posix.getcwd|unsupported object os.getcwd"):
        TorchBinCheckpoint(path)


@pytest.mark.parametrize("content", [b"not a zip at all", None])
def test_non_torch_files_are_one_line_errors(tmp_path, content):
    path = tmp_path / "pytorch_model.bin"
    if content is None:
        with zipfile.ZipFile(path, "w") as z:
            z.writestr("something.txt", "x")
    else:
        path.write_bytes(content)
    with pytest.raises(ModelFileError) as e:
        TorchBinCheckpoint(path)
    assert "\n" not in str(e.value)


def test_weight_norm_fold_is_g_times_v_over_row_norm(rng):
    g = rng.standard_normal((4, 1, 1)).astype(np.float32)
    v = rng.standard_normal((4, 3, 1)).astype(np.float32)
    w = fuse_weight_norm(g, v)
    v2 = v[:, :, 0].astype(np.float64)
    want = g[:, 0, 0, None] * v2 / np.sqrt((v2 ** 2).sum(axis=1, keepdims=True))
    assert w.shape == (4, 3) and np.allclose(w, want, atol=1e-6)
