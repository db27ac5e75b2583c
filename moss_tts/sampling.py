"""Seeded numpy samplers over small logit vectors (style C19): pure functions of
(logits, rng, knobs). Semantics follow the Hugging Face reference of MOSS-TTS-Nano
(nano.md §4.2): repetition penalty on raw logits, then temperature, top-k, top-p, softmax draw.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .errors import InputError, ModelFileError


@dataclass(frozen=True)
class SamplingOptions:
    """Per-call generation knobs; the defaults are upstream's user-facing ones (nano.md §4.3)."""

    do_sample: bool = True
    text_temperature: float = 1.0
    audio_temperature: float = 0.8
    audio_top_k: int = 25
    audio_top_p: float = 0.95
    audio_repetition_penalty: float = 1.2

    def __post_init__(self):
        for name in ("text_temperature", "audio_temperature"):
            if self.do_sample and not getattr(self, name) > 0:
                raise InputError(f"{name} must be > 0 when sampling (use greedy instead of 0)")
        if isinstance(self.audio_top_k, bool) or not float(self.audio_top_k).is_integer() \
                or self.audio_top_k < 0:
            raise InputError(f"audio_top_k must be a whole number ≥ 0 (0 = off), got "
                             f"{self.audio_top_k}")
        object.__setattr__(self, "audio_top_k", int(self.audio_top_k))
        if not 0 < self.audio_top_p <= 1:
            raise InputError(f"audio_top_p must be in (0, 1], got {self.audio_top_p}")
        if not self.audio_repetition_penalty > 0:
            raise InputError("audio_repetition_penalty must be > 0 (1 = off)")


def apply_repetition_penalty(logits: np.ndarray, seen: np.ndarray, penalty: float) -> np.ndarray:
    """For every id already generated (boolean `seen` mask): divide a positive logit by the
    penalty, multiply a negative one (so both become less likely)."""
    if penalty == 1.0 or not seen.any():
        return logits
    out = logits.copy()
    hit = out[seen]
    out[seen] = np.where(hit < 0, hit * penalty, hit / penalty)
    return out


def top_k_filter(scores: np.ndarray, k: int) -> np.ndarray:
    """Scores below the k-th largest become −inf (ties at the threshold survive)."""
    if k <= 0 or k >= scores.size:
        return scores
    threshold = np.partition(scores, -k)[-k]
    return np.where(scores < threshold, -np.inf, scores)


def top_p_filter(scores: np.ndarray, p: float) -> np.ndarray:
    """Keep the smallest top set whose probability reaches p; the top token always stays."""
    if p >= 1.0:
        return scores
    order = np.argsort(-scores, kind="stable")
    probs = softmax(scores[order])
    # drop a token once the mass *before* it already exceeds p (HF: cumsum shifted by one)
    drop_sorted = (np.cumsum(probs) - probs) > p
    drop_sorted[0] = False
    out = scores.copy()
    out[order[drop_sorted]] = -np.inf
    return out


def softmax(x: np.ndarray) -> np.ndarray:
    z = np.exp(x - np.max(x))
    return z / z.sum()


def sample_token(logits: np.ndarray, rng: np.random.Generator, *, temperature: float,
                 top_k: int = 0, top_p: float = 1.0) -> int:
    """One draw from softmax(top_p(top_k(logits / temperature)))."""
    scores = top_p_filter(top_k_filter(logits.astype(np.float64) / temperature, top_k), top_p)
    probs = softmax(scores)
    return int(rng.choice(probs.size, p=probs))


def greedy_token(logits: np.ndarray) -> int:
    """argmax; the first index wins a tie."""
    return int(np.argmax(logits))


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
    """An audio channel's next code: penalty over its history, then greedy or sampled."""
    check_finite(logits, "audio")
    scores = apply_repetition_penalty(logits, seen, opts.audio_repetition_penalty)
    if not opts.do_sample:
        return greedy_token(scores)
    return sample_token(scores, rng, temperature=opts.audio_temperature, top_k=opts.audio_top_k,
                        top_p=opts.audio_top_p)


def decide_continue(logit_continue: float, logit_stop: float, rng: np.random.Generator | None,
                    opts: SamplingOptions) -> bool:
    """The frame decision from two text-head logits (continue = assistant slot, stop = audio end);
    greedy continues on a tie, like argmax over [continue, stop]."""
    check_finite(np.array([logit_continue, logit_stop]), "stop/continue")
    if not opts.do_sample:
        return logit_continue >= logit_stop
    p = softmax(np.array([logit_continue, logit_stop], dtype=np.float64) / opts.text_temperature)
    return bool(rng.random() < p[0])
