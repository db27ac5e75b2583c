"""The one exception family of moss-tts (design §6, style C25).

Every error a user can trigger derives from `MossTTSError`; the CLI prints its message as one line.
"""


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


class InputError(MossTTSError):
    """User input (text, audio, codes, options) is unusable."""
