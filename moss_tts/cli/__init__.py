"""`python -m moss_tts <command>`: argument parsing and dispatch only (design §6). Each command
group is its own module (tts, codec, voice, serve, convert, info, batch) with `commands()`
(each command's one-line help) and `add_flags(p, command, common)`; common.py holds what
they share. Only the command run gets its flags built, so `--version` and `--help` load no
model family.

Errors from the library (MossTTSError) print as one line with exit code 1; `--debug` shows
the traceback. So does a fatal ggml error (a remote backend lost mid-call), which no Python
code can catch: the process ends with that one line instead of ggml's backtrace.
"""

from __future__ import annotations

import argparse
import faulthandler
import logging
import os
import signal
import sys
import warnings

from .. import __version__
from ..errors import MossTTSError
from ..lifetime import Terminated
from . import batch, codec, convert, info, serve, tts, voice
from .common import check_backend

COMMAND_GROUPS = (info, convert, codec, tts, voice, serve, batch)   # the order --help lists them


class _Parser(argparse.ArgumentParser):
    """Usage mistakes print one line (the usage is one `--help` away), like every other error."""

    def error(self, message):
        self.exit(2, f"error: {message} (see {self.prog} --help)\n")


def _common_flags() -> argparse.ArgumentParser:
    """Flags every subcommand also takes after its name. SUPPRESS keeps a subcommand from
    resetting a value given before it (`--debug info x` and `info x --debug` both work)."""
    common = _Parser(add_help=False)
    common.add_argument("--debug", action="store_true", default=argparse.SUPPRESS,
                        help="show tracebacks and debug logging")
    return common


def build_parser(argv: list[str] | None = None) -> argparse.ArgumentParser:
    """The parser for `argv`: every command listed with its one-line help, and the flags of
    the command `argv` names built, its first word that is no option (the top-level options
    take no value); with None, every command's."""
    chosen = None if argv is None else next((a for a in argv if not a.startswith("-")), "")
    common = _common_flags()
    p = _Parser(prog="python -m moss_tts",
                description="MOSS-TTS family on stock ggml, from Python.")
    p.add_argument("--version", action="version", version=f"moss-tts {__version__}")
    p.add_argument("--debug", action="store_true", help="show tracebacks and debug logging")
    sub = p.add_subparsers(dest="command", metavar="COMMAND")
    for group in COMMAND_GROUPS:
        for command, helptext in group.commands().items():
            cp = sub.add_parser(command, help=helptext, parents=[common])
            if chosen in (None, command):
                group.add_flags(cp, command, common)
    return p


def _report_warnings(quiet: bool) -> None:
    """What the library warns a user about (a frame budget that cut the audio) is one
    "warning:" line on stderr each time, or nothing with --quiet; other warnings as Python
    shows them."""
    from ..errors import BudgetWarning
    from ..knobs import advice

    shown = warnings.showwarning

    def show(message, category, filename, lineno, file=None, line=None):
        if issubclass(category, BudgetWarning):   # the knob to raise, as the flag to type
            print(f"warning: {advice(message, 'cli')}", file=sys.stderr)
        else:
            shown(message, category, filename, lineno, file, line)

    warnings.showwarning = show
    warnings.simplefilter("ignore" if quiet else "always", BudgetWarning)


def _on_ggml_abort(debug: bool):
    """A fatal ggml error ends the command as every other error does: one line, exit status
    1 (with --debug, every thread's Python stack too). Nothing can resume the call that
    failed; no output file is half-written (they are written whole, fileio.atomic_output)."""
    from ..ggml.log import abort_cause

    def report(message: str) -> None:
        print(f"error: {abort_cause(message)}; the command cannot go on: rerun it once the "
              "backend is back", file=sys.stderr, flush=True)
        if debug:
            faulthandler.dump_traceback(sys.stderr)
        os._exit(1)
    return report


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = build_parser(argv)
    args = parser.parse_args(argv)      # --version and --help end here, before ggml loads
    logging.basicConfig(level=logging.DEBUG if args.debug else logging.WARNING,
                        format="%(levelname)s %(name)s: %(message)s")
    from ..ggml.log import on_abort

    on_abort(_on_ggml_abort(args.debug))
    if not getattr(args, "func", None):
        parser.print_help(sys.stderr)
        return 2
    _report_warnings(quiet=getattr(args, "quiet", False))
    try:
        check_backend(args)
        return args.func(args)
    except MossTTSError as e:
        if args.debug:
            raise
        print(f"error: {e}", file=sys.stderr)
        return 1
    except Terminated:      # SIGTERM where a command takes it as Ctrl-C (batch)
        print("terminated", file=sys.stderr)
        return 128 + signal.SIGTERM
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 128 + signal.SIGINT
