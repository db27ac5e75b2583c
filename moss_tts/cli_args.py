"""Checks for cli.py: argparse `type=` functions shared by every command, and the output
destination check that runs before any model work (so a bad `-o` fails in a second, not after
the synthesis)."""

from __future__ import annotations

import argparse
import math
import os
import sys
import tempfile
from contextlib import contextmanager
from pathlib import Path

from .errors import InputError


# --- argparse type= functions: a bad value is one line naming the flag, before any work --------


def _number(text: str, kind):
    try:
        value = kind(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a {'whole number' if kind is int else 'number'}") from None
    if kind is float and not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"{text!r} must be a finite number")
    return value


def positive_int(text: str) -> int:
    """A count that must be at least 1 (threads, frames, tokens, codebooks)."""
    value = _number(text, int)
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} must be at least 1")
    return value


def non_negative_int(text: str) -> int:
    """0 or more (a seed; top-k where 0 means off)."""
    value = _number(text, int)
    if value < 0:
        raise argparse.ArgumentTypeError(f"{text!r} must be 0 or more")
    return value


def positive_float(text: str) -> float:
    """A finite number above 0 (seconds, temperatures, penalties)."""
    value = _number(text, float)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"{text!r} must be above 0")
    return value


def probability(text: str) -> float:
    """A finite number in (0, 1] (top-p)."""
    value = _number(text, float)
    if not 0 < value <= 1:
        raise argparse.ArgumentTypeError(f"{text!r} must be above 0 and at most 1")
    return value


def port(text: str) -> int:
    value = _number(text, int)
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"{text!r} is not a TCP port (0-65535)")
    return value


# --- the output ---------------------------------------------------------------------------------


def check_output(out: str, suffixes: tuple[str, ...]) -> None:
    """Fail now, before any model work, if `out` cannot receive the output: "-" needs an open
    stdout that is not a terminal; a path needs one of `suffixes`, must not be a directory or a
    device, and its directory must accept a new file (probed by creating and removing one, which
    is the only check that holds for root, read-only mounts and ACLs alike)."""
    if out == "-":
        if sys.stdout is None:
            raise InputError("-o -: stdout is closed; pass a file name instead")
        if sys.stdout.isatty():
            raise InputError("-o -: stdout is a terminal; redirect or pipe it (> out.wav, "
                             "| player), or pass a file name")
        return
    path = Path(out)
    if path.is_dir():
        raise InputError(f"{out}: is a directory; pass a file name inside it")
    if path.suffix.lower() not in suffixes:
        raise InputError(f"{out}: use a file name ending in "
                         f"{' or '.join(s for s in suffixes if s != '-')}"
                         + (", or - for stdout" if "-" in suffixes else ""))
    if path.exists() and not path.is_file():
        raise InputError(f"{out}: not a regular file; pass a file name (or - for stdout)")
    parent = _existing_parent(path)
    if not parent.is_dir():
        raise InputError(f"{out}: {parent} is not a directory")
    try:
        fd, probe = tempfile.mkstemp(prefix=".moss-tts-probe.", dir=parent)
    except OSError as e:
        raise InputError(f"{out}: cannot create a file in {parent} ({e.strerror}); choose "
                         "another output directory") from None
    os.close(fd)
    os.unlink(probe)


def _existing_parent(path: Path) -> Path:
    """The nearest ancestor of `path` that exists (the writer creates the missing ones)."""
    parent = path.absolute().parent
    while not parent.exists() and parent != parent.parent:
        parent = parent.parent
    return parent


@contextmanager
def writing(out: str):
    """Turn a failed write of `out` (full disk, a reader that closed the pipe, a directory that
    vanished) into one line; the writers remove their partial files themselves."""
    try:
        yield
        if out in ("-", "stdout") and sys.stdout is not None:
            sys.stdout.flush()  # a pipe error must surface here, not in the exit-time flush
    except BrokenPipeError:
        raise _closed_pipe_error() from None
    except OSError as e:
        raise InputError(f"{_name(out)}: cannot write ({e.strerror or e}); free space or choose "
                         "another destination") from None


def _name(out: str) -> str:
    return "stdout" if out in ("-", "stdout") else out


def _closed_pipe_error() -> InputError:
    """The error for a stdout whose reader went away (`| head`). Points stdout at /dev/null first,
    so the interpreter's exit-time flush of what is still buffered cannot print a second error."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (AttributeError, OSError, ValueError):  # stdout replaced or already closed
        pass
    return InputError("stdout: the reader closed the pipe before the output was complete")
