"""Route ggml's own log lines into Python `logging` (logger `moss_tts.ggml`)."""

from __future__ import annotations

import logging

from .lib import ggml_log_callback

logger = logging.getLogger("moss_tts.ggml")

# enum ggml_log_level: NONE 0, DEBUG 1, INFO 2, WARN 3, ERROR 4, CONT 5 (continues the last line)
_LEVELS = {1: logging.DEBUG, 2: logging.INFO, 3: logging.WARNING, 4: logging.ERROR}
_state = {"level": logging.INFO, "callback": None}


def _on_log(level: int, text: bytes, _user_data) -> None:
    if level != 5:
        _state["level"] = _LEVELS.get(level, logging.INFO)
    message = (text or b"").decode("utf-8", "replace").rstrip("\n")
    # ggml logs buffer sizes at INFO on every allocation; keep them at DEBUG for library users.
    py_level = max(logging.DEBUG, _state["level"] - 10) if _state["level"] <= logging.INFO else _state["level"]
    if message and logger.isEnabledFor(py_level):
        logger.log(py_level, "%s", message)


def route_ggml_log(lib) -> None:
    # The CFUNCTYPE object must outlive every ggml call that may log: keep it in module state.
    if _state["callback"] is None:
        _state["callback"] = ggml_log_callback(_on_log)
        lib.ggml_log_set(_state["callback"], None)
