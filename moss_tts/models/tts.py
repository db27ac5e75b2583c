"""The protocol every TTS family offers (the CLI and the server use only this), and the family
contract the base owns so every family behaves the same (design §6): references in every form
with the codec check, text validation, the closed state, frame budgets checked before memory is
reserved, one budget warning per utterance, and no audio as an error, never 0 samples."""

from __future__ import annotations

import contextlib
import contextvars
import functools
import inspect
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import numpy as np

from ..audio import as_sample_rate, as_samples, trim_reference
from ..errors import (BudgetWarning, InputError, ModelFileError, MossTTSError, VoiceError,
                     whole_number)
from ..ggml.backend import NativeResource, released_on_error
from ..knobs import bounded_text, checked_keywords, shown
from ..reference import (Reference, as_reference, codec_info, codec_problem, pcm_as_float,
                        unwrapped)
from ..sampling import check_options, check_seed
from ..voices import load_voice
from .batching import MAX_STREAMS, BatchDecoder, round_robin

__all__ = ["TTS", "CodecTTS", "Reference", "FrameBudget", "BudgetCut", "BudgetMeter",
           "check_text", "described_sound", "family_stream"]

# which of synthesize_many's requests a stream made now serves ("requests[2]"), for its warnings
REQUEST = contextvars.ContextVar("moss_tts_request", default=None)


@runtime_checkable
class TTS(Protocol):
    @property
    def sample_rate(self) -> int: ...

    @property
    def channels(self) -> int: ...

    def encode_reference(self, samples, sample_rate: int):
        """Reference speech → the family's reference object (its codec codes)."""

    def synthesize(self, text: str, **options) -> tuple[np.ndarray, int]:
        """Text → (float32 samples [n, channels], sample_rate)."""

    def stream(self, text: str, **options) -> Iterator[np.ndarray]:
        """Text → float32 chunks [m, channels] as they are generated; concatenated they equal
        `synthesize` for the same options and seed."""


def check_text(value, what: str = "text") -> str:
    """`value` as a str of valid Unicode, or one InputError naming `what`: bytes are not decoded
    here (which encoding?), a lone surrogate (JSON's "\\ud800", or argv bytes Python could not
    decode) has no UTF-8 form the tokenizers could take, and a NUL is never text."""
    if isinstance(value, (bytes, bytearray)):
        raise InputError(f"{what} must be a str, got {type(value).__name__}: decode it first, "
                         f"e.g. {what}.decode('utf-8')")
    if not isinstance(value, str):
        raise InputError(f"{what} must be a str, got {type(value).__name__}")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as e:
        raise InputError(f"{what} is not valid Unicode: a lone surrogate "
                         f"{value[e.start]!r} at character {e.start} (undecodable bytes?); "
                         "pass UTF-8 text") from None
    if "\0" in value:
        raise InputError(f"{what} holds a NUL character at character {value.index(chr(0))}; "
                         "remove it")
    return value


def described_sound(text, sound) -> str:
    """The description of a sound-making family (MOSS-SoundEffect, v1 and v2), given once:
    as `sound` or as the text; checked as text and not blank."""
    if (text is None) == (sound is None):
        raise InputError("sound: describe the sound once (e.g. 'rain on a tin roof'), as "
                         "`sound` or as the text" + ("" if text is None else ", not both"))
    sound = check_text(sound if text is None else text, "sound")
    if not sound.strip():
        raise InputError("sound is empty: describe the sound (e.g. 'rain on a tin roof')")
    return sound


@dataclass(frozen=True)
class FrameBudget:
    """A family's frame budget: the `stream` keyword, its default, the largest value the family
    can use (checked before any memory is reserved), its unit, and whether it bounds each text
    chunk (True) or the whole request."""

    keyword: str
    default: int
    limit: int
    unit: str = "frames"
    per_chunk: bool = False

    def check(self, value) -> int:
        return whole_number(value, self.keyword, 1, self.limit)


@dataclass(frozen=True)
class BudgetCut:
    """Yielded by a family's raw `stream` when a text chunk used its whole frame budget before
    the model ended it (`budget`: that chunk's budget, `chunks`: the chunks in the request);
    `family_stream` counts these and never passes them on. `set_by`: what set a budget below
    the family's budget knob, in words (Nano: its text's length), None where the knob did —
    the warning says which bound cut and whether a knob can move it."""

    budget: int
    chunks: int = 1
    set_by: str | None = None


class BudgetMeter:
    """A model's frames (or rows) passed through and counted: `cuts()` says whether they ended
    at the budget rather than where the model stopped (`stopped(last)`: the last one is the
    model's own end, e.g. an end row that the model yields before returning)."""

    def __init__(self, items, budget: int, stopped=lambda last: False):
        self.items, self.budget, self.stopped = items, budget, stopped
        self.count, self.last = 0, None

    def __iter__(self):
        for item in self.items:
            self.count, self.last = self.count + 1, item
            yield item

    def cuts(self, chunks: int = 1) -> list[BudgetCut]:
        """[BudgetCut] if the whole budget was used and the last item is not a stop, else []."""
        cut = self.count >= self.budget and not self.stopped(self.last)
        return [BudgetCut(self.budget, chunks)] if cut else []


def family_stream(stream):
    """The contract around a family's `stream(self, text, **keywords)` (decorate it with this):
    before anything runs, the object is open, the keywords are the family's, the text and the
    text prompt fields are clean Unicode, the keywords are within the knob table's bounds
    (knobs.checked_keywords: the bounds every front end applies), `reference=` / `prompt=`
    take every form and fit this model's codec, `options=` is the family's options class
    (`check_options`; `seed=` is a knob, checked with the others), and the budget is within
    its limit; then the audio chunks pass through, a `BudgetWarning` is emitted once if any
    chunk was cut, and no audio at all is an InputError."""
    signature = inspect.signature(stream)

    @functools.wraps(stream)
    def checked(self, text=None, **kw):
        self._need_open()
        try:
            signature.bind(self, text, **kw)
        except TypeError as e:
            raise InputError(f"{type(self).__name__}.stream: {e}") from None
        text = self._texts(text, kw)
        kw = checked_keywords(type(self), kw)
        for field in ("reference", "prompt"):
            if field in kw:
                kw[field] = self._reference(kw[field], field)
        if "options" in kw:
            kw["options"] = check_options(kw["options"], self.OPTIONS)
        budget = self.BUDGET
        kw[budget.keyword] = budget.check(kw.get(budget.keyword, budget.default))
        return self._delivered(stream(self, text, **kw), kw[budget.keyword], REQUEST.get())

    return checked


@contextlib.contextmanager
def request_errors(i: int):
    """An error of synthesize_many's request i (raised in the block) led by `requests[i]: `,
    of the same class and with the same attributes (made without its __init__, whose
    arguments differ by class: VoiceError's are a name, a problem and a fix)."""
    try:
        yield
    except MossTTSError as e:
        led = type(e).__new__(type(e), f"requests[{i}]: {e}")
        led.__dict__.update(e.__dict__)
        raise led from e


class CodecTTS(NativeResource):
    """What every family's TTS object shares around its `stream`: `synthesize` as the
    concatenated stream, the family contract (`family_stream`), the codec check, and closing
    the model and the codec it owns."""

    CODEC_NAME = "codec"      # what `_need_codec` asks for, e.g. "the MOSS-Audio-Tokenizer GGUF"
    FAMILY = NAME = ""        # the GGUF kind ("nano") and the name people know ("MOSS-TTS-Nano")
    # `stream` keywords beyond options, seed and the references (the knob table offers a knob
    # to the families that name its keyword), and those a request must give
    KEYWORDS: tuple[str, ...] = ()
    REQUIRED: tuple[str, ...] = ()
    OPTIONS: type = object    # the family's sampling dataclass: its defaults are the only ones
    PROMPT_FIELDS: tuple[str, ...] = ()   # prompt keywords of `stream` (instruction, language, ...)
    TEXT_FIELDS: tuple[str, ...] = ()     # those of them that are text (checked by check_text)
    LANGUAGES: tuple[tuple[str, str], ...] = ()   # its card's (name, code) pairs
    TEXT_OPTIONAL = False                 # True: `text` may be None (what is made is described
                                          # by another field: MOSS-SoundEffect's `sound`)
    MAX_TEXT_CHARS: int | None = None     # the text's bound where the family has one (every
                                          # surface reads it: knobs.bounded_text); None: a long
                                          # text is cut into chunks
    FRAME_RATE = 12.5         # codec frames a second of every MOSS-Audio-Tokenizer: `seconds`
                              # is bounded by the budget at this rate before a codec is loaded
    MAX_SECONDS: float | None = None      # `seconds`' own bound where it is not the budget's
    BUDGET: FrameBudget       # each family declares its own: keyword, default, limit, unit
    CHANNELS = 1              # of the audio `stream` yields
    # its models/batching.py BatchFamily: several streams per decode step (`decoding_together`,
    # `synthesize_many`, serve --max-streams, batch --streams); None: one stream at a time
    BATCHED: type | None = None
    # a live mode (`session`: text deltas in as a language model writes them, audio out as it
    # is made): serve's /v1/audio/live, `tts --live`; False: whole texts only
    LIVE = False
    # `stream` keywords every whole-audio output takes unless its caller gives them
    # (`synthesize`, `synthesize_many`, a whole file from `tts` or the server): a family whose
    # stream paces its codec pushes by the clock (upstream's adaptive ladder) fixes them here,
    # so a request's whole audio is the same floats on every run, alone or decoded with others
    # (the codec's f32 sums move by ~1e-6 between chunkings: 1 LSB of 16-bit PCM)
    WHOLE: dict = {}
    model = codec = None
    _batch = None             # the BatchDecoder of `decoding_together`, while inside it

    @property
    def sample_rate(self) -> int:
        return self.config.sampling_rate      # upstream's config field of the Qwen3 families

    @property
    def channels(self) -> int:
        return self.CHANNELS

    def stream(self, text: str, **options) -> Iterator[np.ndarray]:
        raise NotImplementedError

    def synthesize(self, text: str | None = None, **kwargs) -> tuple[np.ndarray, int]:
        """Text → (samples float32 [n, channels], sample_rate). Same options as `stream`
        (with the family's `WHOLE` keywords where not given)."""
        self._need_open()
        return np.concatenate(list(self.stream(text, **self.whole_keywords(kwargs)))), self.sample_rate

    def whole_keywords(self, kwargs: dict) -> dict:
        """`stream` keywords for a whole-audio output: the family's `WHOLE` under the
        caller's own."""
        self._need_open()
        return {**self.WHOLE, **kwargs}

    def _delivered(self, chunks, budget: int, request: str | None = None) -> Iterator[np.ndarray]:
        """The audio of a raw stream: BudgetCut markers counted (one warning at the end, led by
        `request`, the name of synthesize_many's request it serves), and a stream that made no
        audio an InputError saying why."""
        cuts, samples = [], 0
        try:
            for chunk in chunks:
                if isinstance(chunk, BudgetCut):
                    cuts.append(chunk)
                    continue
                samples += len(chunk)
                yield chunk
        finally:
            close = getattr(chunks, "close", None)
            if close is not None:
                close()
        if cuts and samples:    # no audio at all is the error below, which says why
            message = self._cut_message(cuts)
            knob = self.BUDGET.keyword if any(c.set_by is None for c in cuts) else None
            warnings.warn(BudgetWarning(f"{request}: {message}" if request else message, knob),
                          stacklevel=2)
        if samples == 0:
            b = self.BUDGET
            why = (f"the frame budget ({b.keyword}={budget}) ran out before the first audio "
                   f"frame: raise {b.keyword}") if cuts else \
                "the model ended the speech before its first audio frame: try another seed " \
                "or a longer text"
            raise InputError(f"no audio was made: {why}")

    def _cut_message(self, cuts: list[BudgetCut]) -> str:
        """What cut the audio and what moves that bound: `raise <the budget knob>` where the
        knob set the budget, else what set it (BudgetCut.set_by), which no knob raises."""
        b, most = self.BUDGET, max(c.budget for c in cuts)
        seconds = most * self._need_codec().downsample_rate / self.codec.sample_rate
        head = (f"{len(cuts)} of {cuts[0].chunks} text chunk(s) used the whole frame budget "
                f"({most} {b.unit}, {seconds:.1f} s) before the model ended it: the audio is "
                "cut — ")
        by_knob = sum(c.set_by is None for c in cuts)
        derived = next((c.set_by for c in cuts if c.set_by is not None), None)
        if derived is None:
            return head + f"raise {b.keyword}"
        others = f"the budget set by {derived}, which no knob raises ({b.keyword} only " \
                 "lowers it): the model spoke on past where such a text ends; try another seed"
        if not by_knob:
            return head + others
        return (head + f"{by_knob} at {b.keyword} (raise {b.keyword}), "
                f"{len(cuts) - by_knob} at {others}")

    def _texts(self, text, fields: dict) -> str:
        """The text, and every text prompt field given (prompt_text, TEXT_FIELDS), checked as
        clean Unicode (`check_text`), so no tokenizer sees a bad string, and the text within
        the family's bound (MAX_TEXT_CHARS); the text is returned."""
        for field in ("prompt_text",) + self.TEXT_FIELDS:
            if fields.get(field) is not None:
                check_text(fields[field], field)
        if text is None and self.TEXT_OPTIONAL:
            return None
        return bounded_text(type(self), check_text(text, "text"), "api")

    def _prompt_fields(self, fields: dict, seconds: float | None = None) -> dict:
        """User-message fields as the prompt writes them: `language` as its model card's name
        (a name or code of LANGUAGES), `seconds` as `tokens`, the duration in codec frames."""
        fields = dict(fields)
        if fields.get("language") is not None:   # the card's name, as upstream's prompts say it
            from ..text.languages import language_name      # loaded where a prompt is built

            fields["language"] = language_name(fields["language"], self.LANGUAGES)
        most = self.BUDGET.limit      # a duration the budget can never make is refused
        if seconds is not None:
            if fields.get("tokens") is not None or not seconds > 0:
                raise InputError(f"seconds must be > 0 and not given with tokens (got {seconds})")
            rate = self._need_codec().config.frame_rate
            if seconds > most / rate:
                raise InputError(f"seconds must be at most {shown(most / rate)} for "
                                 f"{self.NAME}, got {shown(seconds)}")
            fields["tokens"] = max(1, round(seconds * rate))
        if fields.get("tokens") is not None:
            fields["tokens"] = whole_number(fields["tokens"], "tokens", 1, most)
        return fields

    def _checked(self, kwargs: dict, keyword: str) -> dict:
        """A research call's keywords checked as `stream`'s are, before the model reserves
        its cache: its budget (`keyword`: the model's own name for it) within the family's
        limit, its options of the family's class, its seed a whole number ≥ 0."""
        if keyword in kwargs:
            kwargs[keyword] = whole_number(kwargs[keyword], keyword, 1, self.BUDGET.limit)
        if "options" in kwargs:
            kwargs["options"] = check_options(kwargs["options"], self.OPTIONS)
        if "seed" in kwargs:
            kwargs["seed"] = check_seed(kwargs["seed"])
        return kwargs

    # -- several streams per decode step (models/batching.py) --------------------------------
    def _generated(self, rows, **keywords) -> Iterator:
        """What the model makes after prompt rows (frames or rows), from the keywords of its
        one-stream source (`_alone`): this stream's own decode, or, inside
        `decoding_together`, its job in the shared batch (`BatchFamily.job`, the same
        keywords), which makes the same items."""
        if self._batch is None:
            return self._alone(rows, **keywords)
        return self._batch.items(self._batch.family.job(rows, **keywords))

    def _alone(self, rows, **keywords) -> Iterator:
        """The family's one-stream source: its model's `iter_frames` unless it says else."""
        return self.model.iter_frames(rows, **keywords)

    @contextlib.contextmanager
    def decoding_together(self, max_streams: int = MAX_STREAMS):
        """Inside it, every `stream` made takes its frames from one shared BatchDecoder, up to
        max_streams streams per step: pulling a chunk of one stream runs steps that advance
        the others too, so pull the streams in turn from this one thread (`synthesize_many`,
        or the server's worker). Each stream's audio equals its `stream` made outside."""
        self._need_open()
        if self.BATCHED is None:
            raise InputError(f"{self.NAME} decodes one stream at a time: decoding_together is "
                             "not available for it")
        if self._batch is not None:
            raise InputError("already decoding together: one decoding_together at a time")
        with BatchDecoder(self._batch_family(max_streams), max_streams=max_streams) as batch:
            self._batch = batch
            try:
                yield batch
            finally:
                self._batch = None

    def _batch_family(self, max_streams: int):
        """The BatchFamily of `decoding_together`: its BATCHED over the model."""
        return self.BATCHED(self.model)

    def synthesize_many(self, requests, *, max_streams: int = MAX_STREAMS,
                        around=None) -> list[tuple[np.ndarray, int]]:
        """Several requests decoded together → each one's (samples, sample_rate), as
        `synthesize(**request)` would make it. A request is a dict of `synthesize`'s keywords
        with its `text`. Up to max_streams utterances share each decode step (one row each);
        a request's next text chunk joins the batch when its last one ends, and one that ends
        leaves it, so a request's audio never depends on the others it ran beside.
        `around(i)`: a context manager entered around each pull of request i's audio, where
        what its stream warns (a frame budget's cut, a stall) is emitted, so a caller can tell
        each request's warnings apart (batch/work.py); without it, a frame budget's warning
        names its request (`requests[2]: ...`). An error is raised for the whole call, led by
        the request whose stream raised it (`requests[2]: ...`).

        >>> tts.synthesize_many([{"text": "Hello.", "seed": 1},             # doctest: +SKIP
        ...                      {"text": "Bonjour.", "seed": 2}])
        """
        self._need_open()
        kwargs = []
        for i, request in enumerate(requests):
            if not isinstance(request, dict) or ("text" not in request and not self.TEXT_OPTIONAL):
                raise InputError(f"requests[{i}] must be a dict of synthesize keywords with its "
                                 f"'text', got {type(request).__name__}")
            kwargs.append(self.whole_keywords(request))
        with self.decoding_together(max_streams):
            # each stream checks its arguments now and takes its frames from the batch
            streams = [self._request_stream(i, kw, named=around is None)
                       for i, kw in enumerate(kwargs)]
            outer = around or (lambda i: contextlib.nullcontext())

            @contextlib.contextmanager
            def pulled(i):
                with request_errors(i), outer(i):
                    yield
            return [(np.concatenate(audio), self.sample_rate)
                    for audio in round_robin(streams, pulled)]

    def _request_stream(self, i: int, kw: dict, *, named: bool):
        """Request i's stream of synthesize_many (its errors, and with `named` its budget
        warning, led by `requests[i]`)."""
        token = REQUEST.set(f"requests[{i}]" if named else None)
        try:
            with request_errors(i):
                return self.stream(kw.pop("text", None), **kw)
        finally:
            REQUEST.reset(token)

    # -- references -------------------------------------------------------------------------
    def _reference(self, value, what: str) -> Reference | None:
        """Any reference form (`as_reference`) as this model's Reference; codes made by another
        codec are refused by name, never used as noise."""
        self._need_open()
        value = unwrapped(value)
        if isinstance(value, Reference):         # the codec first: whatever the codes' shape
            self._check_voice_codec(value, what)
        width = None if self.codec is None else self.codec.n_quantizers
        return as_reference(value, what, n_vq=self.config.n_vq, max_width=width,
                            encode=self.encode_reference)

    def _check_voice_codec(self, ref: Reference, what: str) -> None:
        """A Reference made by another codec (or a stored voice with too few codebooks) is
        refused by the voice's name and the fix."""
        problem = None if ref.codec is None or self.codec is None \
            else codec_problem(ref.codec, self.codec)
        if ref.name and problem is None and ref.codes.shape[1] < self.config.n_vq:
            problem = (f"it has {ref.codes.shape[1]} codebooks, the model needs "
                       f"{self.config.n_vq}")
        if problem and ref.name:
            raise VoiceError(ref.name, f"voice {ref.name!r} does not fit this model: {problem}",
                             f"add it again with `python -m moss_tts voice add {ref.name} "
                             "REF.wav --codec CODEC --force` using this model's codec")
        if problem:
            raise InputError(f"{what} does not fit this model: {problem} — encode the speech "
                             "again with this model's encode_reference")

    def voice(self, name: str, *, root=None) -> Reference:
        """A stored voice (`voice add`, or an upload to the server) as this model's reference;
        a voice made with another codec is refused by name."""
        self._need_codec()
        return self._reference(load_voice(name, root=root)[0], "voice")

    def _encoded(self, codes: np.ndarray) -> Reference:
        """Codes [n_vq, frames] from this model's codec → a Reference that records the codec."""
        return Reference(np.ascontiguousarray(codes.T), codec_info(self.codec))

    def _reference_audio(self, samples, sample_rate, max_seconds) -> tuple[np.ndarray, int]:
        """Reference speech as float32 [n, channels] at a checked rate (integer PCM scaled to
        [-1, 1)), cut to its first max_seconds with a warning (None keeps it all: a
        continuation prompt must match its text)."""
        self._need_open()
        x = as_samples(pcm_as_float(samples), what="reference audio")
        sample_rate = as_sample_rate(sample_rate)
        return (x if max_seconds is None else trim_reference(x, sample_rate, max_seconds),
                sample_rate)

    # -- codec and lifetime -----------------------------------------------------------------
    @classmethod
    def _with_codec(cls, model, codec, backend):
        """cls(model, codec), loading `codec` when it is a path; a codec that fails to load or to
        fit frees the model (and the codec loaded here)."""
        from ..codec import Codec

        with released_on_error(model):
            owned = Codec.load(codec, backend=backend) if codec is not None \
                and not isinstance(codec, Codec) else None
            with released_on_error(owned):
                return cls(model, owned or codec)

    def _check_codec(self, codec) -> None:
        """The codec must have the model's rate, channels and codebooks."""
        c, layout = self.config, {1: "mono", 2: "stereo"}.get(self.channels, "")
        problems = []
        if codec.channels != self.channels or codec.sample_rate != self.sample_rate:
            problems.append(f"it is {codec.sample_rate} Hz x {codec.channels} channel(s), the "
                            f"model needs {self.sample_rate} Hz {layout}")
        # a config whose audio vocabulary holds more than the codes (Realtime's pad, BOS and
        # EOS) names its codebook size
        size = getattr(c, "codebook_size", c.audio_vocab_size)
        if codec.n_quantizers < c.n_vq or codec.config.codebook_size != size:
            problems.append(f"it has {codec.n_quantizers} codebooks of "
                            f"{codec.config.codebook_size}, the model needs {c.n_vq} of {size}")
        if problems:
            raise ModelFileError("mismatched codec: " + "; ".join(problems) +
                                 f" — pass {self.CODEC_NAME}")

    def _need_open(self) -> None:
        if self.model is None:
            name = type(self).__name__
            raise InputError(f"this {name} is closed; load it again with {name}.load(...)")

    def _need_codec(self):
        self._need_open()
        if self.codec is None:
            raise InputError(f"no codec loaded: pass codec=... ({self.CODEC_NAME})")
        return self.codec

    def close(self) -> None:
        if self.codec is not None:
            self.codec.close()
            self.codec = None
        if self.model is not None:
            self.model.close()
            self.model = None
