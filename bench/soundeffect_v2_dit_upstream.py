"""Parity fixture for the MOSS-SoundEffect v2.0 DiT from upstream's own `WanAudioModel`: a tiny
model with seeded random weights, one f32 forward of a batch of two (cond, uncond context) at one
timestep, written as fixtures/data/soundeffect_v2_dit_upstream.npz (weights by native name,
inputs, velocity) for tests/models/test_soundeffect_v2_dit.py. Run in a torch venv (torch,
diffusers, einops; never the package's dependencies):

    PYTHONPATH=. TORCHVENV/bin/python bench/soundeffect_v2_dit_upstream.py [--upstream-src DIR]

Upstream's files are copied at run time from the checkout (--upstream-src or
$MOSS_TTS_UPSTREAM_SOUNDEFFECT_V2: its files or its git HEAD) into bench/results/ (gitignored),
never into the committed tree.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.harness import Upstream  # noqa: E402
from bench.upstream_torch import copy_upstream, import_upstream  # noqa: E402

SOUNDEFFECT_V2 = Upstream(
    "MOSS_TTS_UPSTREAM_SOUNDEFFECT_V2",
    "the upstream MOSS-SoundEffect v2.0 code: a clone (or bare mirror) of GitHub "
    "OpenMOSS/MOSS-TTS (moss_soundeffect_v2/diffsynth/models/), or those model files",
    ("", "moss_soundeffect_v2/diffsynth/models"))
# the DiT's module and what it imports (relative imports inside one flat package)
FILES = ("wan_audio_dit.py", "wan_video_dit.py", "wan_video_camera_controller.py", "utils.py")
COPY_DIR = ROOT / "bench" / "results" / "upstream_soundeffect_v2"
OUT = ROOT / "fixtures" / "data" / "soundeffect_v2_dit_upstream.npz"
# transformer/config.json of a tiny model (field names and kinds as the real 1.3B one's); head_dim
# 12 because upstream splits the RoPE table in 3 chunks of head_dim/2 frequencies (needs ≥ 3)
CONFIG = dict(in_dim=8, out_dim=8, text_dim=24, freq_dim=16, eps=1e-6, patch_size=[1],
              has_image_input=False, dim=48, ffn_dim=64, num_heads=4, num_layers=2,
              vae_type="dac")
N_FRAMES, N_CONTEXT, N_VALID = 20, 10, 6
TIMESTEP = 937.5        # σ = 0.9375: step 1 of 4 at shift 5
SEED = 34


def seeded_model(model_class, config: dict, torch):
    """`model_class(**config)` in f32 with random everything from torch's seed SEED, incl. the
    norms' affine parts (upstream's init makes them 1 and 0)."""
    torch.manual_seed(SEED)
    model = model_class(**config).float().eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            scale = 0.5 if p.dim() == 1 or "modulation" in name else p.shape[-1] ** -0.5
            p.copy_(torch.randn(p.shape) * scale)
            if "norm" in name and name.endswith("weight"):
                p.add_(1.0)
    return model


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--upstream-src", help=f"upstream checkout (else ${SOUNDEFFECT_V2.env})")
    args = ap.parse_args()
    import torch

    commit = copy_upstream(COPY_DIR, FILES, SOUNDEFFECT_V2, args.upstream_src)
    dit = import_upstream(COPY_DIR, "wan_audio_dit")
    model = seeded_model(dit.WanAudioModel, CONFIG, torch)
    rng = np.random.default_rng(SEED)
    latent = rng.standard_normal((2, CONFIG["in_dim"], N_FRAMES)).astype(np.float32)
    latent[1] = latent[0]                       # the CFG pair shares the latent
    context = rng.standard_normal((2, N_CONTEXT, CONFIG["text_dim"])).astype(np.float32)
    context[0, N_VALID:] = 0.0                  # the prompter zeroes the padding rows
    context[1] = 0.0                            # the empty negative prompt: all zero
    timestep = np.full(2, TIMESTEP, dtype=np.float32)
    with torch.no_grad():
        out = model(torch.from_numpy(latent), torch.from_numpy(timestep),
                    torch.from_numpy(context)).numpy()
    arrays = {f"w.{n}": t.detach().numpy() for n, t in model.state_dict().items()}
    OUT.parent.mkdir(parents=True, exist_ok=True)
    np.savez_compressed(OUT, config=json.dumps(CONFIG), upstream_commit=commit, latent=latent,
                        timestep=timestep, context=context, velocity=out, **arrays)
    print(f"wrote {OUT} ({OUT.stat().st_size} bytes); velocity {out.shape}, "
          f"|v| max {np.abs(out).max():.3f}")


if __name__ == "__main__":
    main()
