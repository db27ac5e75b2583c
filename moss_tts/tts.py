"""The protocol every TTS family offers (the CLI and the server use only this): its output
format, references encoded once and reused, and speech as a whole or as it is made."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import numpy as np


@dataclass(frozen=True)
class Reference:
    """A voice: the codec codes [frames, n_vq] of reference speech."""

    codes: np.ndarray


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
