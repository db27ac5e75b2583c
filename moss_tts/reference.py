"""A voice as every family takes it (design §6): the codec codes of reference speech, with the
identity of the codec that made them, and the forms users hold it in (a `Reference`, codes, a
loaded voice, or `(samples, sample_rate)` of speech, integer PCM included).

Its own module so that `tts` (which checks references) and `voices` (which stores them) share it
without importing each other."""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, replace

import numpy as np

from .errors import InputError


@dataclass(frozen=True)
class Reference:
    """A voice: the codec codes [frames, n_vq] of reference speech. `codec` is `codec_info` of
    the codec that made them (None: unknown, taken as it is); `name` a stored voice's name, for
    messages; `transcript` what the speech says, where known (a voice stored with it: MOSS-TTSD
    needs each speaker's words)."""

    codes: np.ndarray
    codec: dict | None = None
    name: str | None = None
    transcript: str | None = None


def codec_info(codec) -> dict:
    """What a voice records of the codec that made its codes: codes of one codec mean nothing
    to a model that decodes with another."""
    return {"variant": codec.config.variant, "sample_rate": codec.sample_rate,
            "codebook_size": codec.config.codebook_size}


def codec_problem(info: dict, codec) -> str | None:
    """Why codes made by the codec `info` describes do not fit `codec`, or None. Voices stored
    before the codec was recorded (no `variant`) are taken as they are."""
    if "variant" not in info:
        return None
    want = codec_info(codec)
    if all(info.get(k) == v for k, v in want.items()):
        return None
    return (f"it was encoded with the {info['variant']} codec ({info.get('sample_rate')} Hz), "
            f"this model uses the {want['variant']} codec ({want['sample_rate']} Hz)")


# integer PCM → float: the full scale of each sample type soundfile and wave read. An int32
# holds 32-bit PCM (24-bit files read as int32 are scaled by soundfile to this range too)
PCM_SCALE = {np.dtype(np.int8): (0, 2**7), np.dtype(np.int16): (0, 2**15),
             np.dtype(np.int32): (0, 2**31), np.dtype(np.uint8): (2**7, 2**7),
             np.dtype(np.uint16): (2**15, 2**15)}


def pcm_as_float(samples) -> np.ndarray:
    """Samples as floats in [-1, 1): integer PCM is scaled by its type's full scale (uint8 and
    uint16 are offset binary, as WAV stores 8-bit audio); floats pass unchanged. Raw integers
    would reach the codec 32768 times too loud."""
    x = np.asarray(samples)
    if x.dtype.kind not in "iu":
        return x
    if x.dtype not in PCM_SCALE:
        raise InputError(f"reference audio: integer samples must be PCM (int8, int16, int32, "
                         f"uint8 or uint16), got {x.dtype}; pass float samples in [-1, 1]")
    offset, scale = PCM_SCALE[x.dtype]
    return ((x.astype(np.float64) - offset) / scale).astype(np.float32)


def as_reference(value, what: str, *, n_vq: int, max_width: int | None,
                 encode: Callable[..., Reference]) -> Reference | None:
    """A voice from what users hold: a Reference, a loaded voice (`load_voice`'s (Reference,
    info)), its codes [frames, n_vq] (up to `max_width` wide: a stored voice keeps all of its
    codec's codebooks; the first n_vq are used), or (samples, sample_rate) of speech, which
    `encode` turns into codes. The codec identity is kept; the caller checks it."""
    value = unwrapped(value)
    if value is None:
        return None
    if isinstance(value, Reference):
        codes = check_codes(value.codes, what, n_vq, max_width)
        return value if codes is value.codes else replace(value, codes=codes)
    if isinstance(value, tuple):
        if len(value) != 2:
            raise InputError(f"{what}: a tuple must be (samples, sample_rate), got {len(value)} "
                             "items")
        return encode(*value)
    if isinstance(value, (str, bytes, os.PathLike)):
        raise InputError(f"{what} cannot be a {type(value).__name__}: pass (samples, sample_rate) "
                         "(moss_tts.read_audio(path) gives them), a voice's codes, or "
                         "tts.voice(name) for a stored voice")
    return Reference(check_codes(value, what, n_vq, max_width))


def unwrapped(value):
    """A loaded voice (`load_voice`'s (Reference, info)) as its Reference; else `value`."""
    if isinstance(value, tuple) and len(value) == 2 and isinstance(value[0], Reference):
        return value[0]
    return value


def check_codes(value, what: str, n_vq: int, max_width: int | None) -> np.ndarray:
    """Integer codes [frames, width], n_vq ≤ width ≤ max_width, as their first n_vq (the same
    array when it is already that)."""
    try:
        codes = np.asarray(value)
    except (TypeError, ValueError) as e:
        raise InputError(f"{what}: not a Reference, codes or (samples, sample_rate): {e}") from None
    if codes.dtype.kind == "f":
        raise InputError(f"{what}: a float array looks like audio; pass (samples, sample_rate)")
    widths = range(n_vq, max(n_vq, max_width or n_vq) + 1)
    if codes.dtype.kind not in "iu" or codes.ndim != 2 or codes.shape[1] not in widths:
        flip = " (Codec.encode gives [n_q, frames]: transpose it)" \
            if codes.ndim == 2 and codes.shape[0] in widths else ""
        raise InputError(f"{what}: codes must be integers of shape [frames, {n_vq}], got "
                         f"{codes.dtype} {list(codes.shape)}{flip}")
    if codes.shape[1] == n_vq and codes is value:
        return codes
    return np.ascontiguousarray(codes[:, :n_vq])
