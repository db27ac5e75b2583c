"""MOSS-TTS inference in Python on stock ggml: the public API (re-exports only)."""

from .errors import (BackendError, ConfigError, InputError, ModelFileError, MossTTSError,
                     ShapeError)

__version__ = "0.1.0"

__all__ = ["MossTTSError", "ConfigError", "ModelFileError", "ShapeError", "BackendError",
           "InputError", "__version__"]
