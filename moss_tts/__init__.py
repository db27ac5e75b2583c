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
    if name in ("TTS", "Reference"):    # the protocol every family offers, and its voice type
        from .models import tts
        return getattr(tts, name)
    if name == "load_tts":       # any family's TTS from its GGUF (the family is its kind)
        from .load import load_tts
        return load_tts
    if name == "SamplingOptions":
        from .sampling import SamplingOptions
        return SamplingOptions
    if name == "read_audio":     # (samples, sample_rate) of a WAV/FLAC file, e.g. a reference
        from .audio import read_audio
        return read_audio
    if name == "load_voice":     # a stored voice as (Reference, info): any family takes it
        from .voices import load_voice
        return load_voice
    raise AttributeError(f"module 'moss_tts' has no attribute {name!r}")

__version__ = "0.1.0"

__all__ = ["Codec", "NanoTTS", "TTS", "Reference", "load_tts", "SamplingOptions", "read_audio", "load_voice",
           "MossTTSError", "ConfigError", "ModelFileError", "ShapeError", "BackendError",
           "InputError", "__version__"]
