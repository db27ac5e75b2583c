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
from .fileio import write_target


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


def at_most(upper: float):
    """A finite number above 0 and at most `upper` (a size whose memory grows past it)."""
    def check(text: str) -> float:
        value = positive_float(text)
        if value > upper:
            raise argparse.ArgumentTypeError(f"{text!r} must be at most {upper:g}")
        return value
    return check


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


def check_output(out: str, suffixes: tuple[str, ...], *, flag: str = "-o") -> None:
    """Fail now, before any model work, if `out` cannot receive the output: "-" (allowed when
    `suffixes` holds it) needs an open stdout that is not a terminal; a path needs one of
    `suffixes`, must not be a directory or a device, and its directory must exist (a typo there
    must not become a new directory tree) and accept a new file (probed by creating and
    removing one, the only check that holds for root, read-only mounts and ACLs alike). A
    symlink is checked where it points: that is where the file is written."""
    names = " or ".join(s for s in suffixes if s != "-")
    if out == "-":
        _check_stdout(flag, suffixes)
        return
    shown, path = f"{flag} {out}", write_target(out)
    if path.is_dir():
        raise InputError(f"{shown}: is a directory; pass a file name inside it")
    if Path(out).suffix.lower() not in suffixes:
        raise InputError(f"{shown}: use a file name ending in {names}"
                         + (", or - for stdout" if "-" in suffixes else ""))
    if path.exists() and not path.is_file():
        raise InputError(f"{shown}: not a regular file; pass a file name"
                         + (" (or - for stdout)" if "-" in suffixes else ""))
    parent = path.absolute().parent
    if not parent.exists():
        raise InputError(f"{shown}: the directory {parent} does not exist; create it first "
                         "(mkdir -p) or choose another output path")
    if not parent.is_dir():
        raise InputError(f"{shown}: {parent} is not a directory")
    try:
        fd, probe = tempfile.mkstemp(prefix=".moss-tts-probe.", dir=parent)
    except OSError as e:
        raise InputError(f"{shown}: cannot create a file in {parent} ({e.strerror}); choose "
                         "another output directory") from None
    os.close(fd)
    os.unlink(probe)


def _check_stdout(flag: str, suffixes: tuple[str, ...]) -> None:
    files = [s for s in suffixes if s != "-"]
    if "-" not in suffixes:
        raise InputError(f"{flag} -: this command writes a file, not stdout; pass a name ending "
                         f"in {' or '.join(files)}")
    if sys.stdout is None:
        raise InputError(f"{flag} -: stdout is closed; pass a file name instead")
    if sys.stdout.isatty():
        raise InputError(f"{flag} -: stdout is a terminal; redirect or pipe it (> out{files[0]}, "
                         "| player), or pass a file name")


@contextmanager
def writing(out: str):
    """Turn a failed write of `out` (full disk, a reader that closed the pipe, a directory that
    vanished) into one line; the writers remove their partial files themselves.

    A reader that closes the pipe during audio or codes IS an error, unlike `printing`'s text:
    a player or encoder that stops early has not got what it wanted (it crashed, or the data
    is cut short), and a script piping the audio on needs the non-zero exit to notice."""
    try:
        yield
        if out in ("-", "stdout") and sys.stdout is not None:
            sys.stdout.flush()  # a pipe error must surface here, not in the exit-time flush
    except BrokenPipeError:
        _discard_stdout()
        raise InputError("stdout: the reader closed the pipe before the output was complete") \
            from None
    except OSError as e:
        raise _cannot_write(out, e) from None


@contextmanager
def printing():
    """Text for a person or a text tool (doctor, info, voice list). A reader that closes the
    pipe early (`| head`, `| grep -q`) has read what it wanted: the output ends quietly and
    the command still succeeds. Any other failed write (a full disk) is one line."""
    try:
        yield
        if sys.stdout is not None:
            sys.stdout.flush()  # as in `writing`: the pipe error surfaces here
    except BrokenPipeError:
        _discard_stdout()
    except OSError as e:
        raise _cannot_write("stdout", e) from None


def _cannot_write(out: str, e: OSError) -> InputError:
    name = "stdout" if out in ("-", "stdout") else out
    return InputError(f"{name}: cannot write ({e.strerror or e}); free space or choose another "
                      "destination")


def _discard_stdout() -> None:
    """Point stdout at /dev/null after its reader went away, so the interpreter's exit-time flush
    of what is still buffered cannot print a second error."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (AttributeError, OSError, ValueError):  # stdout replaced or already closed
        pass
