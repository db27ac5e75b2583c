"""What the command modules share: argparse `type=` functions, the runtime and sample-format
flags, the output destination check that runs before any model work (so a bad `-o` fails in a
second, not after the synthesis), writing and printing that turn a failed write into one line,
the progress line, and resolving a model or codec flag into a GGUF path."""

from __future__ import annotations

import argparse
import math
import os
import sys
import tempfile
from contextlib import contextmanager
from pathlib import Path

from ..audio import DEFAULT_SAMPLE_FORMAT, SAMPLE_FORMATS
from ..errors import InputError, MossTTSError
from ..fileio import write_target

AUDIO_SUFFIXES = (".wav", ".flac")
# fixtures/ ships with a checkout, not in the wheel (pyproject includes moss_tts and converters)
TINY_MODELS_COMMAND = "python -m fixtures.make_tiny_pair DIR in a checkout"


# --- argparse type= functions: a bad value is one line naming the flag, before any work --------


def number(text: str, kind):
    """`text` as an int or a finite float (`kind`), or a message argparse prints."""
    try:
        value = kind(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a {'whole number' if kind is int else 'number'}") from None
    if kind is float and not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"{text!r} must be a finite number")
    return value


def positive_int(text: str) -> int:
    """A count that must be at least 1 (threads, codebooks, lines)."""
    value = number(text, int)
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} must be at least 1")
    return value


def auto_or(typed):
    """`typed`, a `type=`, also taking "auto" (None): --max-streams / --streams, where auto is
    what pays off for the model's family (models/batching.py stream_places)."""
    def parse(text: str):
        return None if text.strip().lower() == "auto" else typed(text)

    parse.__name__ = typed.__name__
    return parse


def positive_float(text: str) -> float:
    """A finite number above 0 (seconds, timeouts)."""
    value = number(text, float)
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


# --- shared flags -------------------------------------------------------------------------------


def add_runtime_flags(p: argparse.ArgumentParser) -> None:
    add_backend_flag(p)
    p.add_argument("--threads", type=positive_int, default=None,
                   help="CPU threads (default and maximum: the usable cores)")
    p.add_argument("--quiet", action="store_true", help="no progress or summary on stderr")


def add_backend_flag(p: argparse.ArgumentParser, *, who: str = "",
                     rpc: str = "a ggml RPC server: python -m moss_tts.ggml.rpc HOST:PORT") -> None:
    """--backend, declared once for every command that opens one (check_backend checks it);
    `who` opens it and `rpc` is what to know of an RPC server, where a command differs."""
    p.add_argument("--backend", default="cpu", help=f"ggml backend{who}: cpu (default), cuda, "
                   f"vulkan, metal, or rpc://HOST:PORT ({rpc})")


def check_backend(args) -> None:
    """A command's --backend (every command that takes one: tts, serve, batch, voice add, the
    codec commands) names a backend this ggml build has, before any model resolves or loads:
    one error for an empty or unknown name, or one this build lacks (ggml/backend.py)."""
    if getattr(args, "backend", None) is not None:
        from ..ggml.backend import check_name

        check_name(args.backend, flag="--backend")


def add_sample_format(p: argparse.ArgumentParser) -> None:
    p.add_argument("--sample-format", choices=list(SAMPLE_FORMATS), default=DEFAULT_SAMPLE_FORMAT,
                   help="output samples, the same in a file and on stdout: s16 (default; 16-bit "
                        "PCM), s24, or f32 (32-bit float, unclipped; WAV only)")


# --- progress, audio out, messages --------------------------------------------------------------


class Progress:
    """A one-line progress indicator on stderr; silent with --quiet or when stderr is no TTY."""

    def __init__(self, label: str, quiet: bool, unit: str = "frames"):
        self.label, self.unit = label, unit
        self.enabled = not quiet and sys.stderr.isatty()
        self.shown = False

    def __call__(self, done: int, total: int) -> None:
        if self.enabled:
            pct = 100 * done // max(total, 1)
            print(f"\r{self.label}: {pct:3d}% ({done}/{total} {self.unit})", end="",
                  file=sys.stderr, flush=True)
            self.shown = True

    def audio(self, seconds: float) -> None:
        """Progress of open-ended work: the seconds of audio made so far."""
        if self.enabled:
            print(f"\r{self.label}: {seconds:6.1f} s of audio", end="", file=sys.stderr,
                  flush=True)
            self.shown = True

    def close(self) -> None:
        if self.shown:
            print(file=sys.stderr)
            self.shown = False

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def check_audio_output(args, *, stdout_ok: bool = False) -> None:
    """Everything about `-o` that can be known before the work: the place and the format."""
    from ..audio import container_of

    check_output(args.out, AUDIO_SUFFIXES + (("-",) if stdout_ok else ()))
    if args.out != "-":
        container_of(args.out, args.sample_format)


def write_audio(args, audio, sample_rate: int) -> None:
    from ..audio import encode_file, write_audio as write_file

    with writing(args.out):
        if args.out == "-":   # the whole clip is here: a WAV with its exact sizes, as in a file
            sys.stdout.buffer.write(encode_file(audio, sample_rate, "WAV", args.sample_format))
        else:
            write_file(args.out, audio, sample_rate, sample_format=args.sample_format)


def where(out: str) -> str:
    return "stdout" if out == "-" else out


def say(args, message: str) -> None:
    if not args.quiet:
        print(message, file=sys.stderr)


def utf8(data: bytes, source: str, *, offset: int = 0) -> str:
    """Input text as UTF-8, or one line naming `source` and the first bad byte (`offset`: where
    `data` begins in `source`, for a source read a piece at a time)."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        bad = data[e.start:e.start + 1]
        raise InputError(f"{source}: not UTF-8 text (byte {offset + e.start}: {bad!r}); "
                         "convert it, e.g. iconv -t UTF-8") from None


# --- model and codec flags ----------------------------------------------------------------------


def resolve(spec: str, family: str, flag: str, quiet: bool = False):
    """A model flag's value → a GGUF path (a checkpoint is converted into the cache once, with
    progress: an 8B takes minutes); a failure names the flag and the offline way out."""
    from ..hub import resolve_gguf

    try:
        with Progress(f"converting {spec} into the cache", quiet, "tensors") as bar:
            return resolve_gguf(spec, family, progress=lambda i, n, name: bar(i, n))
    except MossTTSError as e:
        raise type(e)(f"{flag} {e}; {flag} also takes a local .gguf or checkpoint directory "
                      f"(tiny models for a first run offline: {TINY_MODELS_COMMAND})") from None


def resolve_codec(codec: str | None, family, quiet: bool = False, *, model: str | None = None):
    """The codec a family decodes with: `codec` (--codec's value), else the family's default;
    None for a family that decodes with its own VAE, which refuses one (`model`: the --model
    it was given for, where several are)."""
    if not family.default_codec:
        if codec:
            which = f" for --model {model}" if model else ""
            raise InputError(f"--codec: {family.name} decodes with its own VAE; leave out "
                             f"--codec{which}")
        return None
    return resolve(codec or family.default_codec, "codec", "--codec", quiet)


def resolve_model(spec: str, quiet: bool = False):
    """--model → (what `load` takes, its registry row): a file or a published MOSS-TTS-GGUF
    directory as they are; a checkpoint directory or repo id converted (into the cache) by the
    family its config.json names."""
    from ..models.registry import resolve_model as resolve_row

    return resolve_row(spec, resolve=lambda s: resolve(s, "model", "--model", quiet))
