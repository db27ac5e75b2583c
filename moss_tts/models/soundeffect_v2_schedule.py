"""MOSS-SoundEffect v2.0's flow-matching sampler: the shifted sigma schedule, the Euler step and
classifier-free guidance, in numpy (upstream moss_soundeffect_v2/diffsynth/schedulers/
flow_match.py as diffsynth/pipelines/wan_audio.py:124, :341, :399-407 drives it).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..errors import InputError, whole_number

NUM_TRAIN_TIMESTEPS = 1000   # the DiT's timestep input is σ·1000 (flow_match.py:58)
MAX_STEPS = 10_000           # a bound on the user's `steps` knob, far above upstream's 100


@dataclass(frozen=True)
class FlowMatchSchedule:
    """The N noise levels σ_0 > … > σ_{N-1} of one sampling run; σ_N = 0 is the clean end.

    >>> FlowMatchSchedule.make(4, shift=5.0).sigmas
    array([1.       , 0.9375   , 0.8333333, 0.625    ], dtype=float32)
    """

    sigmas: np.ndarray          # float32 (N,)

    @classmethod
    def make(cls, steps: int, *, shift: float) -> "FlowMatchSchedule":
        """Upstream builds its scheduler with sigma_min 0 and `extra_one_step` (wan_audio.py:124):
        N evenly spaced levels from 1 down to 0 with the 0 dropped, then warped by `shift`
        (σ = shift·s / (1 + (shift − 1)·s), flow_match.py:51), in float32 as torch does."""
        steps = whole_number(steps, "steps", 1, MAX_STEPS)
        shift = float(shift)
        if not np.isfinite(shift) or shift <= 0.0:
            raise InputError(f"shift must be a positive number, got {shift}")
        s = np.linspace(1.0, 0.0, steps + 1, dtype=np.float32)[:-1]
        shift32 = np.float32(shift)
        sigmas = shift32 * s / (np.float32(1.0) + (shift32 - np.float32(1.0)) * s)
        return cls(sigmas.astype(np.float32))

    @property
    def steps(self) -> int:
        return len(self.sigmas)

    @property
    def timesteps(self) -> np.ndarray:
        """float32 (N,): what the DiT is told at each step (σ·1000)."""
        return (self.sigmas * np.float32(NUM_TRAIN_TIMESTEPS)).astype(np.float32)

    def sigma_after(self, i: int) -> np.float32:
        """σ_{i+1}; after the last step the sample jumps to the clean end, 0 (flow_match.py:79)."""
        return self.sigmas[i + 1] if i + 1 < self.steps else np.float32(0.0)

    def euler_step(self, latent: np.ndarray, velocity: np.ndarray, i: int) -> np.ndarray:
        """x_{i+1} = x_i + v·(σ_{i+1} − σ_i) (flow_match.py:84). Upstream finds i from the
        timestep by nearest match; the levels are distinct, so that is the step index."""
        delta = np.float32(self.sigma_after(i) - self.sigmas[i])
        return (latent + velocity * delta).astype(np.float32)


def guided_velocity(v_cond: np.ndarray, v_uncond: np.ndarray, cfg_scale: float) -> np.ndarray:
    """Classifier-free guidance in float32: v_u + cfg·(v_c − v_u) (wan_audio.py:405)."""
    return (v_uncond + np.float32(cfg_scale) * (v_cond - v_uncond)).astype(np.float32)
