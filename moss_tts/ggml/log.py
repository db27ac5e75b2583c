"""Route ggml's own log lines into Python `logging` (logger `moss_tts.ggml`), at DEBUG.

ggml reports a failure on its log *and* through a return value; the binding turns the return
value into one clear exception, so ggml's own lines stay at DEBUG (shown with --debug) instead
of printing a second, rawer message. The last warning or error is kept for that exception.
"""

from __future__ import annotations

import logging

from .lib import ggml_log_callback

logger = logging.getLogger("moss_tts.ggml")

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
