"""Code files: int32 [n_quantizers, frames] in .npy, written atomically."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from ..errors import InputError
from ..fileio import atomic_output


def save_codes(path: str | os.PathLike, codes: np.ndarray) -> Path:
    path = Path(path)
    if path.suffix.lower() != ".npy":
        raise InputError(f"{path}: codes are written as .npy; use a .npy file name")
    with atomic_output(path) as tmp, open(tmp, "wb") as f:
        np.save(f, np.asarray(codes, dtype=np.int32))
    return path


def load_codes(path: str | os.PathLike) -> np.ndarray:
    path = Path(path)
    try:
        with open(path, "rb") as f:
            if f.read(6) != b"\x93NUMPY":
                raise InputError(f"{path}: not a .npy file — pass codes written by "
                                 "`python -m moss_tts encode`")
            f.seek(0)
            _check_header(path, f)
            f.seek(0)
            return np.load(f, allow_pickle=False)
    except FileNotFoundError:
        raise InputError(f"{path}: no such file") from None
    except (ValueError, OSError) as e:
        raise InputError(f"{path}: unreadable .npy file ({str(e).splitlines()[0]})") from None


def _check_header(path: Path, f) -> None:
    """Integer codes whose data the file holds: numpy would otherwise allocate whatever size
    a corrupt header claims before reading a byte."""
    fmt = np.lib.format
    read = {(1, 0): fmt.read_array_header_1_0, (2, 0): fmt.read_array_header_2_0}.get(
        fmt.read_magic(f))
    if read is None:
        raise InputError(f"{path}: an .npy format version this reader does not know")
    shape, _, dtype = read(f)
    if dtype.kind not in "iu":
        raise InputError(f"{path}: holds {dtype} values; codes are integers")
    need = int(np.prod(shape, dtype=object)) * dtype.itemsize
    have = os.fstat(f.fileno()).st_size - f.tell()
    if need > have:
        raise InputError(f"{path}: the header claims {need} bytes of codes, the file holds "
                         f"{have} — it is truncated or corrupt")
