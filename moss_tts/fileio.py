"""Atomic output files: written under a unique temporary name next to the target, then renamed
into place, so a reader never sees a half-written file and a failure leaves nothing behind.
A symlink is written through, as `open(path, "w")` would: its target gets the new file."""

from __future__ import annotations

import os
import secrets
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

# what open(path, "w") asks for; the kernel takes the umask off it (mkstemp's 0600 would not)
FILE_MODE = 0o666


def _create_unique(path: Path) -> Path:
    """Create an empty `.{name}.{random}.partial` next to `path`, mode FILE_MODE & ~umask.

    The random part makes concurrent writers of the same target use different files; O_EXCL
    makes a (vanishingly rare) name collision a retry instead of a shared file."""
    while True:
        tmp = path.with_name(f".{path.name}.{secrets.token_hex(6)}.partial")
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, FILE_MODE)
        except FileExistsError:
            continue
        os.close(fd)
        return tmp


def write_target(path: str | os.PathLike) -> Path:
    """The file a write of `path` lands in: a symlink's final target (a rename onto the link
    itself would replace the link with a plain file), else `path`. The temporary file goes
    beside that target, so the rename stays within one file system."""
    path = Path(path)
    return Path(os.path.realpath(path)) if path.is_symlink() else path


@contextmanager
def atomic_output(path: str | os.PathLike) -> Iterator[Path]:
    """Yield a fresh temporary path to write; on success it replaces `path` in one rename.

    >>> with atomic_output("out.wav") as tmp:            # doctest: +SKIP
    ...     soundfile.write(tmp, samples, 48000)
    """
    path = write_target(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = _create_unique(path)
    try:
        yield tmp
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
