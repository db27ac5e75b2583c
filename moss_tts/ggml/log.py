"""Route ggml's own log lines into Python `logging` (logger `moss_tts.ggml`), at DEBUG, and its
fatal errors (GGML_ABORT) to one line instead of a debugger's backtrace.

ggml reports a failure on its log *and* through a return value; the binding turns the return
value into one clear exception, so ggml's own lines stay at DEBUG (shown with --debug) instead
of printing a second, rawer message. The last warning or error is kept for that exception.

A GGML_ABORT has no return value: ggml calls its abort callback, then abort(). That is how ggml
reports a remote backend lost mid-call (ggml-rpc.cpp's RPC_STATUS_ASSERT on a failed send or
receive) and its own asserts; nothing returns to the caller, and the backend's state is gone, so
no process recovers from it (docs/binding.md "A backend that fails"). By default the message is
one line on stderr (ggml's own handler prints a backtrace by running gdb on the process, ~99
lines); `on_abort` lets a command or a child process say it its own way and choose its exit
status.
"""

from __future__ import annotations

import ctypes
import logging
import sys
from collections.abc import Callable
from ctypes import c_char_p, c_int, c_void_p

logger = logging.getLogger("moss_tts.ggml")

# The callback types live here, beside their handlers, so that lib.py (which routes ggml's log
# here as it loads) imports this module and not the other way round.
# typedef void (*ggml_log_callback)(enum ggml_log_level level, const char * text, void * user_data);
ggml_log_callback = ctypes.CFUNCTYPE(None, c_int, c_char_p, c_void_p)
# typedef void (*ggml_abort_callback_t)(const char * error_message);
ggml_abort_callback_t = ctypes.CFUNCTYPE(None, c_char_p)

# enum ggml_log_level: NONE 0, DEBUG 1, INFO 2, WARN 3, ERROR 4, CONT 5 (continues the last line)
_WARN, _ERROR, _CONT = 3, 4, 5
_state = {"level": 2, "callback": None, "last_problem": None}


def _on_log(level: int, text: bytes, _user_data) -> None:
    if level != _CONT:
        _state["level"] = level
    message = (text or b"").decode("utf-8", "replace").rstrip("\n")
    if not message:
        return
    if _state["level"] in (_WARN, _ERROR):
        _state["last_problem"] = message.strip()
    if logger.isEnabledFor(logging.DEBUG):
        logger.debug("%s", message)


def last_problem() -> str | None:
    """The last warning or error line ggml logged (then forgotten), to explain a failure."""
    problem, _state["last_problem"] = _state["last_problem"], None
    return problem


def route_ggml_log(lib) -> None:
    # The CFUNCTYPE object must outlive every ggml call that may log: keep it in module state.
    if _state["callback"] is None:
        _state["callback"] = ggml_log_callback(_on_log)
        lib.ggml_log_set(_state["callback"], None)


def _one_line(message: str) -> None:
    sys.stderr.write(f"moss-tts: ggml stopped the process: {message}\n")
    sys.stderr.flush()


_abort = {"handler": _one_line, "callback": None}


def _on_abort(message: bytes) -> None:
    text = (message or b"").decode("utf-8", "replace").strip()
    try:
        _abort["handler"](text)
    except BaseException:   # nothing may unwind into ggml's C frames: ggml aborts next
        _one_line(text)


def on_abort(handler: Callable[[str], None] | None) -> None:
    """Call `handler(message)` when ggml aborts the process (None: the default, one line on
    stderr). ggml aborts when it returns; a handler may end the process itself (`os._exit`)
    to choose the exit status, after saying what failed where it is heard."""
    _abort["handler"] = handler or _one_line


def route_ggml_abort(lib) -> None:
    # as the log callback, the CFUNCTYPE object must outlive every ggml call
    if _abort["callback"] is None:
        _abort["callback"] = ggml_abort_callback_t(_on_abort)
        lib.ggml_set_abort_callback(_abort["callback"])


def abort_cause(message: str) -> str:
    """What a ggml abort message means, for the line that reports it: any abort of
    ggml-rpc.cpp (a failed send or receive, a connection refused or cut) is the RPC backend
    lost; another is its message without ggml's source location."""
    where, _, text = message.partition(": ")
    if not text or ".c" not in where:
        return message
    return f"the RPC backend was lost ({text})" if "ggml-rpc" in where else text
