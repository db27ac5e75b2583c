"""`load_tts`: any family's TTS object from a model as users name it — a GGUF, upstream's
published MOSS-TTS-GGUF directory, a checkpoint directory or a Hugging Face repo id — the family
read from the model (moss_tts.models.registry)."""

from __future__ import annotations

from .models.tts import CodecTTS


def tts_class(model) -> type[CodecTTS]:
    """The TTS class for a model GGUF or published directory, from its metadata only (cheap:
    no weights are loaded)."""
    from .models.registry import family_of_model

    return family_of_model(model).tts_class()


def load_tts(model, *, codec=None, backend=None, threads: int | None = None) -> CodecTTS:
    """A model and its codec (a GGUF, checkpoint directory or repo id, or a loaded Codec;
    None loads none: the research APIs need no codec) → its family's TTS.

    >>> tts = load_tts("delay.gguf", codec="codec.gguf")                    # doctest: +SKIP
    >>> audio, sr = tts.synthesize("Hello there.", seed=1)                  # doctest: +SKIP
    """
    from .hub import resolve_gguf
    from .models.registry import resolve_model

    path, family = resolve_model(model, resolve=lambda spec: resolve_gguf(spec, "model"))
    if isinstance(codec, str) or hasattr(codec, "__fspath__"):
        codec = str(resolve_gguf(str(codec), "codec"))
    return family.tts_class().load(path, codec=codec, backend=backend, threads=threads)
