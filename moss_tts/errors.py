"""The one exception family of moss-tts (design §6, style C25).

Every error a user can trigger derives from `MossTTSError`; the CLI prints its message as one line.
"""

import numbers


class MossTTSError(Exception):
    """Base of every error moss-tts raises on purpose."""


class ConfigError(MossTTSError):
    """A configuration value is missing, inconsistent or unsupported."""


class ModelFileError(MossTTSError):
    """A model file is missing, of the wrong kind, truncated or inconsistent."""


class ShapeError(MossTTSError):
    """A graph op was given tensors whose shapes or types it cannot take."""


class BackendError(MossTTSError):
    """The ggml libraries or a compute backend cannot be loaded or used."""


class BackendLost(BackendError):
    """A model's backend was lost and the model is not back yet (server/hosted.py): the
    server answers 503, and the same request may succeed later."""


class InputError(MossTTSError):
    """User input (text, audio, codes, options) is unusable."""


class VoiceError(InputError):
    """A stored voice a model cannot use (unreadable, or made by another codec): `problem` says
    why and `name` names it, so that each front end can say how to store it again there (the
    message says the CLI's way; the server names its endpoints instead)."""

    def __init__(self, name: str, problem: str, fix: str):
        super().__init__(f"{problem} — {fix}")
        self.name, self.problem = name, problem


class ContextFull(InputError):
    """A decode session has no room for the rows asked of it (a live conversation that filled
    its context): the server ends such a conversation saying so."""


class BudgetWarning(UserWarning):
    """Speech was cut at its frame budget before the model ended it: emitted once per
    `synthesize`/`stream` call (however many text chunks were cut), naming the knob to raise
    (`keyword`, the `stream` keyword, so a front end can say it as its flag or field). The
    CLI, `batch` and the server catch it by this class."""

    def __init__(self, message: str, keyword: str | None = None):
        super().__init__(message)
        self.keyword = keyword


def whole_number(value, name: str, low: int, high: int | None = None) -> int:
    """`value` as an int in [low, high] (an integral float such as 44100.0 is fine); anything
    else (a bool, str, 2.5, nan) raises a one-line InputError naming `name`."""
    if isinstance(value, numbers.Real) and not isinstance(value, bool) \
            and float(value).is_integer() and low <= value and (high is None or value <= high):
        return int(value)
    bounds = f"at least {low}" if high is None else f"in [{low}, {high}]"
    raise InputError(f"{name} must be a whole number {bounds}, got {value!r}")
