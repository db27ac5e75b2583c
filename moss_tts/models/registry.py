"""The family registry: one `Family` row per MOSS-TTS family (design.md §1). Every front end
(`tts`, `serve`, `batch`, `load_tts`, `convert`, the hub loader) finds a family, its TTS class,
its converter, its options class and its defaults here, and nowhere else."""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from ..errors import ConfigError, InputError, ModelFileError

CODEC_24K = "OpenMOSS-Team/MOSS-Audio-Tokenizer"
CODEC_NANO = "OpenMOSS-Team/MOSS-Audio-Tokenizer-Nano"
CODEC_V2 = "OpenMOSS-Team/MOSS-Audio-Tokenizer-v2"


@dataclass(frozen=True)
class Family:
    """A TTS family. `kind` is its GGUF `moss.kind`; `tts` and `options` are "module:Class"
    names imported on first use (so `--help` stays cheap); `converter` is its module under
    converters/; `detect(config.json) -> bool` recognizes its checkpoints (one row only may
    match); `keywords` are the `stream` keywords of the family beyond `options`, `seed` and the
    references (the knob table offers a knob to the families whose row names its keyword)."""

    kind: str
    name: str                    # the name people know
    short: str                   # how --help names it
    tts: str
    options: str
    converter: str
    detect: Callable[[dict], bool]
    keywords: tuple[str, ...]
    default_model: str
    default_codec: str
    codec_name: str              # what to pass as --codec, in words
    hub_outtype: str = "f32"     # what a repo id converts to when no type is asked for
    convert_flags: tuple[str, ...] = ()   # converters.registry.CONVERT_FLAGS it takes

    def tts_class(self):
        return _attribute(self.tts)

    def options_class(self):
        return _attribute(self.options)

    def convert(self, *args, **kwargs):
        """The family converter's `convert(model, out, *, outtype, strict, progress, ...)`."""
        return importlib.import_module(self.converter).convert(*args, **kwargs)


def _attribute(spec: str):
    module, name = spec.split(":")
    return getattr(importlib.import_module(module), name)


def _model_type(config: dict) -> str | None:
    return config.get("model_type")


# config.json → family: structure first, since MossTTSLocal (1.7B) says `moss_tts_delay` like
# Delay and differs by its local_* fields, and Local v1.5 says `moss_tts_local` or carries a
# gpt2_config (docs/upstream-notes.md, P26) — as Nano does, which says `moss_tts_nano`
def _is_local_v15(c: dict) -> bool:
    return _model_type(c) == "moss_tts_local" or (
        "gpt2_config" in c and _model_type(c) != "moss_tts_nano")


def _is_local(c: dict) -> bool:
    return "local_num_layers" in c and not _is_local_v15(c)


def _is_delay(c: dict) -> bool:
    return _model_type(c) == "moss_tts_delay" and not _is_local(c) and not _is_local_v15(c)


def _is_codec(c: dict) -> bool:
    return _model_type(c) in ("moss-audio-tokenizer", "speech_tokenizer") \
        or ("encoder_kwargs" in c and not str(_model_type(c)).startswith("moss_tts"))


FAMILIES = (
    Family("nano", "MOSS-TTS-Nano", "Nano", "moss_tts.models.nano_tts:NanoTTS",
           "moss_tts.sampling:SamplingOptions", "converters.nano",
           lambda c: _model_type(c) == "moss_tts_nano",
           ("max_frames", "max_text_tokens", "prompt_text"),
           "OpenMOSS-Team/MOSS-TTS-Nano", CODEC_NANO, "the MOSS-Audio-Tokenizer-Nano GGUF"),
    Family("delay", "MOSS-TTS (Delay)", "Delay", "moss_tts.models.delay_tts:DelayTTS",
           "moss_tts.sampling:DelaySamplingOptions", "converters.delay",
           _is_delay,
           ("max_new_rows", "language", "instruction", "tokens", "seconds", "prompt_text"),
           "OpenMOSS-Team/MOSS-TTS", CODEC_24K, "the MOSS-Audio-Tokenizer (24 kHz) GGUF",
           hub_outtype="q6_K", convert_flags=("head_type", "embed_type")),
    Family("local", "MOSS-TTS-Local-Transformer", "Local",
           "moss_tts.models.local_tts:LocalTTS", "moss_tts.sampling:LocalSamplingOptions",
           "converters.local",
           _is_local,
           ("max_frames", "language", "instruction", "tokens", "seconds", "n_vq_for_inference",
            "prompt_text"),
           "OpenMOSS-Team/MOSS-TTS-Local-Transformer", CODEC_24K,
           "the MOSS-Audio-Tokenizer (24 kHz) GGUF", convert_flags=("head_type", "embed_type")),
    Family("local-v15", "MOSS-TTS-Local-Transformer-v1.5", "Local v1.5",
           "moss_tts.models.local_v15_tts:LocalV15TTS",
           "moss_tts.sampling:LocalV15SamplingOptions", "converters.local_v15",
           _is_local_v15,
           ("max_frames", "language", "instruction", "tokens", "seconds", "prompt_text"),
           "OpenMOSS-Team/MOSS-TTS-Local-Transformer-v1.5", CODEC_V2,
           "the MOSS-Audio-Tokenizer-v2 (48 kHz stereo) GGUF", hub_outtype="q6_K",
           convert_flags=("embed_type",)),
    Family("realtime", "MOSS-TTS-Realtime", "Realtime",
           "moss_tts.models.realtime_tts:RealtimeTTS",
           "moss_tts.sampling:RealtimeSamplingOptions", "converters.realtime",
           lambda c: _model_type(c) == "moss_tts_realtime", ("max_frames",),
           "OpenMOSS-Team/MOSS-TTS-Realtime", CODEC_24K,
           "the MOSS-Audio-Tokenizer (24 kHz) GGUF", convert_flags=("head_type", "embed_type")),
)
# the audio codecs convert like a family but speak nothing
CODEC = Family("codec", "MOSS-Audio-Tokenizer", "codec", "moss_tts.codec:Codec", "",
               "converters.codec", _is_codec, (), CODEC_NANO, CODEC_NANO, "")
DEFAULT = FAMILIES[0]            # what `tts` and `serve` speak with when no --model is given
BY_KIND = {f.kind: f for f in FAMILIES}
CONVERTIBLE = {f.kind: f for f in (CODEC, *FAMILIES)}


def family(kind: str) -> Family:
    """The row of a GGUF kind (or `convert` family name)."""
    try:
        return CONVERTIBLE[kind]
    except KeyError:
        raise ModelFileError(f"unknown model family {kind!r}; known: "
                             f"{', '.join(CONVERTIBLE)}") from None


def family_of_config(config: dict) -> Family:
    """The family (or the codec) a checkpoint's config.json holds."""
    found = [f for f in (CODEC, *FAMILIES) if f.detect(config)]
    if len(found) != 1:
        which = "matches no family" if not found else \
            f"matches {' and '.join(f.kind for f in found)}"
        raise ConfigError(f"model_type {_model_type(config)!r}: the checkpoint {which} this "
                          f"version converts ({', '.join(CONVERTIBLE)})")
    return found[0]


def family_of_model(model) -> Family:
    """The family of a model GGUF or upstream's published MOSS-TTS-GGUF directory, from its
    metadata only (no weights are loaded)."""
    from ..ggml.weights import KIND_KEY, GGUFFile
    from .delay_published import is_published_dir

    if is_published_dir(model):           # upstream's llama.cpp layout is MOSS-TTS (Delay)
        return BY_KIND["delay"]
    if Path(model).is_dir():
        raise ModelFileError(f"{model}: a directory that is not a published MOSS-TTS-GGUF one "
                             "(embeddings/, lm_heads/) — convert a checkpoint with "
                             "`python -m moss_tts convert <family>`")
    with GGUFFile(model) as f:
        kind = f.get(KIND_KEY)
    if kind not in BY_KIND:
        found = f"a {kind!r} GGUF" if kind else "not a moss-tts GGUF (no moss.kind)"
        *rest, last = BY_KIND
        raise ModelFileError(f"{model}: {found}, not a speech model — pass a "
                             f"{', '.join(rest)} or {last} model GGUF")
    return BY_KIND[kind]


def resolve_model(spec, *, resolve) -> tuple[str, Family]:
    """A model as users name it → (a path `load` takes, its family): a GGUF file or a published
    directory as they are; a checkpoint directory or Hugging Face repo id converted once into
    the cache by the family its config.json names (`resolve(spec) -> path`: the hub's
    `resolve_gguf(spec, "model")`, or a front end's own with progress — passed in, since the
    hub reads this registry: importing it here would close a cycle)."""
    from .delay_published import is_published_dir

    spec = str(spec)
    if not spec.strip():
        raise InputError("the model is empty: pass a model GGUF, directory or repo id")
    if Path(spec).is_file() or is_published_dir(spec):
        path = spec
    else:
        path = str(resolve(spec))
    return path, family_of_model(path)




def convert_options(kind: str, given: dict) -> dict:
    """`convert`'s family-only flags set in `given` (parsed arguments by dest) as the family
    converter's keywords; a flag the family does not take is an error, not ignored."""
    from converters.registry import CONVERT_FLAGS

    out = {}
    for key in CONVERT_FLAGS:
        if given.get(key) is None:
            continue
        if key not in family(kind).convert_flags:
            takers = [f.kind for f in CONVERTIBLE.values() if key in f.convert_flags]
            raise ConfigError(f"--{key.replace('_', '-')} applies to convert "
                              f"{' / '.join(takers)} only, not {kind}")
        out[key] = given[key]
    return out


def convert_flag_help() -> dict[str, str]:
    """`convert`'s family-only flags → their help, prefixed by the families that take them."""
    from converters.registry import CONVERT_FLAGS

    return {key: "/".join(f.kind for f in CONVERTIBLE.values() if key in f.convert_flags)
            + f" only: {text}" for key, text in CONVERT_FLAGS.items()}
