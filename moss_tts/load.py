"""`load_tts`: any family's TTS object from its model, the family read from the GGUF's kind
(upstream's published MOSS-TTS-GGUF directory is MOSS-TTS (Delay)), so the CLI and the server
never ask which family a file holds."""

from __future__ import annotations

from pathlib import Path

from .errors import ModelFileError
from .models.delay_published import is_published_dir
from .tts import CodecTTS


def tts_classes() -> dict[str, type[CodecTTS]]:
    """GGUF kind → the family's TTS class."""
    from .models.delay_tts import DelayTTS
    from .models.local_tts import LocalTTS
    from .models.local_v15_tts import LocalV15TTS
    from .models.nano_tts import NanoTTS
    from .models.realtime_tts import RealtimeTTS

    return {cls.FAMILY: cls for cls in (NanoTTS, DelayTTS, LocalTTS, LocalV15TTS, RealtimeTTS)}


def tts_class(model) -> type[CodecTTS]:
    """The TTS class for a model GGUF or published directory, from its metadata only (cheap:
    no weights are loaded)."""
    from .ggml.weights import KIND_KEY, GGUFFile

    classes = tts_classes()
    if is_published_dir(model):
        return classes["delay"]
    if Path(model).is_dir():
        raise ModelFileError(f"{model}: a directory that is not a published MOSS-TTS-GGUF one "
                             "(embeddings/, lm_heads/) — convert a checkpoint with "
                             "`python -m moss_tts convert <family>`")
    with GGUFFile(model) as f:
        kind = f.get(KIND_KEY)
    if kind not in classes:
        found = f"a {kind!r} GGUF" if kind else "not a moss-tts GGUF (no moss.kind)"
        *rest, last = classes
        raise ModelFileError(f"{model}: {found}, not a speech model — pass a "
                             f"{', '.join(rest)} or {last} model GGUF")
    return classes[kind]


def load_tts(model, *, codec=None, backend=None, threads: int | None = None) -> CodecTTS:
    """A model GGUF (or published directory) and its codec → its family's TTS (`tts_classes`).

    >>> tts = load_tts("delay.gguf", codec="codec.gguf")                    # doctest: +SKIP
    >>> audio, sr = tts.synthesize("Hello there.", seed=1)                  # doctest: +SKIP
    """
    return tts_class(model).load(model, codec=codec, backend=backend, threads=threads)
