"""Quantize and dequantize through ggml itself (`ggml_quantize_chunk`, type traits), so a
converter writes exactly the blocks the kernels expect — every ggml type, K-quants included."""

from __future__ import annotations

import ctypes

import numpy as np

from ..errors import ShapeError
from . import lib as _lib
from .types import F16, F32, BF16, GGMLType, NUMPY_DTYPES, bf16_bits_to_float32, float32_to_bf16_bits


# Types ggml_quantize_chunk can write (q8_1 and q8_K are activation-only formats: ggml has no
# row quantizer for them and would abort).
QUANTIZABLE = frozenset(GGMLType[n] for n in (
    "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "MXFP4", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K",
    "TQ1_0", "TQ2_0", "IQ2_XXS", "IQ2_XS", "IQ3_XXS", "IQ3_S", "IQ2_S", "IQ1_S", "IQ1_M",
    "IQ4_NL", "IQ4_XS"))


def block_size(t: "GGMLType | str") -> int:
    """Elements per block (a row length must be a multiple of it)."""
    return int(_lib.get().ggml_blck_size(int(GGMLType.parse(t))))


def requires_imatrix(t: "GGMLType | str") -> bool:
    """ggml quantizes t only with an importance matrix (the IQ1/IQ2 types)."""
    return bool(_lib.get().ggml_quantize_requires_imatrix(int(GGMLType.parse(t))))


def row_bytes(t: "GGMLType | str", n: int) -> int:
    return int(_lib.get().ggml_row_size(int(GGMLType.parse(t)), n))


def quantize(x: np.ndarray, t: "GGMLType | str", imatrix: np.ndarray | None = None) -> np.ndarray:
    """Rows of x (numpy (..., K), float) → uint8 (..., row_bytes(t, K)) in ggml's layout of t."""
    t = GGMLType.parse(t)
    x = np.ascontiguousarray(x, dtype=np.float32)
    if x.ndim == 0 or x.shape[-1] == 0:
        raise ShapeError(f"quantize: need rows of at least one element, got shape {x.shape}")
    k = x.shape[-1]
    rows = x.size // k
    if t == F32:
        return x.view(np.uint8).reshape(x.shape[:-1] + (k * 4,))
    if t == F16:
        return x.astype(np.float16).view(np.uint8).reshape(x.shape[:-1] + (k * 2,))
    if t == BF16:
        return float32_to_bf16_bits(x).view(np.uint8).reshape(x.shape[:-1] + (k * 2,))
    L = _lib.get()
    if t not in QUANTIZABLE:
        raise ShapeError(f"quantize: {t.name} is not a weight type ggml can quantize to; pick "
                         "one of f32, f16, bf16, " + ", ".join(q.name.lower() for q in QUANTIZABLE))
    if k % block_size(t):
        raise ShapeError(f"quantize: row length {k} is not a multiple of the {t.name} block "
                         f"size {block_size(t)}; keep this tensor in f16/f32")
    if requires_imatrix(t) and imatrix is None:
        raise ShapeError(f"quantize: {t.name} needs an importance matrix; pick another type")
    im = None
    if imatrix is not None:
        imatrix = np.ascontiguousarray(imatrix, dtype=np.float32)
        if imatrix.shape != (k,):
            raise ShapeError(f"quantize: imatrix must have shape ({k},), got {imatrix.shape}")
        im = imatrix.ctypes.data
    out = np.empty((rows, row_bytes(t, k)), dtype=np.uint8)
    written = L.ggml_quantize_chunk(int(t), x.ctypes.data, out.ctypes.data, 0, rows, k, im)
    if written != out.nbytes:
        raise ShapeError(f"quantize: ggml wrote {written} bytes, expected {out.nbytes}")
    return out.reshape(x.shape[:-1] + (out.shape[1],))


def dequantize(raw: np.ndarray, t: "GGMLType | str", shape: tuple) -> np.ndarray:
    """ggml-layout bytes of type t → float32 array of numpy `shape` (int types keep theirs)."""
    t = GGMLType.parse(t)
    raw = np.ascontiguousarray(raw).view(np.uint8).reshape(-1)
    n = int(np.prod(shape))
    k = shape[-1] if shape else 1
    expected = row_bytes(t, k) * (n // k if k else 0)
    if raw.size != expected:
        raise ShapeError(f"dequantize: {raw.size} bytes do not hold {t.name} of shape {shape} "
                         f"({expected} bytes)")
    if t == BF16:
        return bf16_bits_to_float32(raw.view(np.uint16)).reshape(shape)
    if t in NUMPY_DTYPES:
        arr = raw.view(NUMPY_DTYPES[t]).reshape(shape)
        return arr.astype(np.float32) if t == F16 else arr.copy()
    traits = _lib.get().ggml_get_type_traits(int(t)).contents
    if not traits.to_float:
        raise ShapeError(f"dequantize: ggml has no dequantizer for {t.name}")
    to_float = _lib.ggml_to_float_t(traits.to_float)
    out = np.empty(n, dtype=np.float32)
    to_float(raw.ctypes.data, out.ctypes.data_as(ctypes.POINTER(ctypes.c_float)), n)
    return out.reshape(shape)
