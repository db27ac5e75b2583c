"""Upstream's own MOSS-SoundEffect v2.0 sampling loop end to end on tiny components, written as
fixtures/data/soundeffect_v2_pipeline_upstream.npz for tests/models/test_soundeffect_v2_pipeline.py:

    PYTHONPATH=. TORCH_VENV/bin/python bench/soundeffect_v2_pipeline_upstream.py \\
        --upstream-src MOSS-TTS

Not a package dependency: runs in a venv with torch, transformers==5.0.0, diffusers, einops,
ftfy (upstream's imports) and this repository's fixtures and benches (no moss_tts import: the
comparison is the test's). Upstream's `moss_soundeffect_v2/` files are read at run time from a
checkout or a bare mirror of OpenMOSS/MOSS-TTS into a temporary package (never copied into the
project); `audiotools` is stubbed as in bench/soundeffect_v2_upstream.py.

What runs is upstream's `WanAudioPipeline.__call__` itself (diffsynth/pipelines/wan_audio.py:
its units, the per-step `model_fn_wan_video` on the cond then the uncond context, CFG, the
scheduler's step, the DAC decode), assembled by hand as its `from_pretrained` assembles it, with
the tiny text encoder of fixtures.make_soundeffect_v2_text (seed 0), a tiny `WanAudioModel`
seeded as bench/soundeffect_v2_dit_upstream.py seeds it (its text_dim is the text encoder's
width and its in_dim the VAE's latent_dim, so the three chain) and the DAC of
bench/soundeffect_v2_upstream.py. `MossSoundEffectPipeline.__call__` is not called: it wraps the
engine in bf16 autocast, which on CPU reaches everything (§family-10.1); its three lines around
the engine (round the seconds, suffix the positive prompt, crop to int(sr·seconds)) are written
out here. The initial noise is given (numpy, NOISE_SEED) through the engine's `generate_noise`,
since a port cannot reproduce torch's generator. TORCHDYNAMO_DISABLE=1 as upstream's own
scripts set it (model_fn_wan_video is torch.compile'd); everything f32, autocast off.

The same components are then written in the published checkpoint's layout (model_index.json,
scheduler/, transformer/ with the diffusers names of upstream's own hf_export.convert_dit_keys,
text_encoder/, tokenizer/, vae/vae_128d_48k.pth as audiotools' BaseModel.save writes it) and
loaded back through upstream's `WanAudioPipeline.from_pretrained`, whose audio must equal the
first run's: the npz keeps that directory's tensors (`ckpt.transformer.*`, `ckpt.vae.*`, the
encoder's included) so a torch-free test rebuilds it for the converter. The stubbed
`BaseModel.load` is audiotools' fallback path (torch.load, constructor kwargs not in DAC's
signature dropped, load_state_dict strict=False).
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("TORCHDYNAMO_DISABLE", "1")

from bench.harness import Upstream, upstream_commit, upstream_file, upstream_source  # noqa: E402
from bench.soundeffect_v2_dit_upstream import SEED as DIT_SEED, seeded_model  # noqa: E402
from bench.soundeffect_v2_upstream import DAC_KWARGS, randomize, stub_audiotools  # noqa: E402
from fixtures.make_soundeffect_v2_text import (  # noqa: E402
    make_text_encoder_checkpoint, tiny_text_config)

SFX = Upstream("MOSS_TTS_UPSTREAM_TTS", "a clone of OpenMOSS/MOSS-TTS or its bare mirror",
               ("moss_soundeffect_v2",))
FILES = ("__init__.py", "pipeline_moss_soundeffect.py", "diffsynth/__init__.py",
         "diffsynth/models/__init__.py", "diffsynth/models/utils.py",
         "diffsynth/models/dac_vae.py", "diffsynth/models/qwen3_text_encoder.py",
         "diffsynth/models/wan_audio_dit.py", "diffsynth/models/wan_video_dit.py",
         "diffsynth/models/wan_video_camera_controller.py", "diffsynth/pipelines/__init__.py",
         "diffsynth/pipelines/wan_audio.py", "diffsynth/prompters/__init__.py",
         "diffsynth/prompters/base_prompter.py", "diffsynth/prompters/wan_prompter.py",
         "diffsynth/schedulers/__init__.py", "diffsynth/schedulers/flow_match.py",
         "diffsynth/utils/__init__.py", "hf_export.py")
OUT = ROOT / "fixtures" / "data" / "soundeffect_v2_pipeline_upstream.npz"
TEXT_SEED = 0           # fixtures.make_soundeffect_v2_text's checkpoint seed
NOISE_SEED = 7
# the DiT of bench/soundeffect_v2_dit_upstream.py but chained: text_dim = the text encoder's
# hidden size, in/out = the DAC's latent_dim
DIT_CONFIG = dict(in_dim=DAC_KWARGS["latent_dim"], out_dim=DAC_KWARGS["latent_dim"],
                  text_dim=tiny_text_config()["hidden_size"], freq_dim=16, eps=1e-6,
                  patch_size=[1], has_image_input=False, dim=48, ffn_dim=64, num_heads=4,
                  num_layers=2, vae_type="dac")
# 20 latent frames of hop 6 (120 samples = 60 Hz × 2 s); 0.7 s crops to int(60·0.7) = 42
CALL = dict(prompt="  rain on a tin roof ", seconds=0.7, negative_prompt="", steps=3,
            cfg_scale=4.0, shift=5.0, sample_rate=60, max_inference_seconds=2)


def load_upstream(src: Path, root: Path):
    """Upstream's `moss_soundeffect_v2` as a package under `root`; returns its wan_audio."""
    for name in FILES:
        path = root / "moss_soundeffect_v2" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(upstream_file(src, name, SFX))
    sys.path.insert(0, str(root))
    return importlib.import_module("moss_soundeffect_v2.diffsynth.pipelines.wan_audio")


def engine(wan_audio, torch, ckpt: Path, noise: np.ndarray):
    """WanAudioPipeline assembled as its from_pretrained does, on the tiny components."""
    from moss_soundeffect_v2.diffsynth.models.qwen3_text_encoder import Qwen3TextEncoder

    pipe = wan_audio.WanAudioPipeline(device="cpu", torch_dtype=torch.float32,
                                      tokenizer_path=str(ckpt), flow_shift=5.0)
    text_encoder = Qwen3TextEncoder(str(ckpt), torch_dtype=torch.float32)
    pipe.prompter.fetch_models(text_encoder)
    pipe.text_encoder = text_encoder
    pipe.dit = seeded_model(wan_audio.WanAudioModel, DIT_CONFIG, torch)
    dac = wan_audio.DAC(**DAC_KWARGS).eval()
    randomize(dac, torch)
    pipe.vae = dac
    pipe.audio_latent_dim = DIT_CONFIG["in_dim"]
    pipe.num_samples_division_factor = dac.hop_length

    def given_noise(shape, **_):
        assert tuple(shape) == (1,) + noise.shape, (shape, noise.shape)
        return torch.from_numpy(noise[None].copy())

    pipe.generate_noise = given_noise
    return pipe


def run(pipe, torch, call: dict) -> np.ndarray:
    """MossSoundEffectPipeline.__call__'s work around the engine, without its bf16 autocast."""
    seconds = round(float(call["seconds"]), 1)
    prompt = f"{call['prompt'].strip()} duration: {seconds:.1f}s"
    with torch.no_grad(), torch.autocast("cpu", enabled=False):
        audio = pipe(prompt=prompt, negative_prompt=call["negative_prompt"], seed=0,
                     cfg_scale=float(call["cfg_scale"]), sigma_shift=float(call["shift"]),
                     num_inference_steps=int(call["steps"]),
                     num_samples=call["sample_rate"] * call["max_inference_seconds"],
                     num_channels=1, progress_bar_cmd=lambda x: x)
    return audio[0, 0, :int(call["sample_rate"] * seconds)].float().numpy()


MODEL_INDEX = {"_class_name": "MossSoundEffectPipeline", "dit_variant": "tiny",
               "sample_rate": CALL["sample_rate"],
               "max_inference_seconds": CALL["max_inference_seconds"]}
SCHEDULER = {"_class_name": "FlowMatchScheduler", "shift": 5.0}
VAE_FILE = "vae/vae_128d_48k.pth"


def stub_base_model_load(torch) -> None:
    """audiotools' BaseModel.load on a plain state-dict checkpoint (its fallback path)."""
    import inspect

    def load(cls, location, *args, strict=False, **kwargs):
        model_dict = torch.load(location, "cpu")
        metadata = model_dict["metadata"]
        metadata["kwargs"].update(kwargs)
        keys = list(inspect.signature(cls).parameters)
        for k in [k for k in metadata["kwargs"] if k not in keys]:
            metadata["kwargs"].pop(k)
        model = cls(*args, **metadata["kwargs"])
        model.load_state_dict(model_dict["state_dict"], strict=strict)
        model.metadata = metadata
        return model

    sys.modules["audiotools.ml"].BaseModel.load = classmethod(load)


def write_published(pipe, torch, text_ckpt: Path, out: Path) -> dict:
    """The tiny pipeline in the published layout under `out`; returns its tensors by file."""
    import shutil

    from moss_soundeffect_v2.hf_export import convert_dit_keys
    from safetensors.torch import save_file

    for sub in ("scheduler", "transformer", "vae"):
        (out / sub).mkdir(parents=True, exist_ok=True)
    (out / "model_index.json").write_text(json.dumps(MODEL_INDEX))
    (out / "scheduler" / "scheduler_config.json").write_text(json.dumps(SCHEDULER))
    (out / "transformer" / "config.json").write_text(json.dumps(DIT_CONFIG))
    dit = {k: v.detach().contiguous() for k, v in convert_dit_keys(pipe.dit.state_dict()).items()}
    save_file(dit, str(out / "transformer" / "diffusion_pytorch_model.safetensors"))
    for sub in ("text_encoder", "tokenizer"):
        shutil.copytree(text_ckpt, out / sub)
    vae = {k: v.detach().clone() for k, v in pipe.vae.state_dict().items()}
    torch.save({"state_dict": vae, "metadata": {"kwargs": dict(DAC_KWARGS)}}, out / VAE_FILE)
    return ({f"ckpt.transformer.{k}": v.numpy() for k, v in dit.items()}
            | {f"ckpt.vae.{k}": v.numpy() for k, v in vae.items()})


def reloaded(wan_audio, torch, out: Path, noise: np.ndarray):
    """upstream's own from_pretrained on the written directory, with the given noise."""
    pipe = wan_audio.WanAudioPipeline.from_pretrained(str(out), device="cpu",
                                                      torch_dtype=torch.float32)

    def given_noise(shape, **_):
        return torch.from_numpy(noise[None].copy())

    pipe.generate_noise = given_noise
    return pipe


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--upstream-src", help=f"upstream checkout (else ${SFX.env})")
    ap.add_argument("--golden", type=Path, default=OUT, help="the .npz to write")
    args = ap.parse_args(argv)
    import torch

    src = upstream_source(args.upstream_src, SFX)
    stub_audiotools(torch)
    stub_base_model_load(torch)
    hop = int(np.prod(DAC_KWARGS["encoder_rates"]))
    frames = CALL["sample_rate"] * CALL["max_inference_seconds"] // hop
    noise = np.random.default_rng(NOISE_SEED).standard_normal(
        (DIT_CONFIG["in_dim"], frames)).astype(np.float32)
    with tempfile.TemporaryDirectory() as tmp:
        wan_audio = load_upstream(src, Path(tmp) / "upstream")
        ckpt = make_text_encoder_checkpoint(Path(tmp) / "text_encoder", seed=TEXT_SEED)
        pipe = engine(wan_audio, torch, ckpt, noise)
        audio = run(pipe, torch, CALL)
        dit_state = {f"dit.{n}": t.detach().numpy() for n, t in pipe.dit.state_dict().items()}
        vae_state = {f"vae.state.{n}": t.numpy() for n, t in pipe.vae.state_dict().items()
                     if n.startswith(("decoder.", "post_quant_conv."))}
        published = write_published(pipe, torch, ckpt, Path(tmp) / "published")
        again = run(reloaded(wan_audio, torch, Path(tmp) / "published", noise), torch, CALL)
        if not np.array_equal(again, audio):
            raise SystemExit(f"from_pretrained's audio differs by {np.abs(again - audio).max()}")
    meta = {"upstream_commit": upstream_commit(src), "torch": torch.__version__,
            "dit_config": DIT_CONFIG, "dac_kwargs": DAC_KWARGS, "call": CALL,
            "text_seed": TEXT_SEED, "dit_seed": DIT_SEED, "noise_seed": NOISE_SEED,
            "model_index": MODEL_INDEX, "scheduler": SCHEDULER, "vae_file": VAE_FILE}
    arrays = {k: np.ascontiguousarray(v, dtype=np.float32)
              for k, v in (dit_state | vae_state | published | {"noise": noise, "audio": audio}).items()}
    args.golden.parent.mkdir(parents=True, exist_ok=True)
    np.savez_compressed(args.golden, meta=np.array(json.dumps(meta)), **arrays)
    print(f"wrote {args.golden} ({args.golden.stat().st_size} bytes); audio {audio.shape}, "
          f"|audio| max {np.abs(audio).max():.4f}")


if __name__ == "__main__":
    main()
