"""Write a moss-tts GGUF: metadata + tensors, matmul weights quantized through ggml itself,
written atomically (a temp file renamed into place, so no half-written model is ever seen)."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import gguf
import numpy as np

from moss_tts.errors import ConfigError
from moss_tts.ggml.quant import block_size, quantize
from moss_tts.ggml.types import GGMLType
from moss_tts.ggml.weights import KIND_KEY, VERSION_KEY

FLOAT_TYPES = (GGMLType.F32, GGMLType.F16, GGMLType.BF16)


def tensor_type(name: str, arr: np.ndarray, outtype: GGMLType, is_matmul) -> GGMLType:
    """Embeddings, norms, biases and anything not a matmul weight stay f32 (design §4); a matmul
    weight whose rows do not fit the block size falls back to f16."""
    if arr.dtype.kind in "iu" or not is_matmul(name, arr):
        return GGMLType.F32 if arr.dtype.kind == "f" else GGMLType.I32
    if outtype in FLOAT_TYPES or arr.shape[-1] % block_size(outtype) == 0:
        return outtype
    return GGMLType.F16


def write_gguf(path: str | os.PathLike, tensors: dict[str, np.ndarray], meta: dict, *,
               kind: str, version: int, outtype: "GGMLType | str" = GGMLType.F32,
               is_matmul=lambda name, arr: arr.ndim == 2 and name.endswith(".weight"),
               progress=None) -> Path:
    """Write tensors (numpy, any float dtype) and metadata to `path` atomically."""
    path = Path(path)
    outtype = GGMLType.parse(outtype)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".partial", dir=path.parent)
    os.close(fd)
    try:
        w = gguf.GGUFWriter(tmp, "moss-tts")
        w.add_string(KIND_KEY, kind)
        w.add_uint32(VERSION_KEY, version)
        for key, value in meta.items():
            _add_meta(w, key, value)
        for i, (name, arr) in enumerate(tensors.items()):
            arr = np.asarray(arr)
            t = tensor_type(name, arr, outtype, is_matmul)
            if t == GGMLType.F32:
                w.add_tensor(name, np.ascontiguousarray(arr, dtype=np.float32))
            elif t == GGMLType.I32:
                w.add_tensor(name, np.ascontiguousarray(arr, dtype=np.int32))
            else:
                raw = quantize(arr.reshape(-1, arr.shape[-1]), t)
                raw = raw.reshape(arr.shape[:-1] + (raw.shape[-1],))
                w.add_tensor(name, raw, raw_shape=raw.shape,
                             raw_dtype=gguf.GGMLQuantizationType(int(t)))
            if progress:
                progress(i + 1, len(tensors), name)
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.close()
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


_ARRAY_TYPES = {np.dtype(np.uint8): gguf.GGUFValueType.UINT8, np.dtype(np.int8): gguf.GGUFValueType.INT8,
                np.dtype(np.int32): gguf.GGUFValueType.INT32, np.dtype(np.int64): gguf.GGUFValueType.INT64,
                np.dtype(np.float32): gguf.GGUFValueType.FLOAT32,
                np.dtype(np.float64): gguf.GGUFValueType.FLOAT64}


def _add_meta(w: gguf.GGUFWriter, key: str, value) -> None:
    if isinstance(value, bool):
        w.add_bool(key, value)
    elif isinstance(value, (int, np.integer)):
        w.add_int64(key, int(value))
    elif isinstance(value, (float, np.floating)):
        w.add_float64(key, float(value))
    elif isinstance(value, str):
        w.add_string(key, value)
    elif isinstance(value, (bytes, list, tuple, np.ndarray)):
        if len(value) == 0:  # GGUF has no typed empty array (and gguf-py would skip it silently)
            raise ConfigError(f"GGUF metadata {key!r}: empty arrays cannot be stored")
        if isinstance(value, bytes):  # e.g. an embedded tokenizer model, stored as uint8
            w.add_key_value(key, value, gguf.GGUFValueType.ARRAY, sub_type=gguf.GGUFValueType.UINT8)
        elif isinstance(value, np.ndarray):
            if value.dtype not in _ARRAY_TYPES:
                raise ConfigError(f"GGUF metadata {key!r}: arrays of {value.dtype} are not stored")
            w.add_key_value(key, value.reshape(-1).tolist(), gguf.GGUFValueType.ARRAY,
                            sub_type=_ARRAY_TYPES[value.dtype])
        else:
            w.add_array(key, list(value))
    else:
        raise ConfigError(f"GGUF metadata {key!r}: cannot store a {type(value).__name__}")
