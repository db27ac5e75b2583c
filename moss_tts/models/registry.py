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
NO_CODEC = ""       # a family that decodes with its own VAE (MOSS-SoundEffect v2.0)


@dataclass(frozen=True)
class Family:
    """A TTS family's card: what its class cannot say. `kind` is its GGUF `moss.kind` (how a
    file finds its row without importing any family); `tts` is its "module:Class", imported on
    first use, whose class declares its name (NAME), options (OPTIONS), `stream` keywords
    beyond options, seed and references (KEYWORDS: the knob table offers a knob to the families
    that name its keyword) and the keywords a request must give (REQUIRED); `converter` is its
    module under converters/; `detect(config.json) -> bool` recognizes its checkpoints (one
    row only may match)."""

    kind: str
    short: str                   # how --help names it
    tts: str
    converter: str
    detect: Callable[[dict], bool]
    default_model: str
    default_codec: str
    hub_outtype: str = "f32"     # what a repo id converts to when no type is asked for
    # converter keywords of that conversion beyond the type (the codecs' streaming decoder)
    hub_options: tuple[tuple[str, str], ...] = ()
    # A published checkpoint of another row's architecture (MOSS-TTSD on MossTTSDelay): `arch`
    # is the GGUF `moss.kind` its weights carry, `checkpoint` the name the GGUF records
    # (CHECKPOINT_KEY), `names` the marks (lower case, no separators) that name it in a repo
    # id, a directory, config.json's `_name_or_path` or its model card's title
    arch: str = ""
    checkpoint: str = ""
    names: tuple[str, ...] = ()

    @property
    def gguf_kind(self) -> str:
        return self.arch or self.kind

    def tts_class(self):
        return _attribute(self.tts)

    @property
    def name(self) -> str:
        """The name people know (its class's NAME)."""
        return self.tts_class().NAME

    def options_class(self):
        return self.tts_class().OPTIONS

    @property
    def keywords(self) -> tuple[str, ...]:
        return self.tts_class().KEYWORDS

    @property
    def required(self) -> tuple[str, ...]:
        return self.tts_class().REQUIRED

    @property
    def takes_reference(self) -> bool:
        """Whether its `stream` clones a voice (`reference=`): the published checkpoints that
        design a voice, make a sound or take one per speaker do not."""
        return "reference" in inspect.signature(self.tts_class().stream).parameters

    @property
    def reports_progress(self) -> bool:
        """Whether its `stream` takes `progress(done, total)`: a family whose work before the
        first audio takes minutes (a diffusion sampler's steps) says how far it is."""
        return "progress" in inspect.signature(self.tts_class().stream).parameters

    @property
    def batched(self) -> bool:
        """Whether it decodes several streams in one step (its TTS class has a batched decoder,
        BATCHED: `synthesize_many`, `serve --max-streams`, `batch --streams`)."""
        return self.tts_class().BATCHED is not None


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


def _is_sfx_v2(c: dict) -> bool:
    """A diffusers pipeline's model_index.json (read where the root has no config.json) naming
    upstream's pipeline class, or holding its latent window."""
    return c.get("_class_name") in ("MossSoundEffectPipeline", "WanAudioPipeline") \
        or "max_inference_seconds" in c


def _is_codec(c: dict) -> bool:
    return _model_type(c) in ("moss-audio-tokenizer", "speech_tokenizer") \
        or ("encoder_kwargs" in c and not str(_model_type(c)).startswith("moss_tts"))


# what the rows on MossTTSDelay weights share: its converter, detector and codec
ON_DELAY = dict(converter="converters.delay", detect=_is_delay, default_codec=CODEC_24K)
FAMILIES = (
    Family(kind="nano", short="Nano", tts="moss_tts.models.nano_tts:NanoTTS",
           converter="converters.nano", detect=lambda c: _model_type(c) == "moss_tts_nano",
           default_model="OpenMOSS-Team/MOSS-TTS-Nano", default_codec=CODEC_NANO),
    Family(kind="delay", short="Delay", tts="moss_tts.models.delay_tts:DelayTTS",
           default_model="OpenMOSS-Team/MOSS-TTS", hub_outtype="q6_K",
           checkpoint="MOSS-TTS", names=("mosstts",), **ON_DELAY),
    # MossTTSDelay's other published checkpoints (docs/upstream-notes.md §family-9): the same
    # runtime, another prompt and task each
    Family(kind="ttsd", short="TTSD", tts="moss_tts.models.delay_tasks:DialogueTTS",
           default_model="OpenMOSS-Team/MOSS-TTSD-v1.0", hub_outtype="q6_K",
           arch="delay", checkpoint="MOSS-TTSD-v1.0", names=("mossttsd", "ttsd"),
           **ON_DELAY),
    Family(kind="voicegen", short="VoiceGenerator",
           tts="moss_tts.models.delay_tasks:VoiceDesignTTS",
           default_model="OpenMOSS-Team/MOSS-VoiceGenerator", arch="delay",
           checkpoint="MOSS-VoiceGenerator", names=("voicegenerator", "voicegen"),
           **ON_DELAY),
    Family(kind="sfx", short="SoundEffect", tts="moss_tts.models.delay_tasks:SoundEffectTTS",
           default_model="OpenMOSS-Team/MOSS-SoundEffect", hub_outtype="q6_K",
           arch="delay", checkpoint="MOSS-SoundEffect", names=("soundeffect", "sfx"),
           **ON_DELAY),
    Family(kind="local", short="Local", tts="moss_tts.models.local_tts:LocalTTS",
           converter="converters.local", detect=_is_local,
           default_model="OpenMOSS-Team/MOSS-TTS-Local-Transformer", default_codec=CODEC_24K),
    Family(kind="local-v15", short="Local v1.5", tts="moss_tts.models.local_v15_tts:LocalV15TTS",
           converter="converters.local_v15", detect=_is_local_v15,
           default_model="OpenMOSS-Team/MOSS-TTS-Local-Transformer-v1.5",
           default_codec=CODEC_V2, hub_outtype="q6_K"),
    Family(kind="realtime", short="Realtime", tts="moss_tts.models.realtime_tts:RealtimeTTS",
           converter="converters.realtime",
           detect=lambda c: _model_type(c) == "moss_tts_realtime",
           default_model="OpenMOSS-Team/MOSS-TTS-Realtime", default_codec=CODEC_24K),
    # a diffusion pipeline, not a codec-token model (docs/upstream-notes.md §family-10)
    Family(kind="sfx-v2", short="SoundEffect v2",
           tts="moss_tts.models.soundeffect_v2_tts:SoundEffectV2TTS",
           converter="converters.soundeffect_v2", detect=_is_sfx_v2,
           default_model="OpenMOSS-Team/MOSS-SoundEffect-v2.0", default_codec=NO_CODEC,
           hub_outtype="q6_K"),      # its fastest type here: 0.57x f32's step (performance.md)
)
# the audio codecs convert like a family but speak nothing
CODEC = Family(kind="codec", short="codec", tts="moss_tts.codec:Codec",
               converter="converters.codec", detect=_is_codec, default_model=CODEC_NANO,
               default_codec=CODEC_NANO,
               # f32 encoder (codes equal upstream's), the decoder light where streaming needs
               # it (converters/codec.py STREAM_DECODER_TYPE: q6_K for the 24 kHz and v2)
               hub_options=(("decoder_type", "stream"),))
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


def families_table() -> str:
    """The README's families table, in Markdown, from the registry's rows, the knob table and
    the families' own classes (tests/models/test_registry.py keeps README.md equal to it, so no
    default drifts)."""
    from ..knobs import KNOBS, takes      # the knob table sits below the registry

    lines = ["| family | `--model` default | `--codec` default | its own flags | frame budget "
             "(default, most) |", "|---|---|---|---|---|"]
    greedy = next(k for k in KNOBS if k.name == "greedy")   # taken by the token samplers
    for f in FAMILIES:
        # "own": not shared by every family of its kind of sampler (token or diffusion); a
        # kind of one (the diffusion pipeline) lists every knob but the seed
        peers = [g for g in FAMILIES if takes(g, greedy) == takes(f, greedy)]
        own = [k.flag for k in KNOBS if takes(f, k) and k.keyword != "seed"
               and (len(peers) == 1 or not all(takes(g, k) for g in peers))]
        own += ["--prompt-text", "--prompt-audio"] if "prompt_text" in f.keywords else []
        b = f.tts_class().BUDGET
        knob = next(k for k in KNOBS if k.keyword == b.keyword)
        codec = f"`{f.default_codec}`" if f.default_codec else "its own VAE"
        lines.append(f"| {f.name} | `{f.default_model}` | {codec} | "
                     f"{' '.join(f'`{x}`' for x in own)} | `{knob.flag}` {b.default} "
                     f"{b.unit}{' per text chunk' if b.per_chunk else ''}, at most {b.limit} |")
    return "\n".join(lines) + "\n"
