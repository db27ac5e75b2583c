"""MOSS-TTS inference in Python on stock ggml: the public API (re-exports only)."""

from .errors import (BackendError, ConfigError, InputError, ModelFileError, MossTTSError,
                     ShapeError)


def __getattr__(name):
    # the heavy modules load on first use, so `import moss_tts` stays cheap and doctor-friendly
    if name == "Codec":
        from .codec import Codec
        return Codec
    if name == "NanoTTS":
        from .models.nano_tts import NanoTTS
        return NanoTTS
    if name == "SamplingOptions":
        from .sampling import SamplingOptions
        return SamplingOptions
    raise AttributeError(f"module 'moss_tts' has no attribute {name!r}")

__version__ = "0.1.0"

__all__ = ["Codec", "NanoTTS", "SamplingOptions", "MossTTSError", "ConfigError", "ModelFileError", "ShapeError", "BackendError",
           "InputError", "__version__"]
