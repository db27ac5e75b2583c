"""MOSS-SoundEffect v2.0 at the real dimensions on seeded random weights: seconds per DiT step
(the CFG pair as one batch of two) per weight type, the step's GFLOP and its share of the host's
measured GEMM peak, one single pass (batch 1) against the pair, a short step, the DAC VAE decode
of 30 s in the sampler's chunks, and upstream's PyTorch `WanAudioModel` f32 on the same weights
in the same run (cond and uncond as two calls, as upstream's pipeline runs them).

    python bench/soundeffect_v2.py [--types f32,f16,q8_0] [--layers 30] [--frames 1500]
        [--short 250] [--repeats 2] [--threads N] [--no-peer] [--no-vae] [--peer-python PY]
        [--upstream-src DIR] [--json [FILE]] [--no-wait] [--profile] [--tiny]

The DiT is the 1.3B preset (docs/upstream-notes.md §family-10.1): in/out 128, text 2048, freq 256,
patch [1], dim 1536, FFN 8960, 12 heads, 30 layers; 1500 latent frames (30 s at 50 Hz, what the
pipeline always denoises) and 512 context rows. The VAE is the DAC decoder with the kwargs of
`REAL_DAC` below. Weights: one GGUF per type under --data, written once from a generator keyed
by tensor name (matrices in the type, norms, biases and modulations f32: converters' `matmul_types`
policy); the peer fills upstream's model from the same generator, so both run the same f32 values
(the report gives the velocity difference). --layers N builds N blocks only and scales every DiT
figure by 30/N (the stems, ~1 % of a step, scale with them: a slight overestimate).

Every measurement runs in its own worker process (ours per type, the VAE, the peer in
--peer-python, a python with torch, einops and upstream's code from --upstream-src or
$MOSS_TTS_UPSTREAM_SOUNDEFFECT_V2); the driver prints the CPU line and probes the GEMM peak
(bench/matmul.py --peak-only) at the start and the end. Times are medians of --repeats warm runs
after a cold one (graph build, first touch of the mmapped weights).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
import zlib
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

# stdlib + numpy only at the top: the peer worker imports this module in the torch venv
from bench.harness import (ROOT, Contention, add_no_wait, end_report, fmt, median,  # noqa: E402
                           peak_rss_gb)

FULL_LAYERS = 30
REAL_DIT = dict(in_dim=128, out_dim=128, text_dim=2048, freq_dim=256, eps=1e-6, patch_size=[1],
                dim=1536, ffn_dim=8960, num_heads=12, num_layers=FULL_LAYERS)
# upstream's tiny parity config (bench/soundeffect_v2_dit_upstream.py CONFIG)
TINY_DIT = dict(in_dim=8, out_dim=8, text_dim=24, freq_dim=16, eps=1e-6, patch_size=[1], dim=48,
                ffn_dim=64, num_heads=4, num_layers=2)
# vae_128d_48k's DAC kwargs are not in upstream's code (the .pth carries them); these are the
# 48 kHz 128-d DAC-VAE's as a third-party port of the same family declares them (MOVA's
# DacVAEArchConfig): hop 2·3·4·5·8 = 960 samples = 50 Hz, decoder 2048 wide, ×8·5·4·3·2
REAL_DAC = dict(encoder_dim=128, encoder_rates=[2, 3, 4, 5, 8], latent_dim=128, decoder_dim=2048,
                decoder_rates=[8, 5, 4, 3, 2], sample_rate=48000, continuous=True)
TINY_DAC = dict(encoder_dim=4, encoder_rates=[2, 3], latent_dim=6, decoder_dim=8,
                decoder_rates=[3, 2], sample_rate=48000, continuous=True)
REAL_CONTEXT, TINY_CONTEXT = 512, 10
LATENT_HZ = 50           # 48000 / 960: latent frames per second of audio
VALID_ROWS = 40          # the prompt's tokens; the rest of the 512 context rows are zero
TIMESTEP = 937.5         # σ = 0.9375 (any step costs the same)
SEED = 34


def dit_config(args) -> dict:
    return (TINY_DIT if args.tiny else REAL_DIT) | {"num_layers": args.layers}


def context_rows(args) -> int:
    return TINY_CONTEXT if args.tiny else REAL_CONTEXT


def layer_scale(args) -> float:
    """What multiplies a measured DiT time to the model's full depth."""
    return 1.0 if args.tiny else FULL_LAYERS / args.layers


# -- the values both sides run --------------------------------------------------------------------
def tensor_value(name: str, shape) -> np.ndarray:
    """A tensor drawn from a generator seeded by its name (so ours and the peer build the same
    values whatever order they walk the names in): matrices and convolutions ~ N(0, 1/fan_in),
    norm gains and Snake's α 1 ± 0.1, biases and modulations ± 0.1."""
    shape = tuple(int(s) for s in shape)
    rng = np.random.default_rng(zlib.crc32(name.encode()))
    a = rng.standard_normal(shape, dtype=np.float32)
    if len(shape) >= 2 and "modulation" not in name:
        return a * np.float32(math.prod(shape[1:]) ** -0.5)
    a *= np.float32(0.1)
    return a + np.float32(1.0) if name.endswith(("norm_q.weight", "norm_k.weight", "norm3.weight",
                                                 "alpha")) else a


def dit_inputs(cfg: dict, frames: int, n_context: int) -> tuple[np.ndarray, np.ndarray]:
    """latent (2, frames, in_dim), the pair sharing it; context (2, L, text_dim): the prompt's
    rows then zeros (cond), all zeros (the empty negative prompt)."""
    rng = np.random.default_rng(SEED)
    latent = rng.standard_normal((1, frames, cfg["in_dim"]), dtype=np.float32)
    context = np.zeros((2, n_context, cfg["text_dim"]), np.float32)
    valid = min(VALID_ROWS, n_context)
    context[0, :valid] = rng.standard_normal((valid, cfg["text_dim"]), dtype=np.float32)
    return np.repeat(latent, 2, axis=0), context


def step_gflop(cfg: dict, frames: int, n_context: int, batch: int) -> float:
    """GFLOP of one DiT forward from the dims (2 per multiply-add): the linears (patch embedding,
    the text and time MLPs, per block q/k/v/o of both attentions and the FFN, the head) and the
    attention products (q·kᵀ and p·v) over the keys as the graph pads them (`padded_keys`: 1504
    of 1500 frames, the work ggml does)."""
    from moss_tts.models.soundeffect_v2_dit import padded_keys

    d, f, lc = cfg["dim"], cfg["ffn_dim"], n_context
    keys = padded_keys(frames)
    per_block = (2 * frames * d * d * 4          # self-attention q, k, v, o
                 + 2 * frames * d * d * 2        # cross-attention q, o
                 + 2 * lc * d * d * 2            # cross-attention k, v over the context rows
                 + 2 * frames * d * f * 2        # FFN up and down
                 + 2 * 2 * frames * keys * d     # self-attention scores and mix
                 + 2 * 2 * frames * lc * d)      # cross-attention scores and mix
    stems = (2 * frames * cfg["in_dim"] * d + 2 * lc * (cfg["text_dim"] * d + d * d)
             + 2 * (cfg["freq_dim"] * d + d * d + d * 6 * d) + 2 * frames * d * cfg["out_dim"])
    return batch * (stems + cfg["num_layers"] * per_block) / 1e9


def timed(call, repeats: int, *, cold: bool) -> tuple[dict, object]:
    """`call()` once cold (when asked) then `repeats` times: (median and each warm time in s, the
    cold time, the CPU share other processes took meanwhile; the last output)."""
    times, foreign, out = [], [], None
    for _ in range(repeats + int(cold)):
        c = Contention()
        t0 = time.perf_counter()
        out = call()
        times.append(time.perf_counter() - t0)
        foreign.append(c.share())
    warm = times[int(cold):]
    return {"s": median(warm), "runs_s": warm, "cold_s": times[0] if cold else None,
            "foreign": median(foreign[int(cold):])}, out


# -- ours -------------------------------------------------------------------------------------
def weights_file(args, outtype: str) -> Path:
    """The DiT GGUF of one type (written once; matrices in the type, the rest f32)."""
    from converters.gguf_io import Lazy, default_is_matmul, matmul_types, write_gguf
    from moss_tts.models.soundeffect_v2_dit import WanAudioConfig

    cfg = WanAudioConfig(**dit_config(args) | {"patch_size": (1,)})
    size = "tiny" if args.tiny else "real"
    out = Path(args.data) / f"dit-{size}-L{args.layers}-{outtype}.gguf"
    if not out.exists():
        out.parent.mkdir(parents=True, exist_ok=True)
        t0 = time.perf_counter()
        tensors = {n: Lazy(s, np.float32, lambda n=n, s=s: tensor_value(n, s))
                   for n, s in cfg.tensor_shapes().items()}
        # Conv1d patch_embedding [D, in, 1] is a matmul too; modulations [1, 6, D] are not
        write_gguf(out, tensors, {}, kind="bench", version=1,
                   type_for=matmul_types(outtype, lambda n, s: default_is_matmul(n, s) or
                                         n == "patch_embedding.weight"))
        print(f"{out}: written in {time.perf_counter() - t0:.0f} s", file=sys.stderr)
    return out


def run_ours(args) -> dict:
    from moss_tts.ggml import Weights, count_flops, get_backend
    from moss_tts.models.soundeffect_v2_dit import WanAudioConfig, WanAudioDiT

    cfg_d = dit_config(args)
    cfg = WanAudioConfig(**cfg_d | {"patch_size": tuple(cfg_d["patch_size"])})
    path = weights_file(args, args.type)
    backend = get_backend(None, args.threads)
    weights = Weights.load(path, backend)
    dit = WanAudioDiT(weights, cfg, backend)
    latent, context = dit_inputs(cfg_d, args.frames, context_rows(args))
    with count_flops() as work:
        dit.forward(latent, TIMESTEP, context)
    pair, velocity = timed(lambda: dit.forward(latent, TIMESTEP, context), args.repeats,
                           cold=False)
    single, _ = timed(lambda: dit.forward(latent[:1], TIMESTEP, context[:1]), args.repeats,
                      cold=True)
    short, _ = timed(lambda: dit.forward(latent[:, :args.short], TIMESTEP, context),
                     args.repeats, cold=True)
    if args.type == "f32":   # the cond item, for the comparison with the peer's
        np.save(velocity_file(args, "ours"), velocity[0])
    dit.close()
    weights.close()
    return {"pair": pair, "single": single, "short": short, "ggml_gflop": work.total / 1e9,
            "finite": bool(np.all(np.isfinite(velocity))),
            "weights_gb": path.stat().st_size / 1e9, "threads": backend.threads}


def run_step(args) -> dict:
    """Only the DiT forward of a batch of --batch items, cold then --repeats times (what
    --profile records under perf)."""
    from moss_tts.ggml import Weights, get_backend
    from moss_tts.models.soundeffect_v2_dit import WanAudioConfig, WanAudioDiT

    cfg_d = dit_config(args)
    backend = get_backend(None, args.threads)
    weights = Weights.load(weights_file(args, args.type), backend)
    dit = WanAudioDiT(weights, WanAudioConfig(**cfg_d | {"patch_size": (1,)}), backend)
    latent, context = dit_inputs(cfg_d, args.frames, context_rows(args))
    step, _ = timed(lambda: dit.forward(latent[:args.batch], TIMESTEP, context[:args.batch]),
                    args.repeats, cold=True)
    dit.close()
    weights.close()
    return {"step": step}


def profile(args) -> list[str]:
    """Where a step's cycles go (all threads, self time), the pair and one single pass of the
    first type, each under `perf` in its own worker."""
    from bench.harness import perf_top

    outtype = args.types.split(",")[0]
    out = []
    for batch in (2, 1):
        cmd = [sys.executable, str(Path(__file__).resolve().relative_to(ROOT)), "--worker",
               "step", "--type", outtype, "--batch", str(batch)] + worker_args(args)
        top = perf_top(cmd, Path(args.data) / f"soundeffect_v2-perf-b{batch}.data", n=16)
        out += [f"perf, ours {outtype}, batch {batch} ({args.layers} blocks, {args.frames} "
                f"frames, cold + {args.repeats} runs):", *top, ""]
    return out


def velocity_file(args, side: str) -> Path:
    return Path(args.data) / f"velocity-{side}-{'tiny' if args.tiny else 'real'}-L{args.layers}.npy"


def run_vae(args) -> dict:
    from moss_tts.ggml import TensorStore, count_flops, get_backend
    from moss_tts.models.soundeffect_v2 import VAE_CHUNK_FRAMES
    from moss_tts.models.soundeffect_v2_vae import DACConfig, DACDecoder, tensor_shapes

    cfg = DACConfig.from_kwargs(TINY_DAC if args.tiny else REAL_DAC)
    backend = get_backend(None, args.threads)
    store = TensorStore({n: tensor_value(n, s) for n, s in tensor_shapes(cfg).items()}, backend)
    vae = DACDecoder(store, cfg, backend)
    latent = np.random.default_rng(SEED).standard_normal((args.frames, cfg.latent_dim),
                                                         dtype=np.float32)
    with count_flops() as work:
        full, audio = timed(lambda: vae.decode(latent, chunk_frames=VAE_CHUNK_FRAMES),
                            args.repeats, cold=True)
    short, _ = timed(lambda: vae.decode(latent[:args.short], chunk_frames=VAE_CHUNK_FRAMES),
                     args.repeats, cold=False)
    vae.close()
    store.close()
    return {"vae": full, "vae_short": short,
            "vae_gflop": work.total / 1e9 / (args.repeats + 1),
            "samples": int(audio.size), "sample_rate": cfg.sample_rate,
            "finite": bool(np.all(np.isfinite(audio))), "threads": backend.threads}


# -- upstream (in the torch venv) -------------------------------------------------------------
def run_peer(args) -> dict:
    """Upstream's WanAudioModel in f32 (autocast off) on tensor_value's weights; a step is its
    two calls, cond then uncond, each a batch of one."""
    import torch

    from bench.soundeffect_v2_dit_upstream import COPY_DIR, FILES, SOUNDEFFECT_V2
    from bench.upstream_torch import copy_upstream, import_upstream

    torch.set_num_threads(args.threads)
    commit = copy_upstream(COPY_DIR, FILES, SOUNDEFFECT_V2, args.upstream_src)
    dit = import_upstream(COPY_DIR, "wan_audio_dit")
    cfg = dit_config(args)
    model = dit.WanAudioModel(**cfg | {"has_image_input": False, "vae_type": "dac"}).float().eval()
    with torch.no_grad():
        for name, p in model.state_dict().items():
            p.copy_(torch.from_numpy(tensor_value(name, p.shape)))
    latent, context = dit_inputs(cfg, args.frames, context_rows(args))
    x = torch.from_numpy(np.ascontiguousarray(latent[:1].transpose(0, 2, 1)))   # [1, C, F]
    ctx = [torch.from_numpy(context[i:i + 1]) for i in range(2)]
    t = torch.full((1,), TIMESTEP)

    def step():
        return [model(x, t, c) for c in ctx]

    with torch.inference_mode():
        pair, out = timed(step, args.repeats, cold=True)
        short, _ = timed(lambda: [model(x[:, :, :args.short], t, c) for c in ctx], args.repeats,
                         cold=True)
    cond = out[0][0].numpy().T                                                 # (F, C)
    np.save(velocity_file(args, "peer"), cond)
    return {"pair": pair, "short": short, "torch": torch.__version__,
            "threads": torch.get_num_threads(), "upstream_commit": commit,
            "finite": bool(np.all(np.isfinite(cond)))}


def worker(args) -> None:
    run = {"ours": run_ours, "vae": run_vae, "peer": run_peer, "step": run_step}[args.worker]
    out = run(args)
    # the driver measures again when other processes took > 10 % of the CPUs in any timing
    foreign = max(v["foreign"] for v in out.values() if isinstance(v, dict) and "foreign" in v)
    print(json.dumps(out | {"foreign": foreign, "peak_rss_gb": peak_rss_gb()}))


# -- the driver ------------------------------------------------------------------------------
def worker_args(args, **extra) -> list[str]:
    """The flags a worker needs, from the driver's."""
    out = ["--layers", str(args.layers), "--frames", str(args.frames), "--short", str(args.short),
           "--repeats", str(args.repeats), "--threads", str(args.threads), "--data", args.data]
    out += ["--tiny"] if args.tiny else []
    for k, v in extra.items():
        out += [f"--{k.replace('_', '-')}", str(v)] if v is not None else []
    return out


def measure_type(driver, args, outtype: str, probe) -> list[dict]:
    """Ours on one type; with the first type also the VAE and the peer (f32 on the same values)."""
    script = str(Path(__file__).resolve().relative_to(ROOT))
    runs = [("ours", outtype, [sys.executable, script, "--worker", "ours", "--type", outtype]
             + worker_args(args))]
    if outtype == args.types.split(",")[0]:
        if not args.no_vae:
            runs.append(("vae", "f32", [sys.executable, script, "--worker", "vae"]
                         + worker_args(args)))
        if not args.no_peer:
            runs.append(("upstream", "f32", [args.peer_python, script, "--worker", "peer"]
                         + worker_args(args, upstream_src=args.upstream_src)))
    rows = []
    for side, t, cmd in runs:
        rows.append({"type": t, "side": side} | driver.run(cmd))
        driver.say(json.dumps(rows[-1]))     # in the log as it comes: a cut run keeps it
    return rows


def summarize(args, rows: list[dict], peak: dict | None) -> dict:
    """The figures the report states, DiT times scaled to the full depth: per type the step, the
    single pass, the short step, GFLOP/s and % of the peak, upstream's step over ours, the
    velocity difference, and the full-generation estimates (steps × step + VAE)."""
    cfg, lc, k = dit_config(args), context_rows(args), layer_scale(args)
    full_cfg = cfg | {"num_layers": round(cfg["num_layers"] * k)}
    gflop = step_gflop(full_cfg, args.frames, lc, 2)
    measured = step_gflop(cfg, args.frames, lc, 2)      # the graph run (--layers blocks)
    best = (peak or {}).get("peak")
    vae = next((r for r in rows if r["side"] == "vae" and "error" not in r), {})
    peer = next((r for r in rows if r["side"] == "upstream" and "error" not in r), {})
    peer_s = peer.get("pair", {}).get("s", math.nan) * k
    vae_s = vae.get("vae", {}).get("s", math.nan)
    vae_short_s = vae.get("vae_short", {}).get("s", math.nan)
    out = {"gflop_step": gflop, "gflop_short": step_gflop(full_cfg, args.short, lc, 2),
           "gflop_measured": measured, "layers_measured": args.layers, "scale": k, "peak": best,
           "vae_s": vae_s, "vae_short_s": vae_short_s, "upstream_step_s": peer_s,
           "upstream_short_s": peer.get("short", {}).get("s", math.nan) * k, "types": {}}
    for r in rows:
        if r["side"] != "ours" or "error" in r:
            continue
        step, single = r["pair"]["s"] * k, r["single"]["s"] * k
        short = r["short"]["s"] * k
        out["types"][r["type"]] = {
            "step_s": step, "single_s": single, "pair_over_two_singles": step / (2 * single),
            "short_step_s": short, "gflops": measured / r["pair"]["s"],
            "of_peak": measured / r["pair"]["s"] / best if best else math.nan,
            "ggml_gflop": r["ggml_gflop"], "upstream_over_ours": peer_s / step,
            "generation_30s_s": args.steps * step + vae_s,
            "generation_short_s": args.steps * short + vae_short_s,
            "foreign": r["pair"]["foreign"], "peak_rss_gb": r["peak_rss_gb"],
            "weights_gb": r["weights_gb"], "finite": r["finite"]}
    ours_v, peer_v = (velocity_file(args, s) for s in ("ours", "peer"))
    if peer and ours_v.exists() and peer_v.exists():
        a, b = np.load(ours_v), np.load(peer_v)
        out["velocity_max_diff"] = float(np.abs(a - b).max())
        out["velocity_max_abs"] = float(np.abs(b).max())
    return out


def type_table(args, s: dict) -> str:
    from bench.common import table

    lines = [{"type": t, "step s": fmt(v["step_s"]), "single s": fmt(v["single_s"]),
              "pair / 2 singles": fmt(v["pair_over_two_singles"]),
              "GFLOP/s": fmt(v["gflops"], "{:.0f}"),
              "% of peak": fmt(100 * v["of_peak"], "{:.0f}"),
              f"{args.short}-frame step s": fmt(v["short_step_s"]),
              "upstream / this": fmt(v["upstream_over_ours"]),
              "other load %": fmt(100 * v["foreign"], "{:.0f}"),
              "peak RSS GB": fmt(v["peak_rss_gb"]), "weights GB": fmt(v["weights_gb"])}
             for t, v in s["types"].items()]
    return table(lines, list(lines[0])) if lines else "(no result)"


def goal_lines(s: dict) -> list[str]:
    """The issue's three goals, per type: met or not."""
    def said(ok: bool) -> str:
        return "met" if ok else "NOT met"

    out = []
    for t, v in s["types"].items():
        out.append(f"goals, {t}: upstream/this {fmt(v['upstream_over_ours'])} ≥ 1.5: "
                   f"{said(v['upstream_over_ours'] >= 1.5)}; {100 * v['of_peak']:.0f} % ≥ 60 % "
                   f"of the GEMM peak: {said(v['of_peak'] >= 0.6)}; pair / 2 singles "
                   f"{v['pair_over_two_singles']:.2f} < 1: {said(v['pair_over_two_singles'] < 1)}")
    return out


def report(args, s: dict, rows: list[dict]) -> str:
    secs, short_secs = args.frames / LATENT_HZ, args.short / LATENT_HZ
    depth = round(args.layers * s["scale"])
    scaled = "" if s["scale"] == 1 else (f" (measured on {s['layers_measured']} blocks, scaled "
                                         f"×{s['scale']:g} to {depth})")
    counted = ", ".join(f"{t} {v['ggml_gflop']:.0f}" for t, v in s["types"].items())
    peer = (f"upstream PyTorch f32 (two calls per step): {fmt(s['upstream_step_s'])} s per step, "
            f"{fmt(s['upstream_short_s'])} s at {args.short} frames")
    if "velocity_max_diff" in s:
        peer += (f"; its cond velocity vs ours f32: max |diff| {s['velocity_max_diff']:.2e} of "
                 f"max |v| {s['velocity_max_abs']:.2f}")
    estimate = "; ".join(
        f"{t}: {v['generation_30s_s'] / 60:.1f} min for {secs:g} s, "
        f"{v['generation_short_s'] / 60:.1f} min denoising only {short_secs:g} s "
        f"(×{v['generation_30s_s'] / v['generation_short_s']:.1f})" for t, v in s["types"].items())
    out = [f"DiT step = the CFG pair as one batch of 2, {args.frames} frames, "
           f"{context_rows(args)} context rows{scaled}; {s['gflop_step']:.0f} GFLOP counted from "
           f"the dims at {depth} blocks, {s['gflop_measured']:.0f} in the graph run (ggml's own "
           f"count of it: {counted}); medians of {args.repeats} warm runs",
           type_table(args, s), peer,
           f"VAE decode of {secs:g} s ({args.frames} frames, chunks of 100): {fmt(s['vae_s'])} s; "
           f"of {args.short} frames: {fmt(s['vae_short_s'])} s",
           f"estimate, {args.steps} steps + VAE (text encoder not included): {estimate}",
           "\n".join(goal_lines(s))]
    errors = [f"{r['side']} {r['type']}: {r['error']}" for r in rows if "error" in r]
    return "\n\n".join(out + (["errors: " + "; ".join(errors)] if errors else []))


def parse_args(argv):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--types", default="f32,f16,q8_0", help="weight types, comma-separated")
    ap.add_argument("--layers", type=int, default=None, help=f"DiT blocks run (default "
                    f"{FULL_LAYERS}; 2 with --tiny); times are scaled to {FULL_LAYERS}")
    ap.add_argument("--frames", type=int, default=None, help="latent frames (default 1500 = 30 s)")
    ap.add_argument("--short", type=int, default=None,
                    help="frames of the short step (default 250 = 5 s)")
    ap.add_argument("--steps", type=int, default=100, help="steps in the generation estimate")
    ap.add_argument("--repeats", type=int, default=2, help="warm runs per measurement")
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--data", default=os.environ.get(
        "MOSS_TTS_BENCH_DATA", str(ROOT / "bench" / "results" / "soundeffect_v2_data")),
        help="where the random-weight files are written once and reused")
    ap.add_argument("--no-peer", action="store_true", help="skip upstream PyTorch")
    ap.add_argument("--no-vae", action="store_true", help="skip the VAE decode")
    ap.add_argument("--peer-python", default=os.environ.get("MOSS_TTS_PEER_PYTHON", sys.executable),
                    help="a python with torch and einops for the peer ($MOSS_TTS_PEER_PYTHON)")
    ap.add_argument("--upstream-src", help="upstream OpenMOSS/MOSS-TTS checkout or bare mirror "
                    "(else $MOSS_TTS_UPSTREAM_SOUNDEFFECT_V2)")
    ap.add_argument("--json", nargs="?", const=str(ROOT / "bench" / "results" /
                                                  "soundeffect_v2.json"),
                    help="also write the results as JSON (default file under bench/results/)")
    add_no_wait(ap)
    ap.add_argument("--tiny", action="store_true", help="small dims: check the script runs")
    ap.add_argument("--profile", action="store_true",
                    help="only `perf` profiles of the pair and of a single pass (first type)")
    ap.add_argument("--worker", choices=["ours", "vae", "peer", "step"], help=argparse.SUPPRESS)
    ap.add_argument("--batch", type=int, default=2, help=argparse.SUPPRESS)
    ap.add_argument("--type", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    args.layers = args.layers or (TINY_DIT if args.tiny else REAL_DIT)["num_layers"]
    args.frames = args.frames or (20 if args.tiny else 1500)
    args.short = min(args.frames, args.short or (8 if args.tiny else 250))
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.worker:
        worker(args)
        return 0
    from bench.harness import measure_types
    from moss_tts.ggml import default_threads

    args.threads = args.threads or default_threads()
    if args.profile:
        print("\n".join(profile(args)))
        return 0
    t0 = time.perf_counter()
    driver, rows = measure_types(args, __file__, "soundeffect_v2-bench.log", measure_type,
                                 probe_bytes=1 << 20)
    s = summarize(args, rows, driver.peak)
    driver.say(report(args, s, rows))
    from bench.harness import report_footer
    driver.say("\n".join(report_footer(driver, time.perf_counter() - t0)))
    results = {"summary": s, "rows": rows}
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(results, indent=1) + "\n")
    end_report(driver, [results])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
