"""Upstream's own flow-match scheduler and DAC VAE decoder (MOSS-SoundEffect v2.0) on a tiny
seeded configuration, written as fixtures/data/soundeffect_v2_upstream.npz for
tests/models/test_soundeffect_v2_schedule.py and test_soundeffect_v2_vae.py:

    PYTHONPATH=. TORCH_VENV/bin/python bench/soundeffect_v2_upstream.py \\
        --upstream-src MOSS-TTS \\
        --golden fixtures/data/soundeffect_v2_upstream.npz

Not a package dependency: runs in a venv with torch, numpy and einops (no moss_tts import: the
comparison is the tests'). Upstream's files are read at run time from a checkout or a bare mirror
of OpenMOSS/MOSS-TTS (never copied into the project): moss_soundeffect_v2/diffsynth/schedulers/
flow_match.py and diffsynth/models/dac_vae.py. dac_vae.py imports `audiotools` (descript's
AudioSignal and its BaseModel, for file I/O and checkpoint loading only); a stub stands in for
it, so the decoder's modules are upstream's unchanged. Everything runs in float32 without
autocast (upstream wraps its CPU call in bf16 autocast; a port compares in f32).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
import tempfile
import types
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.harness import Upstream, upstream_commit, upstream_file, upstream_source  # noqa: E402

SFX = Upstream("MOSS_TTS_UPSTREAM_TTS", "a clone of OpenMOSS/MOSS-TTS or its bare mirror",
               ("moss_soundeffect_v2/diffsynth/schedulers", "moss_soundeffect_v2/diffsynth/models"))
SEED = 34
# Tiny DAC: an odd and an even upsampling stride (output_padding 1 and 0), hop 6.
DAC_KWARGS = {"encoder_dim": 4, "encoder_rates": [2, 3], "latent_dim": 6, "decoder_dim": 8,
              "decoder_rates": [3, 2], "sample_rate": 48000, "continuous": True}
LATENT_FRAMES = 9
SCHEDULES = ((100, 5.0), (7, 3.0), (1, 5.0))     # (steps, shift): the default, odd ones
SAMPLE_STEPS, SAMPLE_SHIFT, SAMPLE_CFG = 5, 5.0, 4.0
SAMPLE_SHAPE = (1, 4, 6)                          # (B, in_dim, frames) of the sampled latent


def load_module(name: str, source: str, folder: Path) -> types.ModuleType:
    """Import upstream's file from a temporary folder (TorchScript reads its functions' source
    from the file, so an in-memory exec does not do)."""
    path = folder / f"{name}.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module     # dataclasses look their module up while decorating
    spec.loader.exec_module(module)
    return module


def stub_audiotools(torch) -> None:
    """dac_vae.py's `from audiotools import AudioSignal` and `from audiotools.ml import
    BaseModel`: BaseModel is an nn.Module with checkpoint helpers we never call."""
    root, ml = types.ModuleType("audiotools"), types.ModuleType("audiotools.ml")
    root.AudioSignal = type("AudioSignal", (), {})
    ml.BaseModel = torch.nn.Module
    root.ml = ml
    sys.modules.setdefault("audiotools", root)
    sys.modules.setdefault("audiotools.ml", ml)


def randomize(model, torch) -> None:
    """Seeded weights with a visible effect everywhere: Snake α in [0.5, 1.5] (α = 1 is the init),
    weight-norm gains in [0.3, 0.8], directions and biases Gaussian."""
    gen = torch.Generator().manual_seed(SEED)
    with torch.no_grad():
        for name, p in sorted(model.named_parameters()):
            if name.endswith("alpha"):
                p.copy_(0.5 + torch.rand(p.shape, generator=gen))
            elif name.endswith("weight_g"):
                p.copy_(0.3 + 0.5 * torch.rand(p.shape, generator=gen))
            elif name.endswith("bias"):
                p.copy_(0.1 * torch.randn(p.shape, generator=gen))
            else:
                p.copy_(torch.randn(p.shape, generator=gen) / np.sqrt(p[0].numel()))


def vae_case(src: Path, torch, folder: Path) -> dict:
    stub_audiotools(torch)
    dac_vae = load_module("dac_vae", upstream_file(src, "dac_vae.py", SFX), folder)
    dac = dac_vae.DAC(**DAC_KWARGS).eval()
    randomize(dac, torch)
    latent = torch.randn(1, DAC_KWARGS["latent_dim"], LATENT_FRAMES,
                         generator=torch.Generator().manual_seed(SEED + 1))
    with torch.no_grad(), torch.autocast("cpu", enabled=False):
        audio = dac.decode(latent)                                    # [1, 1, T·hop]
    out = {"vae.latent": latent[0].T.numpy(), "vae.audio": audio[0, 0].numpy()}
    for name, t in dac.state_dict().items():
        if name.startswith(("decoder.", "post_quant_conv.")):
            out[f"vae.state.{name}"] = t.numpy()
    return out


def scheduler_case(src: Path, torch, folder: Path) -> dict:
    flow_match = load_module("flow_match", upstream_file(src, "flow_match.py", SFX), folder)
    out = {}
    for steps, shift in SCHEDULES:
        # as WanAudioPipeline builds and sets it (wan_audio.py:124, :341)
        sched = flow_match.FlowMatchScheduler(shift=5.0, sigma_min=0.0, extra_one_step=True)
        sched.set_timesteps(steps, denoising_strength=1.0, shift=shift)
        out[f"sched.{steps}.{shift}.sigmas"] = sched.sigmas.numpy()
        out[f"sched.{steps}.{shift}.timesteps"] = sched.timesteps.numpy()
    # a few guided Euler steps from given noise with given velocities (the DiT's stand-in)
    gen = torch.Generator().manual_seed(SEED + 2)
    sched = flow_match.FlowMatchScheduler(shift=5.0, sigma_min=0.0, extra_one_step=True)
    sched.set_timesteps(SAMPLE_STEPS, denoising_strength=1.0, shift=SAMPLE_SHIFT)
    x = torch.randn(SAMPLE_SHAPE, generator=gen)
    v_cond = torch.randn((SAMPLE_STEPS,) + SAMPLE_SHAPE, generator=gen)
    v_uncond = torch.randn((SAMPLE_STEPS,) + SAMPLE_SHAPE, generator=gen)
    latents = [x]
    for i in range(SAMPLE_STEPS):
        v = v_uncond[i] + SAMPLE_CFG * (v_cond[i] - v_uncond[i])   # wan_audio.py:405
        x = sched.step(v, sched.timesteps[i], x)
        latents.append(x)
    out |= {"sample.v_cond": v_cond.numpy(), "sample.v_uncond": v_uncond.numpy(),
            "sample.latents": torch.stack(latents).numpy()}
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--upstream-src", help="clone or bare mirror of OpenMOSS/MOSS-TTS")
    ap.add_argument("--golden", required=True, type=Path, help="the .npz to write")
    args = ap.parse_args()
    import torch

    torch.manual_seed(SEED)
    src = upstream_source(args.upstream_src, SFX)
    with tempfile.TemporaryDirectory() as tmp:
        arrays = vae_case(src, torch, Path(tmp)) | scheduler_case(src, torch, Path(tmp))
    meta = {"upstream_commit": upstream_commit(src), "torch": torch.__version__,
            "dac_kwargs": DAC_KWARGS, "schedules": SCHEDULES,
            "sample": {"steps": SAMPLE_STEPS, "shift": SAMPLE_SHIFT, "cfg_scale": SAMPLE_CFG}}
    arrays = {k: np.ascontiguousarray(v, dtype=np.float32) for k, v in arrays.items()}
    args.golden.parent.mkdir(parents=True, exist_ok=True)
    np.savez_compressed(args.golden, meta=np.array(json.dumps(meta)), **arrays)
    print(f"wrote {args.golden} ({args.golden.stat().st_size} bytes, {len(arrays)} arrays)")


if __name__ == "__main__":
    main()
