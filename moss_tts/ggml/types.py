"""ggml tensor types and their numpy counterparts (enum ggml_type, ggml.h)."""

from __future__ import annotations

import enum

import numpy as np

from ..errors import ShapeError


class GGMLType(enum.IntEnum):
    F32 = 0
    F16 = 1
    Q4_0 = 2
    Q4_1 = 3
    Q5_0 = 6
    Q5_1 = 7
    Q8_0 = 8
    Q8_1 = 9
    Q2_K = 10
    Q3_K = 11
    Q4_K = 12
    Q5_K = 13
    Q6_K = 14
    Q8_K = 15
    IQ2_XXS = 16
    IQ2_XS = 17
    IQ3_XXS = 18
    IQ1_S = 19
    IQ4_NL = 20
    IQ3_S = 21
    IQ2_S = 22
    IQ4_XS = 23
    I8 = 24
    I16 = 25
    I32 = 26
    I64 = 27
    F64 = 28
    IQ1_M = 29
    BF16 = 30
    TQ1_0 = 34
    TQ2_0 = 35
    MXFP4 = 39

    @classmethod
    def parse(cls, value: "GGMLType | str | int") -> "GGMLType":
        """`"q8_0"`, `"Q8_0"`, `8` or `GGMLType.Q8_0` → `GGMLType.Q8_0`."""
        if isinstance(value, cls):
            return value
        if isinstance(value, str):
            try:
                return cls[value.upper()]
            except KeyError:
                known = ", ".join(t.name.lower() for t in cls)
                raise ShapeError(f"unknown ggml type {value!r}; known: {known}") from None
        return cls(int(value))


F32, F16, BF16, I32, I64 = GGMLType.F32, GGMLType.F16, GGMLType.BF16, GGMLType.I32, GGMLType.I64

# Types whose elements map 1:1 to a numpy dtype (bf16 is carried as raw uint16 bits).
NUMPY_DTYPES: dict[GGMLType, np.dtype] = {
    GGMLType.F32: np.dtype(np.float32),
    GGMLType.F16: np.dtype(np.float16),
    GGMLType.BF16: np.dtype(np.uint16),
    GGMLType.I8: np.dtype(np.int8),
    GGMLType.I16: np.dtype(np.int16),
    GGMLType.I32: np.dtype(np.int32),
    GGMLType.I64: np.dtype(np.int64),
    GGMLType.F64: np.dtype(np.float64),
}


def numpy_dtype(t: GGMLType) -> np.dtype:
    try:
        return NUMPY_DTYPES[GGMLType(t)]
    except KeyError:
        raise ShapeError(f"ggml type {GGMLType(t).name} has no element-wise numpy dtype "
                         "(quantized data is read as raw blocks)") from None


def float32_to_bf16_bits(x: np.ndarray) -> np.ndarray:
    """Round-to-nearest-even f32 → bf16, returned as uint16 bit patterns (a NaN stays a quiet
    NaN of the same sign: the rounding carry would turn some NaN payloads into ±0 or inf)."""
    f = np.ascontiguousarray(x, dtype=np.float32)
    bits = f.view(np.uint32)
    rounded = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16)
    quiet_nan = ((bits >> 16) | 0x0040).astype(np.uint16)
    return np.where(np.isnan(f), quiet_nan, rounded)


def bf16_bits_to_float32(b: np.ndarray) -> np.ndarray:
    return (np.asarray(b, dtype=np.uint16).astype(np.uint32) << 16).view(np.float32)
