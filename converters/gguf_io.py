"""Write a moss-tts GGUF: metadata + tensors, matmul weights quantized through ggml itself,
written atomically (a temp file renamed into place, so no half-written model is ever seen)."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import gguf
import numpy as np

from moss_tts.errors import ConfigError
from moss_tts.fileio import atomic_output
from moss_tts.ggml.quant import QUANTIZABLE, block_size, quantize, requires_imatrix, row_bytes
from moss_tts.ggml.types import GGMLType
from moss_tts.ggml.weights import KIND_KEY, VERSION_KEY

FLOAT_TYPES = (GGMLType.F32, GGMLType.F16, GGMLType.BF16)


class Lazy:
    """A tensor known by shape and dtype now and loaded only when written, so a converter holds
    one tensor at a time however large the checkpoint (a 7 GB codec otherwise needs ~15 GB)."""

    def __init__(self, shape, dtype, load):
        self.shape, self.dtype, self._load = tuple(int(s) for s in shape), np.dtype(dtype), load

    @property
    def ndim(self) -> int:
        return len(self.shape)

    def load(self) -> np.ndarray:
        arr = np.asarray(self._load())
        if tuple(arr.shape) != self.shape:
            raise ConfigError(f"tensor loaded with shape {arr.shape}, declared {self.shape}")
        return arr

    def encoded(self, t: GGMLType):
        """The tensor in ggml's layout of t, as blocks of whole rows written one after another
        (here one block; a source that makes its rows in pieces overrides this)."""
        yield _encode(self.load(), t)


def renamed(ckpt, names: dict[str, str], accounted=lambda name: False):
    """The checkpoint tensors `names` maps (source name → GGUF name), each read as f32 only when
    written, and the keys neither mapped nor `accounted` for (reported as unused: C21)."""
    out, unmapped = {}, []
    for name in ckpt.keys():
        if name in names:
            out[names[name]] = Lazy(ckpt.shape(name), np.float32,
                                    lambda n=name: ckpt[n].astype(np.float32, copy=False))
        elif not accounted(name):
            unmapped.append(name)
    return out, unmapped


# type_for(name, spec) → the GGUF type of one tensor (spec has shape, ndim, dtype): the hook
# every converter's type choice goes through
TypeFor = Callable[[str, object], GGMLType]


def fitted(t: GGMLType, spec) -> GGMLType:
    """t, or f16 where a row is not a whole number of t's blocks (K-quants need rows of 256).
    llama.cpp's quantizer falls back to a 32-block type first (q4_K → q5_0, q6_K → q8_0); f16
    keeps every existing conversion as it was, and real model widths never need the fallback."""
    if t in FLOAT_TYPES or spec.shape[-1] % block_size(t) == 0:
        return t
    return GGMLType.F16


def weight_type(value: "GGMLType | str", what: str = "outtype") -> GGMLType:
    """A type ggml can store weights in: a float type or one it quantizes to without an
    importance matrix (checked before anything is written)."""
    t = GGMLType.parse(value)
    if t not in FLOAT_TYPES and (t not in QUANTIZABLE or requires_imatrix(t)):
        choices = ", ".join(q.name.lower() for q in (*FLOAT_TYPES, *sorted(QUANTIZABLE))
                            if q in FLOAT_TYPES or not requires_imatrix(q))
        raise ConfigError(f"{what} {t.name.lower()}: not a weight type ggml can write; pick one "
                          f"of {choices}")
    return t


def matmul_types(outtype: "GGMLType | str", is_matmul) -> TypeFor:
    """The common policy: matmul weights (`is_matmul(name, spec)`) in outtype; embeddings,
    norms, biases and anything else f32, integers i32 (design §4)."""
    outtype = weight_type(outtype)

    def type_for(name: str, spec) -> GGMLType:
        if spec.dtype.kind in "iu":
            return GGMLType.I32
        return fitted(outtype, spec) if is_matmul(name, spec) else GGMLType.F32
    return type_for


# P21: upstream's llama.cpp route quantizes the text head with the backbone, and that alone
# raises EN WER 1.79 → 2.8-3.2 %; so heads go below q8_0 only when asked to
HEAD_FLOOR = GGMLType.Q8_0


def default_head_type(outtype: GGMLType) -> GGMLType:
    """The heads' default type: outtype, but not below q8_0 (P21)."""
    return outtype if outtype in (*FLOAT_TYPES, HEAD_FLOOR) else HEAD_FLOOR


def group_types(group, outtype="f32", *, head=None, embed="f32") -> TypeFor:
    """A type per tensor group, `group(name)` naming it: "block" (block linears) in outtype,
    "head" in `head` (default `default_head_type(outtype)`), "embed" (embedding tables; design
    §4 keeps them f32, ggml reads rows of any type) in `embed`, "f32" kept f32; 1-D tensors f32."""
    outtype = weight_type(outtype)
    types = {"block": outtype, "embed": weight_type(embed, "embed type"), "f32": GGMLType.F32,
             "head": weight_type(head, "head type") if head is not None
             else default_head_type(outtype)}

    def type_for(name: str, spec) -> GGMLType:
        return GGMLType.F32 if spec.ndim != 2 else fitted(types[group(name)], spec)
    return type_for


def default_is_matmul(name: str, spec) -> bool:
    return spec.ndim == 2 and name.endswith(".weight")


def _stored(t: GGMLType, shape: tuple) -> tuple[tuple, np.dtype, int, object]:
    """(shape, numpy dtype, bytes, raw ggml type) of a tensor as the GGUF stores it."""
    n = int(np.prod(shape))
    if t in (GGMLType.F32, GGMLType.I32, GGMLType.F16):
        dtype = {GGMLType.F32: np.float32, GGMLType.I32: np.int32, GGMLType.F16: np.float16}[t]
        return shape, np.dtype(dtype), n * np.dtype(dtype).itemsize, None
    byte_shape = shape[:-1] + (row_bytes(t, shape[-1]),)
    return byte_shape, np.dtype(np.uint8), int(np.prod(byte_shape)), gguf.GGMLQuantizationType(int(t))


def _encode(arr: np.ndarray, t: GGMLType) -> np.ndarray:
    if t == GGMLType.F32:
        return np.ascontiguousarray(arr, dtype=np.float32)
    if t == GGMLType.I32:
        return np.ascontiguousarray(arr, dtype=np.int32)
    if t == GGMLType.F16:
        return np.ascontiguousarray(arr, dtype=np.float16)
    raw = quantize(arr.reshape(-1, arr.shape[-1]), t)
    return raw.reshape(arr.shape[:-1] + (raw.shape[-1],))


def write_gguf(path: str | os.PathLike, tensors: dict, meta: dict, *, kind: str, version: int,
               outtype: "GGMLType | str" = GGMLType.F32, is_matmul=default_is_matmul,
               type_for: TypeFor | None = None, progress=None) -> Path:
    """Write tensors (numpy arrays or `Lazy`, any float dtype) and metadata to `path`
    atomically, one tensor in memory at a time. Each tensor's type is `type_for(name, spec)`;
    without one, `matmul_types(outtype, is_matmul)`."""
    path = Path(path)
    type_for = type_for or matmul_types(outtype, is_matmul)
    with atomic_output(path) as tmp:
        w = gguf.GGUFWriter(tmp, "moss-tts")
        w.add_string(KIND_KEY, kind)
        w.add_uint32(VERSION_KEY, version)
        for key, value in meta.items():
            _add_meta(w, key, value)
        write_tensors(w, tensors, type_for, progress)
    return path


def write_tensors(w: gguf.GGUFWriter, tensors: dict, type_for: TypeFor, progress=None) -> None:
    """Declare every tensor in the type `type_for` picks, write the header (metadata already
    added to `w`) and the tensors one at a time, and close `w`."""
    plan = []
    for name, value in tensors.items():
        spec = value if isinstance(value, Lazy) else np.asarray(value)
        t = type_for(name, spec)
        shape, dtype, nbytes, raw = _stored(t, tuple(spec.shape))
        w.add_tensor_info(name, shape, dtype, nbytes, raw_dtype=raw)
        plan.append((name, value, t, nbytes))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    for i, (name, value, t, nbytes) in enumerate(plan):
        blocks = value.encoded(t) if isinstance(value, Lazy) else [_encode(np.asarray(value), t)]
        w.write_tensor_data(_Pieces(name, blocks, nbytes))
        if progress:
            progress(i + 1, len(plan), name)
    w.close()


class _Pieces:
    """One tensor's data for `GGUFWriter.write_tensor_data`, which needs only its `nbytes`
    and `tofile`: the blocks are encoded and written as they come, never joined in memory."""

    def __init__(self, name: str, blocks, nbytes: int):
        self.name, self.blocks, self.nbytes = name, blocks, nbytes

    def tofile(self, f) -> None:
        written = 0
        for block in self.blocks:
            block.tofile(f)
            written += block.nbytes
        if written != self.nbytes:
            raise ConfigError(f"tensor {self.name}: {written} bytes written, {self.nbytes} "
                              "declared")


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
