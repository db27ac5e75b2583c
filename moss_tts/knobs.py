"""Each user-facing speech knob, declared once: its name, the options field or `stream` keyword
it sets, its type, its bounds and its help. The `tts` flags, the server's request fields and
live config, and the batch manifest's columns are all generated from `KNOBS`, and every front
end turns what a user gave into a family's `stream` keywords through `synthesis_keywords`, so
they cannot disagree; the Python API checks its `stream` keywords against the same table
(`checked_keywords`, run by tts.family_stream), so a bound holds on every surface. A sampling
knob's bounds are its options class's own (its `__post_init__` checks them); which families
take a knob is read from their options classes and registry rows.
"""

from __future__ import annotations

import dataclasses
import inspect
import math
from dataclasses import dataclass
from typing import Callable

from .errors import InputError
from .speakers import speaker_specs

SEED_LIMIT = 2**32                   # numpy's seed range for one 32-bit word
MAX_PROMPT_CHARS = 1024              # a style instruction or a language name, not a text
# how each surface names the text a family speaks (its TTS class's MAX_TEXT_CHARS bounds it)
TEXT_NAMES = {"api": "text", "cli": "--text", "request": "'input'", "manifest": "text"}


@dataclass(frozen=True)
class Knob:
    """`name` is the manifest column and request field; the flag is `--name` with dashes.
    `field` sets the family's options class (sampling), `keyword` a `stream` keyword; `low` and
    `high` bound it for every family (a string's length for `high`), `limit(tts_class)` is the
    family's own upper bound where it has one (a string's length, too; None: no bound),
    `check(tts_class, value)` the family's own
    rule for a value (returning it as the family takes it); `aliases` are older spellings
    every surface still accepts (the first is also a flag). A list knob (`kind` list) has a
    form of its own: `items(value, name, surface, from_text=)` checks it as JSON gives it (a
    request's field, a manifest's column), and its CLI flag `cli` gives one item, repeated
    (cli/tts.py parses those)."""

    name: str
    kind: type
    help: str
    field: str | None = None
    keyword: str | None = None
    low: float = 1
    high: float | None = None
    limit: Callable | None = None
    check: Callable | None = None
    aliases: tuple[str, ...] = ()
    items: Callable | None = None
    cli: str | None = None

    @property
    def flag(self) -> str:
        return "--" + (self.cli or self.name).replace("_", "-")


def _model_language(tts_class, value: str) -> str:
    """A language the family's model card lists (its TTS class's LANGUAGES), as its name."""
    from .text.languages import language_name     # the text package is loaded on first use

    return language_name(value, tts_class.LANGUAGES)


KNOBS = (
    Knob("temperature", float, "audio temperature", field="audio_temperature"),
    Knob("text_temperature", float, "text temperature (Nano: of the stop decision)",
         field="text_temperature"),
    Knob("top_k", int, "audio top-k, 0 = off", field="audio_top_k"),
    Knob("top_p", float, "audio top-p", field="audio_top_p"),
    Knob("repetition_penalty", float, "audio repetition penalty, 1 = off",
         field="audio_repetition_penalty"),
    Knob("text_top_k", int, "text top-k, 0 = off", field="text_top_k"),
    Knob("text_top_p", float, "text top-p", field="text_top_p"),
    Knob("greedy", bool, "greedy decoding as upstream's greedy (argmax; the repetition penalty "
         "stays where upstream keeps it); takes no sampling knob"),
    Knob("seed", int, "random seed, 0 or more (default: unseeded; batch: from the line's id)",
         keyword="seed", low=0, high=SEED_LIMIT - 1),
    Knob("max_frames", int, "cap of generated frames", keyword="max_frames",
         limit=lambda cls: cls.BUDGET.limit, aliases=("max_new_frames",)),
    Knob("max_new_rows", int, "cap of generated rows (frames plus the staircase)",
         keyword="max_new_rows", limit=lambda cls: cls.BUDGET.limit),
    Knob("voice_clone_max_text_tokens", int, "text tokens per chunk of a long text",
         keyword="max_text_tokens", limit=lambda cls: cls.MAX_TEXT_TOKENS,
         aliases=("max_text_tokens",)),
    Knob("language", str, "the text's language: a name or code from the model card (French, "
         "fr, ...)", keyword="language", high=MAX_PROMPT_CHARS, check=_model_language),
    Knob("instruction", str, "a description of the voice (e.g. 'a calm, low female voice')",
         keyword="instruction", high=MAX_PROMPT_CHARS,
         aliases=("instructions",)),                           # OpenAI's speech field
    # a duration longer than the family's frame budget can ever make could never be heard
    Knob("tokens", int, "the duration in codec frames (or seconds)", keyword="tokens",
         limit=lambda cls: cls.BUDGET.limit),
    Knob("seconds", float, "the duration in seconds (or tokens)", keyword="seconds", low=0,
         limit=lambda cls: cls.MAX_SECONDS or cls.BUDGET.limit / cls.FRAME_RATE),
    Knob("n_vq", int, "codebooks to generate and decode (variable bitrate; default all)",
         keyword="n_vq_for_inference"),
    # the description is the family's text: its class's MAX_TEXT_CHARS bounds both
    Knob("sound", str, "the sound to make, described (e.g. 'rain on a tin roof'; instead of "
         "the text)", keyword="sound", limit=lambda cls: cls.MAX_TEXT_CHARS),
    # MOSS-SoundEffect v2.0's diffusion sampler (its `steps` is its budget: the work a request
    # asks for)
    Knob("steps", int, "denoising steps (each runs the DiT on the guided pair)",
         keyword="steps", limit=lambda cls: cls.BUDGET.limit),
    Knob("cfg_scale", float, "classifier-free guidance scale (1 = none: the negative prompt "
         "is unused)", field="cfg_scale", low=0),
    Knob("shift", float, "the flow-match schedule's shift (higher: more steps at high noise)",
         field="shift", low=0),
    Knob("negative", str, "what the sound should not be (the guidance's negative prompt)",
         keyword="negative", high=MAX_PROMPT_CHARS, aliases=("negative_prompt",)),
    Knob("short_latent", bool, "denoise only the seconds asked, not the checkpoint's whole "
         "window (not upstream's audio: faster by about window/seconds)",
         keyword="short_latent"),
    # a request's or manifest's list of speakers (speakers.py); the CLI's --speaker
    # N=SRC[:TRANSCRIPT] gives one, SRC a stored voice or an audio file
    Knob("speakers", list, "speaker N's voice, one flag per speaker: SRC a stored voice (with "
         "its stored transcript unless ':' and one follow) or an audio file, then ':' and what "
         "it says; a speaker given none is the model's choice", keyword="speakers",
         items=speaker_specs, cli="speaker"),
)
BY_NAME = {k.name: k for k in KNOBS}
SPELLINGS = {alias: k for k in KNOBS for alias in (k.name, *k.aliases)}   # every accepted name
SAMPLING = tuple(k for k in KNOBS if k.field)


def spelled(knob: Knob, surface: str, given_as: dict | None = None) -> str:
    """How `surface` ("cli", "request", "manifest", "api") names a knob in an error: as the
    user spelled it where `given_as` (knob name → spelling) says, else by its name (the API:
    its `stream` keyword or options field)."""
    if surface == "cli":
        return knob.flag
    if surface == "api":
        return knob.keyword or knob.field or knob.name
    name = (given_as or {}).get(knob.name, knob.name)
    return repr(name) if surface == "request" else name


def takes(family, knob: Knob) -> bool:
    """Whether `family` (a registry row) takes `knob`."""
    if knob.field:
        return knob.field in {f.name for f in dataclasses.fields(family.options_class())}
    if knob.keyword is None:                 # greedy: a switch of the options class
        return hasattr(family.options_class(), "greedy")
    return knob.keyword == "seed" or knob.keyword in family.keywords


def families_taking(knob: Knob, families) -> list:
    return [f for f in families if takes(f, knob)]


def parse(knob: Knob, value, surface: str, *, from_text: bool = True):
    """A raw value (a JSON value, or, with from_text, text from a CSV cell or argv) → the
    knob's type, checked against the bounds that hold for every family; InputError names the
    knob."""
    name = spelled(knob, surface)
    if knob.kind is list:
        return knob.items(value, name, surface, from_text=from_text)
    if from_text and isinstance(value, str) and knob.kind is not str:
        value = _from_text(knob, value, name)
    if knob.kind is bool:
        if not isinstance(value, bool):
            raise InputError(f"{name} must be true or false, got {value!r}")
        return value
    if knob.kind is str:
        if not isinstance(value, str):
            raise InputError(f"{name} must be a string, got {kind_of(value)}")
        if knob.high is not None and len(value) > knob.high:
            raise InputError(f"{name} must be at most {knob.high:g} characters, got {len(value)}")
        return value
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise InputError(f"{name} must be {'an integer' if knob.kind is int else 'a number'}, "
                         f"got {kind_of(value)}")
    if not math.isfinite(value):
        raise InputError(f"{name} must be a finite number, got {value}")
    given = value
    if knob.kind is int:
        if not float(value).is_integer():
            raise InputError(f"{name} must be a whole number, got {value}")
        value = int(value)
    if knob.field:
        return _within_some_family(knob, value, surface)
    if value < knob.low or (knob.low == 0 and knob.kind is float and value == 0):
        least = "above 0" if knob.kind is float and knob.low == 0 else f"at least {knob.low}"
        raise InputError(f"{name} must be {least}, got {given}")
    if knob.high is not None and value > knob.high:
        raise InputError(f"{name} must be at most {int(knob.high)}, got {given}")
    return value


def _within_some_family(knob: Knob, value, surface: str):
    """A sampling value some family's options class takes (each family's own check runs again
    once the family is known: a top-k is bounded by Delay's and Nano's classes alike)."""
    from .sampling import OPTIONS_CLASSES

    first = None
    for options in OPTIONS_CLASSES:
        if knob.field not in {f.name for f in dataclasses.fields(options)}:
            continue
        try:
            options(**{knob.field: value})
            return value
        except InputError as e:
            first = first or e
    raise renamed(first, surface)


def _from_text(knob: Knob, text: str, name: str):
    if knob.kind is bool:
        if text.lower() in ("true", "1", "yes", "false", "0", "no"):
            return text.lower() in ("true", "1", "yes")
        raise InputError(f"{name} must be true or false, got {text!r}")
    try:
        return knob.kind(text.strip())
    except ValueError:
        raise InputError(f"{name} must be {'a whole number' if knob.kind is int else 'a number'}"
                         f", got {text!r}") from None


def kind_of(value) -> str:
    return {bool: "a boolean", int: "an integer", float: "a number", str: "a string",
            list: "a list", dict: "an object", type(None): "null"}.get(type(value), "a value")


def synthesis_keywords(family, given: dict, surface: str, *, lenient: tuple[str, ...] = (),
                       given_as: dict | None = None) -> dict:
    """Knob values a user gave (knob name → value parsed by `parse`) → the family's `stream`
    keywords: `options` (its options class over its defaults, or its greedy variant) and each
    keyword knob checked against the family's own limit. A knob the family does not take is
    an InputError naming it in the surface's spelling, except the `lenient` ones, dropped
    (the server's OpenAI `instructions`, which clients send to any model). `given_as`: how
    the user spelled each knob (an alias), for the errors."""
    cls, options_class = family.tts_class(), family.options_class()
    knobs = {BY_NAME[name]: value for name, value in given.items() if value is not None}
    unused = [k for k in knobs if not takes(family, k) and k.name not in lenient]
    if unused:
        raise InputError(f"{spelled(unused[0], surface, given_as)} is not a {family.name} "
                         "option: leave it out, or use a model of a family that takes it")
    knobs = {k: v for k, v in knobs.items() if takes(family, k)}
    sampling = {k: v for k, v in knobs.items() if k.field}
    if knobs.get(BY_NAME["greedy"]) and sampling:
        raise InputError(f"{spelled(BY_NAME['greedy'], surface)} takes no sampling knob: leave "
                         f"out {spelled(next(iter(sampling)), surface, given_as)} (or greedy)")
    try:
        options = options_class(**{k.field: v for k, v in sampling.items()})
    except InputError as e:
        raise renamed(e, surface, given_as) from None
    if knobs.get(BY_NAME["greedy"]):
        options = options.greedy()
    words = {"options": options}
    for knob, value in knobs.items():
        if knob.keyword is None:
            continue
        try:
            words[knob.keyword] = within_family(knob, cls, value,
                                                spelled(knob, surface, given_as))
        except InputError as e:
            raise renamed(e, surface, given_as) from None
    return words


def within_family(knob: Knob, tts_class, value, name: str):
    """A parsed value within the family's own limit for `knob` (a text's length) and as the
    family takes it (its `check`); the InputError names `name`."""
    most = None if knob.limit is None else knob.limit(tts_class)
    size = len(value) if isinstance(value, str) else value
    if most is not None and size > most:
        unit = " characters" if isinstance(value, str) else ""
        raise InputError(f"{name} must be at most {shown(most)}{unit} for {tts_class.NAME}, "
                         f"got {shown(size)}")
    return value if knob.check is None else knob.check(tts_class, value)


def shown(number) -> str:
    """A bound or a value as an error writes it: whole numbers in full, others short (1e+300)."""
    if float(number).is_integer() and abs(number) < 1e16:
        return str(int(number))
    return f"{number:g}"


def checked_keywords(tts_class, keywords: dict) -> dict:
    """The Python API's side of the table (tts.family_stream runs it before anything else):
    each `stream` keyword that is a knob's (not `options`, not a list), checked as the front
    ends check what a user gives — its type, the bounds every family shares and the family's
    own — so each bound holds on every surface; the InputError names the keyword. The frame
    budget is left to the family's FrameBudget, which checks the same limit."""
    out = dict(keywords)
    for knob in KNOBS:
        if knob.keyword in (None, tts_class.BUDGET.keyword) or knob.kind is list \
                or out.get(knob.keyword) is None:
            continue
        value = parse(knob, out[knob.keyword], "api", from_text=False)
        out[knob.keyword] = within_family(knob, tts_class, value, knob.keyword)
    return out


def bounded_text(tts_class, text, surface: str, name: str | None = None):
    """The text a family speaks within the family's bound (its TTS class's MAX_TEXT_CHARS:
    MOSS-SoundEffect's description, one prompt that is never cut into chunks; None where a
    long text is cut into chunks), checked by every front end before the model is used, and
    by the API; the InputError names the text as the surface does (`name`: the flag that
    gave it)."""
    most = getattr(tts_class, "MAX_TEXT_CHARS", None)
    if most is not None and isinstance(text, str) and len(text) > most:
        raise InputError(f"{name or TEXT_NAMES[surface]} must be at most {most} characters "
                         f"for {tts_class.NAME}, got {len(text)}")
    return text


def check_required(family, words: dict, surface: str) -> None:
    """The knobs `family` cannot speak without (its row's `required`: MOSS-VoiceGenerator's
    instruction) are among its `stream` keywords `words` (synthesis_keywords' result), or an
    InputError names the first one missing as the surface spells it (a request: every
    spelling, so an OpenAI client reads its `instructions`)."""
    for keyword in family.required:
        if words.get(keyword) is None:
            knob = next(k for k in KNOBS if k.keyword == keyword)
            names = spelled(knob, surface) + "".join(
                f" (or {a!r})" for a in knob.aliases if surface == "request")
            raise InputError(f"{names} is required for {family.name}: {knob.help}")


def renamed(error: InputError, surface: str, given_as: dict | None = None) -> InputError:
    """An InputError raised by the API (naming an options field or `stream` keyword first)
    spelled as `surface` names that knob, so a CLI user reads `--n-vq`, not
    `n_vq_for_inference`; a knob the message quotes in backticks (`greedy`) too."""
    message = quoted_knobs(str(error), surface)
    for knob in KNOBS:
        for api in {knob.field, knob.keyword} - {None}:
            if message.startswith(api + " ") or message.startswith(api + ":"):
                return InputError(spelled(knob, surface, given_as) + message[len(api):])
    return error if message == str(error) else InputError(message)


def quoted_knobs(message: str, surface: str) -> str:
    """Each knob named in backticks in an API message (`greedy`), as `surface` spells it."""
    if surface == "api":
        return message
    for knob in KNOBS:
        message = message.replace(f"`{knob.name}`", spelled(knob, surface))
    return message


def advice(warning, surface: str) -> str:
    """A BudgetWarning's text with the knob it advises raising (its `keyword`) spelled as
    `surface` names it (`raise max_frames` → `raise --max-frames`)."""
    text, keyword = str(warning), getattr(warning, "keyword", None)
    for knob in KNOBS:
        if keyword and knob.keyword == keyword:
            text = text.replace(f"raise {keyword}", f"raise {spelled(knob, surface)}")
    return text


def family_defaults(knob: Knob, families) -> str:
    """'Nano 0.8, Delay 1.7, ...': each family's default for a knob, read from its options
    class or its `stream` signature (help text never repeats a number)."""
    out = []
    for f in families_taking(knob, families):
        if knob.field:
            value = getattr(f.options_class()(), knob.field)
        else:
            cls = f.tts_class()
            param = inspect.signature(cls.stream).parameters.get(knob.keyword)
            if param is None or param.default in (None, inspect.Parameter.empty):
                continue
            value = param.default
            if knob.keyword == cls.BUDGET.keyword and cls.BUDGET.per_chunk:
                value = f"{value} per text chunk"
        out.append(f"{f.short} {value}")
    return ", ".join(out)
