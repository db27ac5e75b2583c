"""Seeded numpy samplers over small logit vectors (style C19): pure functions of
(logits, rng, knobs). Semantics follow the Hugging Face reference of MOSS-TTS-Nano
(docs/upstream-notes.md §nano-4.2): repetition penalty on raw logits, then temperature, top-k,
top-p, softmax draw.

Greedy is each family's upstream greedy, a separate path (C19): every options class has
`greedy()` (these options with upstream's do_sample=False) and `is_greedy`, and says per
channel what upstream runs on it (`Channel`). Upstream's greedy keeps the audio repetition
penalty before the argmax in Nano, Local v1.5, Realtime and Delay; MossTTSLocal's `_sample`
runs no processor at all on a greedy channel, penalty included. One rule for every family
(issue 31): a sampled channel's temperature is above 0, and a temperature of 0 is an error
naming the switch, never greedy by another name.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields, is_dataclass, replace

import numpy as np

from .errors import InputError, ModelFileError, whole_number


@dataclass(frozen=True)
class Channel:
    """What runs on one channel's logits, in upstream's order: the repetition penalty over the
    channel's history (1 = none), then the argmax when greedy, else temperature → top-k →
    top-p → one draw. The options classes build these from their knobs and their family's
    upstream (`text_channel`, `audio_channel`), so the samplers need no family rules."""

    greedy: bool
    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    repetition_penalty: float = 1.0


class DoSampleSwitch:
    """Options with upstream's one `do_sample` switch for every channel (Nano, Local v1.5,
    Realtime): greedy() turns it off; the audio repetition penalty still runs before the
    argmax, as upstream penalizes before its `if not do_sample` (Nano's
    `_sample_next_token`, Realtime's `generate_local_transformer`)."""

    def greedy(self):
        return replace(self, do_sample=False)

    @property
    def is_greedy(self) -> bool:
        return not self.do_sample

    @property
    def audio_channel(self) -> Channel:
        return Channel(self.is_greedy, self.audio_temperature, self.audio_top_k,
                       self.audio_top_p, self.audio_repetition_penalty)


@dataclass(frozen=True)
class SamplingOptions(DoSampleSwitch):
    """Per-call generation knobs; the defaults are upstream's user-facing ones
    (docs/upstream-notes.md §nano-4.3)."""

    do_sample: bool = True
    text_temperature: float = 1.0
    audio_temperature: float = 0.8
    audio_top_k: int = 25
    audio_top_p: float = 0.95
    audio_repetition_penalty: float = 1.2

    def __post_init__(self):
        _check_switched(self, ("text_temperature", "audio_temperature"))
        _check_filters(self, "audio")



def _check_switched(opts, temperatures: tuple[str, ...]) -> None:
    """Options with a `do_sample` switch: it is a bool, every knob is a number, and each
    temperature is finite and > 0 when sampling."""
    if not isinstance(opts.do_sample, (bool, np.bool_)):
        raise InputError(f"do_sample must be True or False, got {opts.do_sample!r}")
    for f in fields(opts):
        value = getattr(opts, f.name)
        if f.name != "do_sample" and (isinstance(value, (bool, np.bool_))
                                      or not isinstance(value, (int, float, np.number))):
            raise InputError(f"{f.name} must be a number, got {value!r}")
    for name in temperatures:
        _check_temperature(opts, name, opts.do_sample)


def _check_temperature(opts, name: str, sampled: bool) -> None:
    """A sampled channel's temperature is finite and above 0; greedy is its own switch (the
    `greedy` knob), so 0 is refused on every family alike, never read as greedy."""
    t = getattr(opts, name)
    if sampled and not 0 < t < math.inf:
        raise InputError(f"{name} must be finite and > 0, got {t} (greedy decoding is the "
                         "`greedy` switch, not a temperature of 0)")


def _check_filters(opts, group: str) -> None:
    """Validate `<group>_top_k` (made an int), `<group>_top_p` and, when the options have
    one, `<group>_repetition_penalty`; one InputError naming the knob."""
    k = getattr(opts, f"{group}_top_k")
    if isinstance(k, bool) or not float(k).is_integer() or k < 0:
        raise InputError(f"{group}_top_k must be a whole number ≥ 0 (0 = off), got {k}")
    object.__setattr__(opts, f"{group}_top_k", int(k))
    p = getattr(opts, f"{group}_top_p")
    if not 0 < p <= 1:
        raise InputError(f"{group}_top_p must be in (0, 1], got {p}")
    penalty = getattr(opts, f"{group}_repetition_penalty", 1.0)
    if not 0 < penalty < math.inf:
        raise InputError(f"{group}_repetition_penalty must be finite and > 0 (1 = off), got "
                         f"{penalty}")


@dataclass(frozen=True)
class LocalV15SamplingOptions(SamplingOptions):
    """MOSS-TTS-Local-Transformer-v1.5's knobs with its README defaults
    (docs/upstream-notes.md §family-4.6: audio 1.7 / 0.8 / 25 / 1.0, the continue/stop head 1.0 /
    1.0 / 50); the repetition penalty reads the generated frames only."""

    audio_temperature: float = 1.7
    audio_top_k: int = 25
    audio_top_p: float = 0.8
    audio_repetition_penalty: float = 1.0
    text_top_k: int = 50
    text_top_p: float = 1.0

    def __post_init__(self):
        super().__post_init__()
        _check_filters(self, "text")

    @property
    def text_channel(self) -> Channel:
        """The 2-way continue/stop head: no penalty there, greedy with the audio (one
        do_sample for the whole frame, as upstream)."""
        return Channel(self.is_greedy, self.text_temperature, self.text_top_k, self.text_top_p)


@dataclass(frozen=True)
class DelaySamplingOptions:
    """MossTTSDelay's knobs with upstream defaults (docs/upstream-notes.md §family-2.7: text 1.5 /
    1.0 / 50, audio 1.7 / 0.8 / 25 / 1.0). Upstream's `generate` keeps a do_sample per channel
    (it reads a temperature of 0 as do_sample=False); here each is its own switch,
    `text_do_sample` and `audio_do_sample`, and a temperature is above 0 (one rule for every
    family: greedy is a switch, C19)."""

    text_temperature: float = 1.5
    text_top_p: float = 1.0
    text_top_k: int = 50
    audio_temperature: float = 1.7
    audio_top_p: float = 0.8
    audio_top_k: int = 25
    audio_repetition_penalty: float = 1.0
    text_do_sample: bool = True
    audio_do_sample: bool = True

    def __post_init__(self):
        for group in ("text", "audio"):
            switch = getattr(self, f"{group}_do_sample")
            if not isinstance(switch, (bool, np.bool_)):
                raise InputError(f"{group}_do_sample must be True or False, got {switch!r}")
            _check_temperature(self, f"{group}_temperature", switch)
            _check_filters(self, group)

    def greedy(self):
        """These options with both channels greedy (upstream's do_sample=False on each)."""
        return replace(self, text_do_sample=False, audio_do_sample=False)

    @property
    def text_greedy(self) -> bool:
        return not self.text_do_sample

    @property
    def audio_greedy(self) -> bool:
        return not self.audio_do_sample

    @property
    def is_greedy(self) -> bool:
        return self.text_greedy and self.audio_greedy

    @property
    def text_channel(self) -> Channel:
        return Channel(self.text_greedy, self.text_temperature, self.text_top_k,
                       self.text_top_p)

    @property
    def audio_channel(self) -> Channel:
        """Delay's `sample_token` applies the penalty before its `if not do_sample`: a greedy
        audio channel keeps it."""
        return Channel(self.audio_greedy, self.audio_temperature, self.audio_top_k,
                       self.audio_top_p, self.audio_repetition_penalty)


@dataclass(frozen=True)
class RealtimeSamplingOptions(DoSampleSwitch):
    """MossTTSRealtime's knobs with upstream defaults (docs/upstream-notes.md §family-5.5:
    0.8 / 0.6 / 30, penalty 1.1 over the last 50 generated frames of each codebook, P18); one
    setting for all 16 codebooks. `do_sample=False` is greedy (argmax), as upstream's switch."""

    do_sample: bool = True
    audio_temperature: float = 0.8
    audio_top_p: float = 0.6
    audio_top_k: int = 30
    audio_repetition_penalty: float = 1.1
    repetition_window: int = 50

    def __post_init__(self):
        _check_switched(self, ("audio_temperature",))
        _check_filters(self, "audio")
        w = self.repetition_window
        if isinstance(w, bool) or not float(w).is_integer() or w < 1:
            raise InputError(f"repetition_window must be a whole number ≥ 1 (frames), got {w}")
        object.__setattr__(self, "repetition_window", int(w))



@dataclass(frozen=True)
class LocalSamplingOptions(DelaySamplingOptions):
    """MossTTSLocal's knobs with upstream defaults (docs/upstream-notes.md §family-3.6: text 1.5 /
    1.0 / 50, audio 1.0 / 0.95 / 50 / 1.1, the penalty per channel over prompt + generated codes);
    a greedy channel (its do_sample off) is the plain argmax, without the penalty (upstream's
    `_sample` builds no processor for a do_sample=False channel)."""

    audio_temperature: float = 1.0
    audio_top_p: float = 0.95
    audio_top_k: int = 50
    audio_repetition_penalty: float = 1.1

    @property
    def audio_channel(self) -> Channel:
        if self.audio_greedy:
            return Channel(True)
        return super().audio_channel


# MossTTSDelay's other published checkpoints decode with their cards' recommended audio knobs
# (docs/upstream-notes.md §family-9); the text channel keeps upstream's generate defaults
@dataclass(frozen=True)
class DialogueSamplingOptions(DelaySamplingOptions):
    """MOSS-TTSD v1.0: audio 1.1 / 0.9 / 50 / 1.1 (its card, section 1.4; its app's defaults)."""

    audio_temperature: float = 1.1
    audio_top_p: float = 0.9
    audio_top_k: int = 50
    audio_repetition_penalty: float = 1.1


@dataclass(frozen=True)
class VoiceDesignSamplingOptions(DelaySamplingOptions):
    """MOSS-VoiceGenerator: audio 1.5 / 0.6 / 50 / 1.1 (its card, section 1.3: it is "sensitive to
    decoding hyperparameters")."""

    audio_temperature: float = 1.5
    audio_top_p: float = 0.6
    audio_top_k: int = 50
    audio_repetition_penalty: float = 1.1


@dataclass(frozen=True)
class SoundEffectSamplingOptions(DelaySamplingOptions):
    """MOSS-SoundEffect: audio 1.5 / 0.6 / 50 / 1.2 (its card, section 1.4)."""

    audio_temperature: float = 1.5
    audio_top_p: float = 0.6
    audio_top_k: int = 50
    audio_repetition_penalty: float = 1.2


@dataclass(frozen=True)
class DiffusionOptions:
    """MOSS-SoundEffect v2.0's sampler knobs with upstream's defaults (docs/upstream-notes.md
    §family-10.5): the guidance scale (1: no guidance, the negative prompt unused) and the
    flow-match shift. A diffusion sampler draws no tokens: it has no greedy switch."""

    cfg_scale: float = 4.0
    shift: float = 5.0

    def __post_init__(self):
        for name in ("cfg_scale", "shift"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) \
                    or not math.isfinite(value):
                raise InputError(f"{name} must be a finite number, got {value!r}")
        if self.cfg_scale < 0 or self.cfg_scale > 100:
            raise InputError(f"cfg_scale must lie in [0, 100], got {self.cfg_scale}")
        if not 0 < self.shift <= 100:
            raise InputError(f"shift must lie in (0, 100], got {self.shift}")


def check_options(options, family: type):
    """`options` when it is an instance of `family` (a family's options class) or of the
    class whose knobs `family` only re-defaults (a published checkpoint's options are its
    family's knobs with its card's defaults, so the family's own are taken too); else one
    InputError naming the class to build."""
    names = {f.name for f in fields(family)}
    taken = family
    for base in family.__mro__[1:]:
        if is_dataclass(base) and {f.name for f in fields(base)} == names:
            taken = base
    if isinstance(options, taken):
        return options
    name = family.__name__
    hint = f" — build one with {name}(**options)" if isinstance(options, dict) else ""
    raise InputError(f"options must be a {name}, got {type(options).__name__}{hint}")


def check_seed(seed) -> int | None:
    """None (a fresh random seed) or a whole number ≥ 0, as numpy's generators take."""
    return None if seed is None else whole_number(seed, "seed", 0)


# -- row-wise filters: scores [..., V] → the same shape, each row on its own --------------------
def apply_repetition_penalty(logits: np.ndarray, seen: np.ndarray, penalty: float) -> np.ndarray:
    """For every id already generated (boolean `seen`, broadcast over the rows: one row per
    head, or one pooled row for all): divide a positive logit by the penalty, multiply a
    negative one (so both become less likely)."""
    if penalty == 1.0 or not seen.any():
        return logits
    return np.where(seen, np.where(logits < 0, logits * penalty, logits / penalty), logits)


def apply_temperature(scores: np.ndarray, temperature: float) -> np.ndarray:
    """scores / temperature in float64 (sampling arithmetic is done in double)."""
    return scores.astype(np.float64) / temperature


def top_k_filter(scores: np.ndarray, k: int) -> np.ndarray:
    """Scores below each row's k-th largest become −inf (ties at the threshold survive)."""
    if k <= 0 or k >= scores.shape[-1]:
        return scores
    threshold = np.partition(scores, -k, axis=-1)[..., -k, None]
    return np.where(scores < threshold, -np.inf, scores)


def top_p_filter(scores: np.ndarray, p: float) -> np.ndarray:
    """Keep each row's smallest top set whose probability reaches p; the top token stays."""
    if p >= 1.0:
        return scores
    order = _descending(scores)
    probs = softmax(np.take_along_axis(scores, order, axis=-1))
    # drop a token once the mass *before* it already exceeds p (HF: cumsum shifted by one)
    drop_sorted = (np.cumsum(probs, axis=-1) - probs) > p
    drop_sorted[..., 0] = False
    drop = np.ones(scores.shape, bool)    # what `order` leaves out is −inf already
    np.put_along_axis(drop, order, drop_sorted, axis=-1)
    return np.where(drop, -np.inf, scores)


def _descending(scores: np.ndarray) -> np.ndarray:
    """Each row's indices by falling score, ties by index (a stable sort) — only as many as
    the widest row's finite scores: after top-k most of a row is −inf, and sorting all 1024
    or 155k of them per step is the sampler's largest cost."""
    n = int(np.isfinite(scores).sum(axis=-1).max())
    if n >= scores.shape[-1] or n == 0:
        return np.argsort(-scores, axis=-1, kind="stable")
    candidates = np.sort(np.argpartition(-scores, n - 1, axis=-1)[..., :n], axis=-1)
    by_score = np.argsort(-np.take_along_axis(scores, candidates, axis=-1), axis=-1,
                          kind="stable")
    return np.take_along_axis(candidates, by_score, axis=-1)


def softmax(x: np.ndarray) -> np.ndarray:
    z = np.exp(x - np.max(x, axis=-1, keepdims=True))
    return z / z.sum(axis=-1, keepdims=True)


def draw_rows(probs: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """One categorical draw per row of probs [rows, V] → ids [rows]: the inverse CDF at one
    uniform per row, exactly as `rng.choice(V, p=row)` draws (same stream, same ids)."""
    cdf = np.cumsum(probs, axis=-1)
    cdf /= cdf[:, -1:]
    u = rng.random(len(probs))
    return (cdf <= u[:, None]).sum(axis=-1)


def sample_rows(logits: np.ndarray, rng: np.random.Generator, *, temperature: float,
                top_k: int = 0, top_p: float = 1.0) -> np.ndarray:
    """One draw per row of logits [rows, V] from softmax(top_p(top_k(logits / temperature)))."""
    scores = top_p_filter(top_k_filter(apply_temperature(logits, temperature), top_k), top_p)
    return draw_rows(softmax(scores), rng)


def sample_token(logits: np.ndarray, rng: np.random.Generator, *, temperature: float,
                 top_k: int = 0, top_p: float = 1.0) -> int:
    """`sample_rows` for one logit vector [V]."""
    return int(sample_rows(logits[None], rng, temperature=temperature, top_k=top_k,
                           top_p=top_p)[0])


def sample_top_k_token(logits: np.ndarray, rng: np.random.Generator, *, temperature: float,
                       top_k: int, top_p: float = 1.0) -> int:
    """`sample_token` computed over the top_k survivors only (the others can never be drawn):
    the same id for the same generator state, without sorting the whole vocabulary."""
    scores = apply_temperature(logits, temperature)
    if not 0 < top_k < len(scores):
        return sample_token(logits, rng, temperature=temperature, top_k=top_k, top_p=top_p)
    keep = np.flatnonzero(scores >= np.partition(scores, -top_k)[-top_k])   # ties survive
    probs = softmax(top_p_filter(scores[keep][None], top_p))
    return int(keep[draw_rows(probs, rng)[0]])


def greedy_token(logits: np.ndarray) -> int:
    """argmax; the first index wins a tie."""
    return int(np.argmax(logits))


def greedy_rows(scores: np.ndarray) -> np.ndarray:
    """Each row's argmax; the first index wins a tie."""
    return np.argmax(scores, axis=-1)


def choose_rows(scores: np.ndarray, rng: np.random.Generator | None, channel: Channel,
                seen: np.ndarray | None = None) -> np.ndarray:
    """One id per row of scores [rows, V] as `channel` says: the penalty over `seen` (bool,
    broadcast over the rows; None = no history), then the argmax or one draw per row."""
    if seen is not None:
        scores = apply_repetition_penalty(scores, seen, channel.repetition_penalty)
    if channel.greedy:
        return greedy_rows(scores)
    return sample_rows(scores, rng, temperature=channel.temperature, top_k=channel.top_k,
                       top_p=channel.top_p)


def filtered_probs_each(scores: np.ndarray, channel: Channel, seen: np.ndarray) -> np.ndarray:
    """The draw probabilities of a sampled `channel` for rows of different streams sharing that
    setting (a batch decode, issue 25), row j with its own history seen[j]: the filters run
    once over every row. Each is row-wise, so row j is bit-equal to the same filters over
    scores[j:j+1] alone — except top-p, whose sort width is the widest row's finite count (a
    different width changes the softmax's summation order), so it runs once per group of rows
    with equal finite counts (tests/test_sampling_batch.py pins the equality)."""
    scores = apply_repetition_penalty(scores, seen, channel.repetition_penalty)
    scores = top_k_filter(apply_temperature(scores, channel.temperature), channel.top_k)
    if channel.top_p < 1.0:
        counts = np.isfinite(scores).sum(axis=-1)
        if (counts == counts[0]).all():
            scores = top_p_filter(scores, channel.top_p)
        else:
            out = np.empty_like(scores)
            for n in np.unique(counts):
                rows = np.flatnonzero(counts == n)
                out[rows] = top_p_filter(scores[rows], channel.top_p)
            scores = out
    return softmax(scores)


def choose_rows_each(scores: np.ndarray, rngs, channel: Channel,
                     seen: np.ndarray) -> np.ndarray:
    """`choose_rows` for rows of different streams sharing one channel setting: row j with its
    history seen[j] and its generator rngs[j] (None when greedy) gives the id
    choose_rows(scores[j:j+1], rngs[j], channel, seen[j]) gives, in one pass over all rows
    (each row's draw takes one uniform from its own generator, as alone)."""
    if channel.greedy:
        return greedy_rows(apply_repetition_penalty(scores, seen, channel.repetition_penalty))
    cdf = np.cumsum(filtered_probs_each(scores, channel, seen), axis=-1)
    cdf /= cdf[:, -1:]
    u = np.array([rng.random(1)[0] for rng in rngs])
    return (cdf <= u[:, None]).sum(axis=-1)


# -- seen-sets for the repetition penalty: bool [heads | 1, V] from a history [frames, heads] ---
def _mark(ids: np.ndarray, vocab: int) -> np.ndarray:
    """bool [heads, V]: row h marks every id of ids[:, h] inside [0, vocab) (pads outside the
    vocabulary are ignored)."""
    frames, heads = ids.shape
    seen = np.zeros((heads, vocab), dtype=bool)
    ok = (ids >= 0) & (ids < vocab)
    seen[np.broadcast_to(np.arange(heads), ids.shape)[ok], ids[ok]] = True
    return seen


def seen_per_head(history: np.ndarray, vocab: int) -> np.ndarray:
    """Each head's own history (Nano): bool [heads, V]."""
    return _mark(np.asarray(history).reshape(-1, np.shape(history)[-1]), vocab)


def seen_pooled(history: np.ndarray, vocab: int) -> np.ndarray:
    """The union over every head's history (MossTTSDelay codebooks 1..31, P5): bool [1, V],
    broadcast over the heads' rows."""
    return seen_per_head(history, vocab).any(axis=0, keepdims=True)


def seen_windowed(history: np.ndarray, vocab: int, window: int) -> np.ndarray:
    """Each head's last `window` frames only (Realtime): bool [heads, V]."""
    history = np.asarray(history).reshape(-1, np.shape(history)[-1])
    return seen_per_head(history[max(0, len(history) - window):], vocab)


def check_finite(logits: np.ndarray, what: str) -> None:
    """NaN/inf logits mean broken weights or a broken backend; say so before a sampler turns
    them into a cryptic probability error (or argmax silently picks index 0)."""
    if not np.isfinite(logits).all():
        bad = int(np.size(logits) - np.isfinite(logits).sum())
        raise ModelFileError(f"the model produced {bad} non-finite {what} logit(s) (NaN/inf): "
                             "the weights or the compute backend are broken — re-convert the "
                             "model, or try --backend cpu")


def sample_audio_code(logits: np.ndarray, seen: np.ndarray, rng: np.random.Generator | None,
                      opts: SamplingOptions) -> int:
    """An audio channel's next code (Nano, Local v1.5): penalty over its history, then greedy
    or sampled, as `opts.audio_channel` says."""
    check_finite(logits, "audio")
    return int(choose_rows(logits[None], rng, opts.audio_channel, seen)[0])


def decide_continue(logit_continue: float, logit_stop: float, rng: np.random.Generator | None,
                    opts: SamplingOptions) -> bool:
    """The frame decision from two text-head logits (continue = assistant slot, stop = audio end);
    greedy continues on a tie, like argmax over [continue, stop]."""
    check_finite(np.array([logit_continue, logit_stop]), "stop/continue")
    if opts.is_greedy:
        return logit_continue >= logit_stop
    p = softmax(np.array([logit_continue, logit_stop], dtype=np.float64) / opts.text_temperature)
    return bool(rng.random() < p[0])


# every options class a family's `stream` takes (tests/models/test_registry.py checks each
# family's OPTIONS is here): what a sampling knob is checked against before the family is known
# (in the registry's order of families, so the first refusal quoted is the same family's)
OPTIONS_CLASSES = (SamplingOptions, DelaySamplingOptions, DialogueSamplingOptions,
                   VoiceDesignSamplingOptions, SoundEffectSamplingOptions, LocalSamplingOptions,
                   LocalV15SamplingOptions, RealtimeSamplingOptions, DiffusionOptions)
