"""The flow-match sampler of MOSS-SoundEffect v2.0 (moss_tts/models/soundeffect_v2_schedule.py)
against the float64 reference fixtures/reference/soundeffect_v2.py and against upstream's own
FlowMatchScheduler: fixtures/data/soundeffect_v2_upstream.npz, written by
`bench/soundeffect_v2_upstream.py` (its docstring has the command), each with a sensitivity guard
(style C28)."""

from pathlib import Path

import numpy as np
import pytest

from fixtures.compare import assert_close, assert_differs
from fixtures.make_soundeffect_v2 import load_upstream_npz
from fixtures.reference import soundeffect_v2 as ref
from moss_tts.errors import InputError
from moss_tts.models.soundeffect_v2_schedule import FlowMatchSchedule, guided_velocity

UPSTREAM = Path(__file__).resolve().parents[2] / "fixtures/data/soundeffect_v2_upstream.npz"
# σ is a few float32 ops on values ≤ 1 (torch's linspace and ours may round s one ulp apart):
# measured ≤ 1e-7 against float64 and against torch.
SIGMA_ATOL = 5e-7
# timesteps are σ·1000: the same relative error, 1000× larger.
TIMESTEP_ATOL = 5e-4
# five guided Euler steps on |x| ≲ 10 (cfg 4 amplifies the velocities): a few float32 roundings
# per step; measured 0 against torch (the same float32 ops in the same order).
LATENT_ATOL = 1e-5


@pytest.fixture(scope="module")
def upstream():
    return load_upstream_npz(UPSTREAM)


@pytest.mark.parametrize("steps, shift", [(100, 5.0), (7, 3.0), (1, 5.0), (4, 1.0)])
def test_sigmas_match_reference(steps, shift):
    sched = FlowMatchSchedule.make(steps, shift=shift)
    want = ref.flow_match_sigmas(steps, shift)
    assert_close(sched.sigmas, want, atol=SIGMA_ATOL, what="sigmas")
    assert_close(sched.timesteps, 1000.0 * want, atol=TIMESTEP_ATOL, what="timesteps")
    assert sched.sigmas.dtype == np.float32 and sched.sigmas[0] == 1.0
    if steps > 1:   # one level is σ_0 = 1 whatever the shift
        assert_differs(FlowMatchSchedule.make(steps, shift=shift + 0.5).sigmas, want,
                       atol=SIGMA_ATOL, what="sigmas of another shift")


def test_four_steps_shift_five_are_the_documented_levels():
    """Worked by hand from flow_match.py:51: N = 4, shift 5 → σ = 1, 0.9375, 0.8333, 0.625."""
    assert_close(FlowMatchSchedule.make(4, shift=5.0).sigmas, [1.0, 0.9375, 5 / 6, 0.625],
                 atol=SIGMA_ATOL, what="sigmas")


def test_schedules_match_upstream(upstream):
    for steps, shift in upstream["meta"]["schedules"]:
        sched = FlowMatchSchedule.make(steps, shift=shift)
        assert_close(sched.sigmas, upstream[f"sched.{steps}.{shift}.sigmas"], atol=SIGMA_ATOL,
                     what=f"sigmas ({steps} steps, shift {shift})")
        assert_close(sched.timesteps, upstream[f"sched.{steps}.{shift}.timesteps"],
                     atol=TIMESTEP_ATOL, what=f"timesteps ({steps} steps, shift {shift})")


def guided_run(sched, x, v_cond, v_uncond, cfg_scale):
    latents = [x]
    for i in range(sched.steps):
        x = sched.euler_step(x, guided_velocity(v_cond[i], v_uncond[i], cfg_scale), i)
        latents.append(x)
    return np.stack(latents)


def test_guided_euler_steps_match_upstream(upstream):
    s = upstream["meta"]["sample"]
    sched = FlowMatchSchedule.make(s["steps"], shift=s["shift"])
    want = upstream["sample.latents"]
    got = guided_run(sched, want[0], upstream["sample.v_cond"], upstream["sample.v_uncond"],
                     s["cfg_scale"])
    assert_close(got, want, atol=LATENT_ATOL, what="latents after each step")
    # guard: the guidance scale must matter
    wrong = guided_run(sched, want[0], upstream["sample.v_cond"], upstream["sample.v_uncond"],
                       s["cfg_scale"] + 0.5)
    assert_differs(wrong[1:], want[1:], atol=LATENT_ATOL, what="latents with another cfg")


def test_euler_steps_match_reference():
    rng = np.random.default_rng(34)
    noise = rng.standard_normal((6, 4)).astype(np.float32)
    w = rng.standard_normal((4, 4)) * 0.3

    def velocity(x, t):          # any smooth field of (x, t) exercises the step arithmetic
        return np.tanh(x @ w) * (1.0 + t / 1000.0)

    sched = FlowMatchSchedule.make(6, shift=5.0)
    x = noise
    for i, t in enumerate(sched.timesteps):
        x = sched.euler_step(x, velocity(x, float(t)).astype(np.float32), i)
    want = ref.flow_match_sample(noise, velocity, 6, 5.0)
    assert_close(x, want, atol=LATENT_ATOL, what="sampled latent")
    assert_differs(ref.flow_match_sample(noise, velocity, 6, 4.0), want, atol=LATENT_ATOL,
                   what="sampled latent of another shift")


def test_last_step_lands_on_zero_noise():
    sched = FlowMatchSchedule.make(3, shift=5.0)
    assert sched.sigma_after(2) == 0.0
    x, v = np.ones(3, np.float32), np.full(3, 2.0, np.float32)
    assert_close(sched.euler_step(x, v, 2), x - 2.0 * sched.sigmas[2], atol=1e-7, what="x_N")


@pytest.mark.parametrize("steps, shift", [(0, 5.0), (2.5, 5.0), (10, 0.0), (10, float("nan"))])
def test_bad_steps_or_shift_raise_one_line(steps, shift):
    with pytest.raises(InputError, match="steps|shift"):
        FlowMatchSchedule.make(steps, shift=shift)
