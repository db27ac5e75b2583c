"""GGUF files through ggml's gguf C API: typed metadata, the tensor table, and weights loaded
into backend memory — zero-copy from an mmap on a CPU backend (design §3-4).

The Python `gguf.GGUFReader` needs ~9 s to open a file with a 150k-token vocabulary; the C API
opens it in ~0.2 s, and metadata values are read lazily, key by key.
"""

from __future__ import annotations

import ctypes
import logging
import mmap
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..errors import ModelFileError
from . import lib as _lib
from .backend import Backend, Buffer, NativeResource, get_backend, released_on_error
from .graph import Tensor
from .log import last_problem
from .repack import PACKED, Packer
from .types import GGMLType

logger = logging.getLogger(__name__)

GGUF_MAGIC = b"GGUF"
INTEGER_TYPES = (GGMLType.I8, GGMLType.I16, GGMLType.I32, GGMLType.I64)
KIND_KEY = "moss.kind"
VERSION_KEY = "moss.format_version"

# enum gguf_type → (getter suffix | None, numpy dtype for arrays)
_SCALAR = {0: "u8", 1: "i8", 2: "u16", 3: "i16", 4: "u32", 5: "i32", 6: "f32", 7: "bool",
           8: "str", 10: "u64", 11: "i64", 12: "f64"}
_ARRAY_DTYPES = {0: np.uint8, 1: np.int8, 2: np.uint16, 3: np.int16, 4: np.uint32, 5: np.int32,
                 6: np.float32, 7: np.bool_, 10: np.uint64, 11: np.int64, 12: np.float64}
_GGUF_ARRAY, _GGUF_STRING = 9, 8
_MISSING = object()


@dataclass(frozen=True)
class TensorInfo:
    name: str
    type: GGMLType
    ne: tuple          # ggml order, 4 long
    offset: int        # from the start of the data section
    nbytes: int

    @property
    def shape(self) -> tuple:
        return stored_shape(tuple(reversed(self.ne)))


def stored_shape(shape: tuple) -> tuple:
    """A numpy shape as a GGUF records it: ggml's dimension count drops the outer size-1
    dimensions (a (1, 6, D) table is stored (6, D)); one dimension is always kept."""
    shape = tuple(shape)
    while len(shape) > 1 and shape[0] == 1:
        shape = shape[1:]
    return shape


class GGUFFile(NativeResource):
    """An open GGUF: `meta[key]`, `tensors` (name → TensorInfo). Close it, or use `with`."""

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        self.lib = _lib.get()
        _check_magic(self.path)
        ctx_out = ctypes.c_void_p(None)
        params = _lib.gguf_init_params(True, ctypes.pointer(ctx_out))
        self._gguf = self.lib.gguf_init_from_file(str(self.path).encode(), params)
        if not self._gguf:
            detail = last_problem()
            detail = f"; ggml: {detail}" if detail else ""
            raise ModelFileError(f"{self.path}: not a readable GGUF file (corrupt or truncated "
                                 f"header{detail}) — re-convert or re-download it")
        self._meta_ctx = ctx_out.value  # ggml context holding the tensor descriptions
        self._values: dict[str, object] = {}
        with released_on_error(self):
            self._read_tensor_table()

    def _read_tensor_table(self) -> None:
        L, g = self.lib, self._gguf
        self.version = L.gguf_get_version(g)
        self.alignment = L.gguf_get_alignment(g)
        self.data_offset = L.gguf_get_data_offset(g)
        self.tensors: dict[str, TensorInfo] = {}
        for i in range(L.gguf_get_n_tensors(g)):
            name = self._utf8(L.gguf_get_tensor_name(g, i), f"tensor name #{i}")
            t = L.ggml_get_tensor(self._meta_ctx, name.encode())
            self.tensors[name] = TensorInfo(
                name, GGMLType(L.gguf_get_tensor_type(g, i)), Tensor.from_ptr(t, None).ne,
                L.gguf_get_tensor_offset(g, i), L.gguf_get_tensor_size(g, i))
        end = self.data_offset + max((t.offset + t.nbytes for t in self.tensors.values()), default=0)
        size = self.path.stat().st_size
        if size < end:
            raise ModelFileError(f"{self.path}: truncated GGUF ({size} bytes, tensor data needs "
                                 f"{end}) — the download or conversion was interrupted; redo it")

    # -- metadata -------------------------------------------------------------------------------
    def keys(self) -> list[str]:
        L, g = self.lib, self._gguf
        return [self._utf8(L.gguf_get_key(g, i), f"metadata key #{i}")
                for i in range(L.gguf_get_n_kv(g))]

    def _utf8(self, raw: bytes, what: str) -> str:
        try:
            return raw.decode()
        except UnicodeDecodeError:
            raise ModelFileError(f"{self.path}: {what} is not UTF-8 text ({raw[:20]!r}) — the "
                                 "file is corrupt; re-convert or re-download it") from None

    # typed reads: a value of the wrong type is a corrupt or foreign file, not a Python error
    def integer(self, key: str) -> int:
        return int(self._typed(key, "a whole number", lambda v: isinstance(v, (int, np.integer))
                               and not isinstance(v, bool)))

    def real(self, key: str) -> float:
        return float(self._typed(key, "a number", lambda v: isinstance(v, (int, float, np.number))
                                 and not isinstance(v, bool)))

    def text(self, key: str) -> str:
        return self._typed(key, "text", lambda v: isinstance(v, str))

    def integers(self, key: str) -> list[int]:
        value = self._typed(key, "an array of whole numbers",
                            lambda v: isinstance(v, np.ndarray) and v.dtype.kind in "iu")
        return [int(v) for v in value]

    def _typed(self, key: str, what: str, ok):
        value = self[key]
        if not ok(value):
            got = f"an array of {value.dtype}" if isinstance(value, np.ndarray) else \
                f"a list of {len(value)} strings" if isinstance(value, list) else repr(value)[:40]
            raise ModelFileError(f"{self.path}: metadata key {key!r} holds {got}, expected "
                                 f"{what} — the file is corrupt or from another converter; "
                                 "re-convert it")
        return value

    def __contains__(self, key: str) -> bool:
        return self.lib.gguf_find_key(self._gguf, key.encode()) >= 0

    def get(self, key: str, default=None):
        value = self._value(key)
        return default if value is _MISSING else value

    def __getitem__(self, key: str):
        value = self._value(key)
        if value is _MISSING:
            raise ModelFileError(f"{self.path}: metadata key {key!r} is missing — the file was "
                                 "written by another converter or version; re-convert it")
        return value

    def _value(self, key: str):
        if key in self._values:
            return self._values[key]
        L, g = self.lib, self._gguf
        i = L.gguf_find_key(g, key.encode())
        if i < 0:
            return _MISSING
        kv_type = L.gguf_get_kv_type(g, i)
        if kv_type == _GGUF_ARRAY:
            value = self._array(i)
        else:
            value = getattr(L, f"gguf_get_val_{_SCALAR[kv_type]}")(g, i)
            if isinstance(value, bytes):
                value = value.decode("utf-8", "replace")
        self._values[key] = value
        return value

    def _array(self, i: int):
        L, g = self.lib, self._gguf
        n = L.gguf_get_arr_n(g, i)
        arr_type = L.gguf_get_arr_type(g, i)
        if arr_type == _GGUF_STRING:
            return [L.gguf_get_arr_str(g, i, j).decode("utf-8", "replace") for j in range(n)]
        dtype = np.dtype(_ARRAY_DTYPES[arr_type])
        if n == 0:
            return np.zeros(0, dtype)
        buf = (ctypes.c_char * (n * dtype.itemsize)).from_address(L.gguf_get_arr_data(g, i))
        return np.frombuffer(bytes(buf), dtype=dtype)

    def check_kind(self, *kinds: str, version: int | None = None) -> str:
        """Fail unless `moss.kind` is one of `kinds` (and the format version matches)."""
        kind = self.get(KIND_KEY)
        if kind not in kinds:
            found = f"a {kind!r} model" if kind else "not a moss-tts GGUF (no moss.kind)"
            raise ModelFileError(f"{self.path}: expected a {' or '.join(kinds)} GGUF, found "
                                 f"{found} — pass the right file")
        if version is not None and self.get(VERSION_KEY) != version:
            raise ModelFileError(f"{self.path}: {kind} format version {self.get(VERSION_KEY)} is "
                                 f"not the supported {version} — re-convert with this moss-tts")
        return kind

    def close(self) -> None:
        if self._gguf:
            self.lib.gguf_free(self._gguf)
            self._gguf = None
        if self._meta_ctx:
            self.lib.ggml_free(self._meta_ctx)
            self._meta_ctx = None


def _check_magic(path: Path) -> None:
    try:
        with open(path, "rb") as f:
            head = f.read(4)
    except FileNotFoundError:
        raise ModelFileError(f"{path}: no such file") from None
    except OSError as e:
        raise ModelFileError(f"{path}: cannot read ({e.strerror})") from None
    if head != GGUF_MAGIC:
        raise ModelFileError(f"{path}: not a GGUF file (starts with {head!r}) — convert the "
                             "checkpoint with `python -m moss_tts convert` first")


class Weights(NativeResource):
    """Every tensor of a GGUF in backend memory; `weights["name"]` is a persistent Tensor.

    `repack(name, type)` picks tensors the caller reads only as mul_mat weights; on a CPU backend
    those ggml can repack (repack.py) are copied into interleaved layouts, the rest stay mmapped.
    """

    def __init__(self, file: GGUFFile, backend: Backend, repack=None):
        self.file = file
        self.backend = backend
        self.lib = backend.lib
        self.zero_copy = False
        self.buffer = self.packed_buffer = self._map = self._bytes = None
        self.packed: set[str] = set()
        self._packer = None      # set by _repack_names when the backend can repack
        with released_on_error(self):
            self._map = _map(file)
            self._bytes = np.frombuffer(self._map, dtype=np.uint8)
            self.buffer = self._load(set(self._repack_names(repack)))
            if not self.zero_copy:
                self._unmap()   # uploaded: the file's pages need not stay in this process
        self._tensors = {name: Tensor.from_ptr(self.lib.ggml_get_tensor(
            file._meta_ctx, name.encode()), None, self) for name in file.tensors}
        logger.info("loaded %s: %d tensors, %.1f MiB on %s%s%s", file.path.name,
                    len(self._tensors), self.nbytes / 2**20, backend.name,
                    " (zero-copy mmap)" if self.zero_copy else "",
                    f", {len(self.packed)} repacked" if self.packed else "")

    @classmethod
    def load(cls, path, backend: "Backend | str | None" = None, *, repack=None) -> "Weights":
        """`repack`: a predicate on (tensor name, GGMLType) choosing mul_mat-only weights, or
        None."""
        file = GGUFFile(path)
        with released_on_error(file):
            return cls(file, get_backend(backend), repack)

    @property
    def nbytes(self) -> int:
        return sum(t.nbytes for t in self.file.tensors.values())

    def _repack_names(self, repack) -> list[str]:
        if repack is None:
            return []
        packer = Packer(self.backend)
        if not packer.available:
            return []
        self._packer = packer
        return [n for n, info in self.file.tensors.items()
                if repack(n, info.type) and packer.eligible(info.type, info.ne)]

    def _load(self, packed: set[str]) -> Buffer | None:
        f = self.file
        if not f.tensors:
            return None
        size = max(t.offset + t.nbytes for t in f.tensors.values())
        base = self._bytes.ctypes.data + f.data_offset
        L = self.lib
        if self.backend.is_cpu and self.backend.is_host and base % 32 == 0 \
                and f.alignment % 32 == 0:
            # The CPU backend computes straight from the page cache: no copy, shared pages.
            buf = Buffer(L, L.ggml_backend_cpu_buffer_from_ptr(base, size), usage=1,
                         keepalive=self._bytes)
            try:
                for name, info in f.tensors.items():
                    t = L.ggml_get_tensor(f._meta_ctx, name.encode())
                    if name not in packed and L.ggml_backend_tensor_alloc(
                            buf.ptr, t, base + info.offset) != 0:
                        raise ModelFileError(f"{f.path}: tensor {name!r} could not be placed")
                if packed:
                    self._upload_packed(packed, base)
            except BaseException:
                buf.close()
                raise
            self.zero_copy = True
            return buf
        buf = Buffer(L, L.ggml_backend_alloc_ctx_tensors(f._meta_ctx, self.backend.ptr), usage=1)
        for name, info in f.tensors.items():
            t = L.ggml_get_tensor(f._meta_ctx, name.encode())
            L.ggml_backend_tensor_set(t, base + info.offset, 0, info.nbytes)
        return buf

    def _unmap(self) -> None:
        self._bytes = None      # the only export of the map: close() would refuse while it lives
        self._map.close()
        self._map = None

    @property
    def maps_file(self) -> bool:
        """Does this still map the GGUF (zero-copy CPU weights)? False once uploaded to a
        backend's own memory (a GPU's, an RPC server's)."""
        return self._map is not None

    def _upload_packed(self, packed: set[str], base: int) -> None:
        f, L = self.file, self.lib
        order = [n for n in f.tensors if n in packed]
        ptrs = {n: L.ggml_get_tensor(f._meta_ctx, n.encode()) for n in order}
        self.packed_buffer = self._packer.upload(
            [(n, ptrs[n], base + f.tensors[n].offset, f.tensors[n].nbytes) for n in order])
        self.packed = set(order)
        PACKED.update({ptrs[n]: n for n in order})
        # the file pages were only the repack's input: let them leave this process's RSS
        _drop_pages(self._map, [(f.data_offset + f.tensors[n].offset, f.tensors[n].nbytes)
                                  for n in order])

    def __contains__(self, name: str) -> bool:
        return name in self._tensors

    def __getitem__(self, name: str) -> Tensor:
        try:
            return self._tensors[name]
        except KeyError:
            raise ModelFileError(f"{self.file.path}: tensor {name!r} is missing") from None

    def names(self) -> list[str]:
        return list(self._tensors)

    def require(self, expected: dict[str, tuple], *, optional: tuple[str, ...] = (),
                strict: bool = True, floats: bool = False) -> dict[str, Tensor | None]:
        """Check tensors against their declared numpy shapes (as the GGUF records them:
        `stored_shape`) and return them by name.

        Every problem (missing, wrong shape, with `floats` an integer type, and with `strict`
        unknown extra tensors) is listed in one `ModelFileError`. Optional names absent from
        the file map to None.
        """
        problems, out = [], {}
        for name, shape in expected.items():
            t = self._tensors.get(name)
            if t is None:
                if name in optional:
                    out[name] = None
                else:
                    problems.append(f"{name}: missing (expected {tuple(shape)})")
                continue
            info = self.file.tensors[name]
            if tuple(info.shape) != stored_shape(shape):
                problems.append(f"{name}: expected shape {tuple(shape)}, got {tuple(info.shape)}")
            if floats and info.type in INTEGER_TYPES:  # the graph ops take no integer weights
                problems.append(f"{name}: type {info.type.name}, expected a float type")
            out[name] = t
        if strict:
            problems += [f"{n}: unexpected tensor" for n in self._tensors if n not in expected]
        if problems:
            head = f"{self.file.path}: {len(problems)} tensor problem(s): "
            raise ModelFileError(head + "; ".join(problems[:20]) +
                                 (" ..." if len(problems) > 20 else ""))
        return out

    def read(self, name: str) -> np.ndarray:
        """Copy one tensor back to numpy (element types only; dequantize quantized ones)."""
        from .quant import dequantize
        info = self.file.tensors[name]
        if name in self.packed:   # the repacked copy cannot be read back: the file still can
            start = self.file.data_offset + info.offset
            raw = np.array(self._bytes[start:start + info.nbytes])
        else:
            raw = np.empty(info.nbytes, dtype=np.uint8)
            self.lib.ggml_backend_tensor_get(self[name].ptr, raw.ctypes.data, 0, info.nbytes)
        return dequantize(raw, info.type, info.shape)

    def close(self) -> None:
        for name in getattr(self, "packed", ()):
            PACKED.pop(self.lib.ggml_get_tensor(self.file._meta_ctx, name.encode()), None)
        self.packed = set()
        for buf in (self.buffer, self.packed_buffer):
            if buf is not None:
                buf.close()
        self.buffer = self.packed_buffer = self._map = self._bytes = None
        self.file.close()


def _map(file: GGUFFile) -> mmap.mmap:
    """The whole file, mapped read-only."""
    with open(file.path, "rb") as fh:
        return mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ)


def _drop_pages(mm: mmap.mmap, spans: list[tuple[int, int]]) -> None:
    """madvise(DONTNEED) the whole pages inside each (offset, length) span of the mapping."""
    page = mmap.PAGESIZE
    if not hasattr(mm, "madvise"):     # Python builds without madvise: the pages just stay
        return
    for start, length in spans:
        first, end = -(-start // page) * page, (start + length) // page * page
        if end > first:
            mm.madvise(mmap.MADV_DONTNEED, first, end - first)


class TensorStore(NativeResource):
    """Persistent tensors uploaded once to the backend; `store["name"]` is a Tensor like a
    weight's. A value is a numpy array (a table derived at load time), or `(numpy shape,
    GGMLType)` for a zero-filled tensor written later inside graphs (a KV cache)."""

    def __init__(self, arrays: dict, backend: "Backend | str | None" = None):
        from .types import NUMPY_DTYPES
        self.backend = get_backend(backend)
        L = self.lib = self.backend.lib
        self._ctx = L.ggml_init(_lib.ggml_init_params(
            (len(arrays) + 2) * L.ggml_tensor_overhead(), None, True))
        by_dtype = {np.dtype(v): k for k, v in NUMPY_DTYPES.items() if k != GGMLType.BF16}
        self._tensors: dict[str, Tensor] = {}
        prepared = {}
        for name, arr in arrays.items():
            if isinstance(arr, tuple):
                shape, type_ = tuple(arr[0]), GGMLType(arr[1])
            else:
                arr = prepared[name] = np.ascontiguousarray(arr)
                shape, type_ = arr.shape, by_dtype.get(arr.dtype)
            if type_ is None or not 1 <= len(shape) <= 4:
                raise ModelFileError(f"TensorStore: {name!r} has dtype {getattr(arr, 'dtype', arr)}"
                                     f" / {len(shape)} axes")
            ne = (ctypes.c_int64 * len(shape))(*reversed(shape))
            p = L.ggml_new_tensor(self._ctx, int(type_), len(shape), ne)
            L.ggml_set_name(p, name.encode()[:63])
            self._tensors[name] = Tensor.from_ptr(p, None, self)
        self.buffer = Buffer(L, L.ggml_backend_alloc_ctx_tensors(self._ctx, self.backend.ptr),
                             usage=1) if arrays else None
        if len(prepared) < len(arrays):
            self.buffer.clear(0)
        for name, arr in prepared.items():
            L.ggml_backend_tensor_set(self._tensors[name].ptr, arr.ctypes.data, 0, arr.nbytes)

    def __getitem__(self, name: str) -> Tensor:
        return self._tensors[name]

    @property
    def nbytes(self) -> int:
        return self.buffer.size if self.buffer is not None else 0

    def close(self) -> None:
        if getattr(self, "buffer", None) is not None:
            self.buffer.close()
            self.buffer = None
        if getattr(self, "_ctx", None):
            self.lib.ggml_free(self._ctx)
            self._ctx = None
