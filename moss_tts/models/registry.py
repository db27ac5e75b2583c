"""The family registry: one `Family` row per MOSS-TTS family (design.md §1). Every front end
(`tts`, `serve`, `batch`, `load_tts`, `convert`, the hub loader) finds a family, its TTS class,
its converter, its options class and its defaults here, and nowhere else."""

from __future__ import annotations

import importlib
import inspect
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
    # A published checkpoint of another row's architecture (MOSS-TTSD on MossTTSDelay): `arch`
    # is the GGUF `moss.kind` its weights carry, `checkpoint` the name the GGUF records
    # (CHECKPOINT_KEY), `names` the marks (lower case, no separators) that name it in a repo
    # id, a directory, config.json's `_name_or_path` or its model card's title
    arch: str = ""
    checkpoint: str = ""
    names: tuple[str, ...] = ()
    # `keywords` a request must give (MOSS-VoiceGenerator makes its voice from `instruction`)
    required: tuple[str, ...] = ()

    @property
    def gguf_kind(self) -> str:
        return self.arch or self.kind

    def tts_class(self):
        return _attribute(self.tts)

    def options_class(self):
        return _attribute(self.options)

    @property
    def takes_reference(self) -> bool:
        """Whether its `stream` clones a voice (`reference=`): the published checkpoints that
        design a voice, make a sound or take one per speaker do not."""
        return "reference" in inspect.signature(self.tts_class().stream).parameters

    @property
    def batched(self) -> bool:
        """Whether it decodes several streams in one step (its TTS class has a batched decoder,
        BATCHED: `synthesize_many`, `serve --max-streams`, `batch --streams`)."""
        return self.tts_class().BATCHED is not None

    def convert(self, *args, **kwargs):
        """The family converter's `convert(model, out, *, outtype, strict, progress, ...)`; a
        converter shared by several checkpoints is told which one it writes."""
        if self.checkpoint:
            kwargs["checkpoint"] = self
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
           hub_outtype="q6_K", convert_flags=("head_type", "embed_type"),
           checkpoint="MOSS-TTS", names=("mosstts",)),
    # MossTTSDelay's other published checkpoints (docs/upstream-notes.md §family-9): the same
    # runtime, another prompt and task each
    Family("ttsd", "MOSS-TTSD v1.0", "TTSD", "moss_tts.models.delay_tasks:DialogueTTS",
           "moss_tts.sampling:DialogueSamplingOptions", "converters.delay", _is_delay,
           ("max_new_rows", "speakers", "language"),
           "OpenMOSS-Team/MOSS-TTSD-v1.0", CODEC_24K, "the MOSS-Audio-Tokenizer (24 kHz) GGUF",
           hub_outtype="q6_K", convert_flags=("head_type", "embed_type"),
           arch="delay", checkpoint="MOSS-TTSD-v1.0", names=("mossttsd", "ttsd")),
    Family("voicegen", "MOSS-VoiceGenerator", "VoiceGenerator",
           "moss_tts.models.delay_tasks:VoiceDesignTTS",
           "moss_tts.sampling:VoiceDesignSamplingOptions", "converters.delay", _is_delay,
           ("max_new_rows", "instruction", "language", "tokens", "seconds"),
           "OpenMOSS-Team/MOSS-VoiceGenerator", CODEC_24K,
           "the MOSS-Audio-Tokenizer (24 kHz) GGUF", convert_flags=("head_type", "embed_type"),
           arch="delay", checkpoint="MOSS-VoiceGenerator", names=("voicegenerator", "voicegen"),
           required=("instruction",)),
    Family("sfx", "MOSS-SoundEffect", "SoundEffect", "moss_tts.models.delay_tasks:SoundEffectTTS",
           "moss_tts.sampling:SoundEffectSamplingOptions", "converters.delay", _is_delay,
           ("max_new_rows", "sound", "tokens", "seconds"),
           "OpenMOSS-Team/MOSS-SoundEffect", CODEC_24K, "the MOSS-Audio-Tokenizer (24 kHz) GGUF",
           hub_outtype="q6_K", convert_flags=("head_type", "embed_type"),
           arch="delay", checkpoint="MOSS-SoundEffect", names=("soundeffect", "sfx")),
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
BASES = [f.kind for f in FAMILIES if not f.arch]        # the GGUF kinds of speech models
CHECKPOINT_KEY = "moss.checkpoint"      # which published checkpoint a GGUF's weights are
CONVERTIBLE = {f.kind: f for f in (CODEC, *FAMILIES)}


def family(kind: str) -> Family:
    """The row of a GGUF kind (or `convert` family name)."""
    try:
        return CONVERTIBLE[kind]
    except KeyError:
        raise ModelFileError(f"unknown model family {kind!r}; known: "
                             f"{', '.join(CONVERTIBLE)}") from None


def family_of_config(config: dict) -> Family:
    """The architecture (or the codec) a checkpoint's config.json holds: its base row, the one
    whose GGUF kind it is (`family_of_checkpoint` tells its published checkpoints apart)."""
    found = [f for f in (CODEC, *FAMILIES) if not f.arch and f.detect(config)]
    if len(found) != 1:
        which = "matches no family" if not found else \
            f"matches {' and '.join(f.kind for f in found)}"
        raise ConfigError(f"model_type {_model_type(config)!r}: the checkpoint {which} this "
                          f"version converts ({', '.join(CONVERTIBLE)})")
    return found[0]


def checkpoints_of(base: Family) -> list[Family]:
    """The rows sharing `base`'s architecture (itself first)."""
    return [base] + [f for f in FAMILIES if f.arch == base.kind]


def family_of_checkpoint(model_dir, *, source: str | None = None) -> Family:
    """The row of a checkpoint directory (`checkpoint_candidates`); where only a name could
    tell (MOSS-TTSD or MOSS-SoundEffect) an error says how to name it."""
    rows, why = checkpoint_candidates(model_dir, source=source)
    if len(rows) > 1:
        raise ConfigError(f"{model_dir}: a MossTTSDelay checkpoint with {why} is MOSS-TTSD or "
                          "MOSS-SoundEffect, and nothing names which: convert it with "
                          "`python -m moss_tts convert ttsd` (or `sfx`)")
    return rows[0]


def checkpoint_candidates(model_dir, *, source: str | None = None) -> tuple[list[Family], str]:
    """The rows a checkpoint directory may be, and what told: its architecture from
    config.json, then which of that architecture's published checkpoints it is, from the names
    it goes by (config.json's `_name_or_path`, the model card's title, the repo id or directory
    it came from, nearest first), else from its shape: 16 codebooks at 2048 wide is
    MOSS-VoiceGenerator; 16 at 8B is MOSS-TTSD or MOSS-SoundEffect (two rows: only a name tells
    them apart); any other count is MOSS-TTS (docs/upstream-notes.md §family-9)."""
    from converters.checkpoint import read_config

    model_dir = Path(model_dir)
    config = read_config(model_dir)
    base = family_of_config(config)
    rows = checkpoints_of(base)
    if len(rows) == 1:
        return [base], f"its config.json's model_type {_model_type(config)!r}"
    names = _names_of(model_dir, config, source)
    by_name = named_checkpoint(rows, names)
    if by_name is not None:
        name = next(n for n in names if named_checkpoint(rows, [n]))
        return [by_name], "by its name" if name == source else f"named {name.lstrip('# ')!r}"
    n_vq = config.get("n_vq")
    width = (config.get("language_config") or {}).get("hidden_size", 0)
    if n_vq == 16 and width <= 2048:
        return [BY_KIND["voicegen"]], f"16 codebooks at width {width}"
    if n_vq == 16:
        return [BY_KIND["ttsd"], BY_KIND["sfx"]], f"16 codebooks at width {width}"
    return [base], f"{n_vq} codebooks, where the other published checkpoints have 16"


def checked_checkpoint(given: Family, model_dir, *, source: str | None = None) -> Family:
    """`given` (the row `convert` was asked for) when the checkpoint may be it; else a
    ConfigError saying what the checkpoint is, what told, and the command that converts it:
    converting MOSS-TTS as MOSS-TTSD would give it the wrong prompt, and the GGUF would say
    MOSS-TTSD."""
    rows, why = checkpoint_candidates(model_dir, source=source)
    if given in rows:
        return given
    command = f"`python -m moss_tts convert {rows[0].kind}`" + "".join(
        f" (or `{r.kind}`)" for r in rows[1:])
    what = " or ".join(r.checkpoint or r.name for r in rows)
    raise ConfigError(f"{source or model_dir} is {what} ({why}), not "
                      f"{given.checkpoint or given.name}: convert it with {command}")


def named_checkpoint(rows: list[Family], names: list[str]) -> Family | None:
    """The first row one of `names` (nearest first) marks, or None; a name marking the base
    (MOSS-TTS) ends the search too, so a folder above it cannot name another checkpoint."""
    for name in names:
        flat = "".join(ch for ch in name.lower() if ch.isalnum())
        for row in sorted(rows, key=lambda r: not r.arch):     # "mossttsd" before "mosstts"
            if any(mark in flat for mark in row.names):
                return row
    return None


def _names_of(model_dir: Path, config: dict, source: str | None) -> list[str]:
    names = [str(config.get("_name_or_path") or "")]
    card = model_dir / "README.md"
    if card.is_file():
        heading = next((line for line in card.read_text(errors="replace").splitlines()
                        if line.startswith("# ")), "")
        names.append(heading)
    if source:
        names.append(source)
    # a Hugging Face cache directory is models--OWNER--NAME/snapshots/HASH: the name is above
    names += [part for part in reversed(model_dir.resolve().parts)]
    return [n for n in names if n]


def family_of_model(model) -> Family:
    """The family of a model GGUF or upstream's published MOSS-TTS-GGUF directory, from its
    metadata only (no weights are loaded): its kind, then the published checkpoint it records."""
    from ..ggml.weights import KIND_KEY, GGUFFile
    from .delay_published import is_published_dir

    if is_published_dir(model):           # upstream's llama.cpp layout is MOSS-TTS (Delay)
        return BY_KIND["delay"]
    if Path(model).is_dir():
        raise ModelFileError(f"{model}: a directory that is not a published MOSS-TTS-GGUF one "
                             "(embeddings/, lm_heads/) — convert a checkpoint with "
                             "`python -m moss_tts convert <family>`")
    with GGUFFile(model) as f:
        kind, checkpoint = f.get(KIND_KEY), f.get(CHECKPOINT_KEY)
    if kind not in BY_KIND or BY_KIND[kind].arch:
        found = f"a {kind!r} GGUF" if kind else "not a moss-tts GGUF (no moss.kind)"
        *rest, last = BASES
        raise ModelFileError(f"{model}: {found}, not a speech model — pass a "
                             f"{', '.join(rest)} or {last} model GGUF")
    return checkpoint_row(BY_KIND[kind], checkpoint)


def checkpoint_row(base: Family, checkpoint: str | None) -> Family:
    """The row of `base`'s published checkpoint named `checkpoint` (None, or one this version
    does not know, as a fine-tune may record: the base row, whose prompt it was made from)."""
    return next((f for f in checkpoints_of(base) if checkpoint and f.checkpoint == checkpoint),
                base)


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
