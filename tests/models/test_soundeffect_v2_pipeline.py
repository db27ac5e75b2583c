"""MOSS-SoundEffect v2.0's sampling loop (models/soundeffect_v2.py) end to end against upstream's
own `WanAudioPipeline.__call__` on the same tiny text encoder, DiT and DAC from the same given
noise, 3 steps at CFG 4: fixtures/data/soundeffect_v2_pipeline_upstream.npz, written by
bench/soundeffect_v2_pipeline_upstream.py (its docstring has the command and what it drives);
and against the float64 references of the sampler, the DiT and the DAC composed the same way."""

import dataclasses
from pathlib import Path

import numpy as np
import pytest

from fixtures.compare import assert_close, assert_differs
from fixtures.make_soundeffect_v2 import dac_port_arrays, load_upstream_npz
from fixtures.make_soundeffect_v2_text import qwen_tokenizer_json, write_text_encoder_gguf
from fixtures.reference import soundeffect_v2 as ref
from fixtures.reference import soundeffect_v2_dit as ref_dit
from moss_tts.errors import InputError
from moss_tts.ggml import TensorStore, Weights, get_backend
from moss_tts.models.soundeffect_v2 import SoundEffectSampler, output_samples
from moss_tts.models.soundeffect_v2_dit import WanAudioConfig, WanAudioDiT
from moss_tts.models.soundeffect_v2_text import TextEncoder
from moss_tts.models.soundeffect_v2_vae import DACConfig, DACDecoder
from moss_tts.text.qwen_tokenizer import QwenTokenizer

UPSTREAM = Path(__file__).resolve().parents[2] / \
    "fixtures/data/soundeffect_v2_pipeline_upstream.npz"
# ggml f32 against torch f32 through the text encoder (≤ 2.8e-6 alone), 3 guided DiT steps (CFG 4
# scales the cond/uncond difference ×4; ≤ 1.5e-6 per DiT call alone) and the DAC decode,
# |audio| ≲ 0.9: measured 1.3e-6. 2e-5 leaves room for other summation orders; the weakest
# guard (another negative prompt) moves the audio by 5e-4, 25× that.
UPSTREAM_ATOL = 2e-5

# the f32 loop against the float64 DiT, sampler and DAC on the port's own contexts (the text
# encoder has its own reference test): measured 1.5e-6; the guard moves the audio by 7e-2
REFERENCE_ATOL = 2e-5


@pytest.fixture(scope="module")
def upstream():
    return load_upstream_npz(UPSTREAM)


@pytest.fixture(scope="module")
def sampler(upstream, tmp_path_factory):
    meta = upstream["meta"]
    text = TextEncoder(Weights.load(write_text_encoder_gguf(
        tmp_path_factory.mktemp("sfx2_pipe") / "text.gguf", seed=meta["text_seed"]),
        get_backend(None, 1)), QwenTokenizer.from_json(qwen_tokenizer_json()))
    fields = {f.name for f in dataclasses.fields(WanAudioConfig)}
    dit_cfg = WanAudioConfig(**{k: tuple(v) if k == "patch_size" else v
                                for k, v in meta["dit_config"].items() if k in fields})
    dit_store = TensorStore({k[4:]: v for k, v in upstream.items() if k.startswith("dit.")})
    dit = WanAudioDiT(dit_store, dit_cfg)
    vae_store = TensorStore(dac_port_arrays(
        {k[len("vae.state."):]: v for k, v in upstream.items() if k.startswith("vae.state.")}),
        "cpu")
    vae = DACDecoder(vae_store, DACConfig.from_kwargs(meta["dac_kwargs"]))
    call = meta["call"]
    yield SoundEffectSampler(text, dit, vae, sample_rate=call["sample_rate"],
                             max_inference_seconds=call["max_inference_seconds"])
    for resource in (vae, vae_store, dit, dit_store, text):
        resource.close()


def generate(sampler, call: dict, noise, **changes):
    call = call | changes
    return sampler(call["prompt"], call["seconds"], noise,
                   negative_prompt=call["negative_prompt"], steps=call["steps"],
                   cfg_scale=call["cfg_scale"], shift=call["shift"])


def test_sampling_matches_upstream(sampler, upstream):
    call, want = upstream["meta"]["call"], upstream["audio"]
    assert sampler.noise_shape() == upstream["noise"].shape
    seen = []
    got = sampler(call["prompt"], call["seconds"], upstream["noise"],
                  negative_prompt=call["negative_prompt"], steps=call["steps"],
                  cfg_scale=call["cfg_scale"], shift=call["shift"],
                  progress=lambda i, n: seen.append((i, n)))
    assert got.shape == (output_samples(call["sample_rate"], call["seconds"]),)
    assert_close(got, want, atol=UPSTREAM_ATOL, what="audio vs upstream's pipeline")
    assert seen == [(i + 1, call["steps"]) for i in range(call["steps"])]
    # guards: another noise, another prompt, another negative prompt each move the audio
    other_noise = np.random.default_rng(upstream["meta"]["noise_seed"] + 1).standard_normal(
        upstream["noise"].shape).astype(np.float32)
    assert_differs(generate(sampler, call, other_noise), want, atol=UPSTREAM_ATOL,
                   what="audio from another noise")
    assert_differs(generate(sampler, call, upstream["noise"], prompt="thunder far away"), want,
                   atol=UPSTREAM_ATOL, what="audio of another prompt")
    assert_differs(generate(sampler, call, upstream["noise"], negative_prompt="speech"), want,
                   atol=UPSTREAM_ATOL, what="audio with a negative prompt")


def test_sampling_matches_reference(sampler, upstream):
    meta, noise = upstream["meta"], upstream["noise"]
    call = meta["call"]
    cond, uncond = sampler.contexts(call["prompt"], call["seconds"], call["negative_prompt"],
                                    call["cfg_scale"])
    weights = {k[4:]: v for k, v in upstream.items() if k.startswith("dit.")}

    def guided(x, t):
        v_c, v_u = (ref_dit.forward_one(x, np.float32(t), c, weights, meta["dit_config"])
                    for c in (cond, uncond))
        return v_u + call["cfg_scale"] * (v_c - v_u)

    latent = ref.flow_match_sample(noise.T, guided, call["steps"], call["shift"])
    state = {k[len("vae.state."):]: v for k, v in upstream.items() if k.startswith("vae.state.")}
    want = ref.dac_decode(latent, state, meta["dac_kwargs"]["decoder_rates"])
    want = want[:output_samples(call["sample_rate"], call["seconds"])]
    assert_close(generate(sampler, call, noise), want, atol=REFERENCE_ATOL,
                 what="audio vs float64 reference")
    # guard: one noise value changed moves the audio
    moved = noise.copy()
    moved[2, 5] += 1.0
    assert_differs(generate(sampler, call, moved), want, atol=REFERENCE_ATOL,
                   what="audio from a changed noise")


def test_without_guidance_the_negative_prompt_is_not_used(sampler, upstream):
    call, noise = upstream["meta"]["call"], upstream["noise"]
    plain = generate(sampler, call, noise, cfg_scale=1.0)
    np.testing.assert_array_equal(generate(sampler, call, noise, cfg_scale=1.0,
                                           negative_prompt="speech"), plain)
    assert_differs(plain, upstream["audio"], atol=UPSTREAM_ATOL, what="audio without guidance")


def test_crop_truncates_the_float_product():
    assert output_samples(48000, 2.3) == 110399          # 48000·2.3 = 110399.99…
    assert output_samples(60, 0.74) == 42                # seconds rounded to 0.7 first


@pytest.mark.parametrize("seconds, noise_frames, match", [
    (0.04, 20, "> 0"), (2.1, 20, "exceeds"), (0.7, 19, "noise must have shape")])
def test_bad_request_is_one_line_error(sampler, upstream, seconds, noise_frames, match):
    noise = np.zeros((upstream["noise"].shape[0], noise_frames), np.float32)
    with pytest.raises(InputError, match=match):
        sampler("rain", seconds, noise)
