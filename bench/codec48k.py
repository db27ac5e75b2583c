"""The 48 kHz stereo MOSS audio codecs at their REAL dimensions, random weights:
MOSS-Audio-Tokenizer-Nano (docs/upstream-notes.md §codecs-3: 22 M params, 16 codebooks) and
MOSS-Audio-Tokenizer-v2 (§codecs-4: 2.12 B params, 32 codebooks). Nano: encode / decode of 10 s
stereo (f32, f16, q8_0), exact streaming decode one frame per push, a chunk_seconds sweep
(interleaved in one process). v2: decode of 10 s (f32, f16, q8_0). Peak RSS per measurement (each
runs in a fresh subprocess).

    python bench/codec48k.py [--variants nano,v2] [--types f32,f16,q8_0] [--v2-types f32,f16,q8_0]
                             [--chunks 1,2,5,10] [--runs 3] [--threads 2] [--v2-encode]
                             [--v2-chunks 2,5] [--perf] [--upstream PY [--upstream-src DIR]]

With --upstream (the python of a venv with torch + transformers; torch is never a dependency of
the package), upstream's PyTorch Nano codec (f32, one pass) encodes and decodes the same 10 s on
the same checkpoint in bench/upstream_codec.py --variant nano; the report puts it beside ours
(upstream ÷ ours) with the parity of codes and decoded audio. Its modeling code comes from
--upstream-src DIR or $MOSS_TTS_UPSTREAM_NANO_CODEC (bench/harness.py NANO_CODEC says which
checkouts work) and is copied at run time into bench/results/upstream_nano_codec/ (gitignored).

First run writes the random checkpoints (upstream Nano/v2 key layout: `self_attn.in_proj`,
`ffn.0/2`, both block projections in every stage, weight-norm pairs in the quantizer) into
bench/results/codec48k/ (gitignored; v2: ~8.5 GB f32 in ≤ 1 GiB shards written tensor by tensor,
so generation RAM stays bounded), converts them once per type with `converters.codec.convert`,
and reuses everything afterwards. The shared machine is checked before every timing run: while
another `bench/` process runs (e.g. bench/codec.py), or other processes use > 15 % of the CPUs,
we wait; what was seen is reported ("other load").
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shlex
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.codec import enc_dec_rates, run_summary, work_line
from bench.codec_checkpoint import INDEX_FILE, NANO_V2, write_sharded
from bench.codec_checkpoint import checkpoint_plan as plan_of
from bench.common import table
from bench.harness import (NANO_CODEC, Contention, Driver, add_no_wait, counting,
                           fmt, gflop_per_call, measure_peak, median, other_load, peak_rss_gb,
                           perf_top, publish, report_footer, rtf, start_line, timed_convert,
                           timed_runs)
from bench.parity import codec_parity_lines

WORK = ROOT / "bench" / "results" / "codec48k"
SECONDS = 10.0
SAMPLE_RATE = 48000
STREAM_FRAMES = 160          # 12.8 s: past the longest window (10 s at the 50 Hz decoder stage)
FULL_WINDOW_FRAMES = 126
PUSH_INDEX = (1, 9, 24, 49, 99, 124, 159)
# docs/upstream-notes.md §codecs-3.1 / §codecs-4.4: parameter and tensor counts of the real
# checkpoints
EXPECTED = {"nano": (21_969_664, 374), "v2": (2_123_701_248, 2094)}
# goals from the issue (Nano, f32, 10 s), and its upstream PyTorch f32 figures (another
# machine; context only: --upstream measures encode and decode here, not streaming)
NANO_GOALS = {"decode_s": 0.6, "encode_s": 0.6, "stream_ms": 5.0}
NANO_ISSUE = {"decode_s": 1.60, "encode_s": 1.75, "stream_ms": 41.0}


# --- the real configs -------------------------------------------------------------------------


def _configs():
    from fixtures.make_codec import tiny_nano_config, tiny_v2_config
    return tiny_nano_config(), tiny_v2_config()


def _tf(template: dict, din, d, dout, heads, layers, ffn, seconds) -> dict:
    return dict(template, input_dimension=din, d_model=d, output_dimension=dout, num_heads=heads,
                num_layers=layers, dim_feedforward=ffn, context_duration=float(seconds))


def _patch(h: int) -> dict:
    return {"module_type": "PatchedPretransform", "patch_size": h}


def _real(tiny: dict, encoder, decoder, n_q: int) -> dict:
    cfg = json.loads(json.dumps(tiny))
    cfg.update(encoder_kwargs=encoder, decoder_kwargs=decoder, code_dim=768, downsample_rate=3840,
               sample_rate=SAMPLE_RATE, sampling_rate=SAMPLE_RATE,
               causal_transformer_context_duration=10.0,
               reversed_decoder_kwargs=[dict(m) for m in encoder])
    cfg["quantizer_kwargs"] = dict(cfg["quantizer_kwargs"], codebook_dim=8, codebook_size=1024,
                                   input_dim=768, rvq_dim=512, output_dim=768, num_quantizers=n_q)
    return cfg


def nano_real_config() -> dict:
    """docs/upstream-notes.md §codecs-3.1-3.2: d_model 256, 4 heads, ffn 1024, layers 4,2,2,4,
    contexts enc 4/6/8/10 s, dec 10/8/6/4 s, 16 codebooks, 48 kHz stereo, downsample 3840, patches
    240,2,2,2,4."""
    tiny, _ = _configs()
    t = next(kw for kw in tiny["encoder_kwargs"] if kw["module_type"] == "Transformer")
    enc = [_patch(240), _tf(t, 240, 256, 384, 4, 4, 1024, 4), _patch(2),
           _tf(t, 768, 256, 384, 4, 2, 1024, 6), _patch(2), _tf(t, 768, 256, 384, 4, 2, 1024, 8),
           _patch(2), _tf(t, 768, 256, 192, 4, 4, 1024, 10), _patch(4)]
    dec = [_patch(4), _tf(t, 192, 256, 768, 4, 4, 1024, 10), _patch(2),
           _tf(t, 384, 256, 768, 4, 2, 1024, 8), _patch(2), _tf(t, 384, 256, 768, 4, 2, 1024, 6),
           _patch(2), _tf(t, 384, 256, 240, 4, 4, 1024, 4), _patch(240)]
    return _real(tiny, enc, dec, 16)


def v2_real_config() -> dict:
    """docs/upstream-notes.md §codecs-4.1-4.2: 6 transformer stages per tower (12 × d768/12
    heads/ffn 3072 at 400…25 Hz, 32 × d1280/20 heads/ffn 5120 at 12.5 Hz), contexts 1,2,4,8,10,10 s,
    32 codebooks."""
    _, tiny = _configs()
    t = next(kw for kw in tiny["encoder_kwargs"] if kw["module_type"] == "Transformer")
    enc = [_patch(240), _tf(t, 240, 768, 384, 12, 12, 3072, 1), _patch(2),
           _tf(t, 768, 768, 384, 12, 12, 3072, 2), _patch(2), _tf(t, 768, 768, 384, 12, 12, 3072, 4),
           _patch(2), _tf(t, 768, 768, 384, 12, 12, 3072, 8), _patch(2),
           _tf(t, 768, 768, 640, 12, 12, 3072, 10), _patch(2),
           _tf(t, 1280, 1280, 768, 20, 32, 5120, 10)]
    dec = [_tf(t, 768, 1280, 1280, 20, 32, 5120, 10), _patch(2),
           _tf(t, 640, 768, 768, 12, 12, 3072, 10), _patch(2), _tf(t, 384, 768, 768, 12, 12, 3072, 8),
           _patch(2), _tf(t, 384, 768, 768, 12, 12, 3072, 4), _patch(2),
           _tf(t, 384, 768, 768, 12, 12, 3072, 2), _patch(2), _tf(t, 384, 768, 240, 12, 12, 3072, 1),
           _patch(240)]
    return _real(tiny, enc, dec, 32)


REAL_CONFIGS = {"nano": nano_real_config, "v2": v2_real_config}


# --- random checkpoints -----------------------------------------------------------------------


def checkpoint_plan(config: dict) -> list[tuple[str, tuple, str, int]]:
    """Every tensor of the Nano/v2 layout as (name, shape, init, fan_in), in a fixed order (the
    names and shapes fixtures/make_codec.py's make_tiny_*_state writes; checked on the tiny v2
    config by `check_plan`)."""
    return plan_of(config, NANO_V2)


def check_plan() -> None:
    """The plan has exactly the fixture's names and shapes (tiny v2 and tiny Nano configs)."""
    from fixtures.make_codec import (
        make_tiny_nano_state,
        make_tiny_v2_state,
        tiny_nano_config,
        tiny_v2_config,
    )
    for cfg, make in ((tiny_v2_config(), make_tiny_v2_state), (tiny_nano_config(), make_tiny_nano_state)):
        want = {n: a.shape for n, a in make(cfg).items()}
        got = {n: s for n, s, _, _ in checkpoint_plan(cfg)}
        if want != got:
            raise SystemExit(f"checkpoint plan differs from fixtures/make_codec.py: "
                             f"{sorted(set(want) ^ set(got))[:5]}")


def ckpt_dir(variant: str) -> Path:
    return WORK / f"{variant}_checkpoint"


def gguf_path(variant: str, outtype: str) -> Path:
    return WORK / f"{variant}-{outtype}.gguf"


def ensure_gguf(variant: str, outtype: str, *, log=print) -> Path:
    """The real-dims GGUF of `variant`, built (checkpoint, then convert) when missing, so another
    driver that needs it (bench/nano.py's first audio) does not depend on this one having run."""
    path = gguf_path(variant, outtype)
    if not path.exists():
        from converters.codec import convert

        make_checkpoint(variant, log=log)
        log(f"  converting the {variant} codec checkpoint to {path.name} ...")
        convert(str(ckpt_dir(variant)), path, outtype=outtype)
    return path


def make_checkpoint(variant: str, *, seed: int = 0, log=print) -> Path:
    """config.json + safetensors at the real dims. Nano: fixtures' make_tiny_nano_state on the
    real config (22 M params, one file). v2: tensor by tensor (bench/codec_checkpoint.py) into
    ≤ 1 GiB shards + index, one shard in memory at a time. Reused when present."""
    from safetensors.numpy import save_file

    out = ckpt_dir(variant)
    config = REAL_CONFIGS[variant]()
    plan = checkpoint_plan(config)
    n_params = sum(math.prod(s) for _, s, _, _ in plan)
    if (n_params, len(plan)) != EXPECTED[variant]:
        raise SystemExit(f"{variant}: plan has {n_params} params / {len(plan)} tensors, codecs.md "
                         f"says {EXPECTED[variant]}")
    done = out / ("model.safetensors" if variant == "nano" else INDEX_FILE)
    if done.exists():
        return out
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    if variant == "nano":
        from fixtures.make_codec import make_tiny_nano_state
        state = make_tiny_nano_state(config, seed=seed)
        if {n: a.shape for n, a in state.items()} != {n: s for n, s, _, _ in plan}:
            raise SystemExit("nano: fixture state and plan disagree")
        (out / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
        save_file(state, str(out / "model.safetensors"), metadata={"format": "pt"})
        log(f"  nano checkpoint: {n_params / 1e6:.1f} M params ({time.perf_counter() - t0:.0f} s)")
        return out
    return write_sharded(out, config, plan, seed=seed, log=log)


def make_inputs(n_q: int, seconds: float = SECONDS) -> dict:
    """audio48k.npy: stereo [n, 2] sines + noise (different per channel, peak ≈ 0.3);
    codes{n_q}.npy: random codes [n_q, frames]."""
    WORK.mkdir(parents=True, exist_ok=True)
    audio_p, codes_p = WORK / "audio48k.npy", WORK / f"codes{n_q}.npy"
    n = round(seconds * SAMPLE_RATE)
    if not audio_p.exists():
        rng = np.random.default_rng(1)
        t = np.arange(n) / SAMPLE_RATE
        chans = []
        for ch, base in enumerate((220.0, 330.0)):
            x = sum(a * np.sin(2 * np.pi * f * t + ph) for a, f, ph in
                    ((0.08, base, ch), (0.05, 2.4 * base, 1.0), (0.03, 1760.0, 2.0), (0.02, 7100.0, 0.5)))
            chans.append(x * (0.6 + 0.4 * np.sin(2 * np.pi * 0.7 * t)) + 0.03 * rng.standard_normal(n))
        np.save(audio_p, np.stack(chans, axis=1).astype(np.float32))
    if not codes_p.exists():
        rng = np.random.default_rng(2)
        np.save(codes_p, rng.integers(0, 1024, size=(n_q, n // 3840), dtype=np.int32))
    stream_p = WORK / f"codes{n_q}_stream.npy"
    if not stream_p.exists():
        rng = np.random.default_rng(3)
        np.save(stream_p, rng.integers(0, 1024, size=(n_q, STREAM_FRAMES), dtype=np.int32))
    return {"audio": audio_p, "codes": codes_p}


# --- workers (each in its own process) ------------------------------------------------------------


def _load(args):
    from moss_tts.codec import Codec

    t0 = time.perf_counter()
    codec = Codec.load(gguf_path(args.variant, args.type), threads=args.threads,
                       chunk_seconds=args.chunk)
    return codec, time.perf_counter() - t0


def worker_convert(args) -> dict:
    from converters.codec import convert

    return timed_convert(convert, ckpt_dir(args.variant), gguf_path(args.variant, args.type),
                         args.type)


def instrument() -> dict:
    """Seconds spent (cumulative) in ggml compute, Graph.run, graph building and the host side
    of a chunk (TowerState.advance: ring slots + window masks); bench-only wrappers."""
    from moss_tts.codec import codec as codec_mod
    from moss_tts.codec import tower
    from moss_tts.ggml.graph import Graph

    acc = {"compute": 0.0, "run": 0.0, "build": 0.0, "advance": 0.0, "mask": 0.0}

    def wrap(cls, name, key):
        orig = getattr(cls, name)

        def wrapped(self, *a, **kw):
            t0 = time.perf_counter()
            try:
                return orig(self, *a, **kw)
            finally:
                acc[key] += time.perf_counter() - t0
        setattr(cls, name, wrapped)

    from moss_tts.nn import KVCache
    wrap(Graph, "compute", "compute")
    wrap(Graph, "run", "run")
    wrap(codec_mod._TowerRunner, "_build", "build")
    wrap(tower.TowerState, "advance", "advance")
    wrap(KVCache, "mask", "mask")
    return acc


def _timed_split(acc, fn, runs):
    """timed_runs plus the warm-median split compute / host (advance, of which masks) /
    Graph.run − compute / build, in ms per call."""
    splits = []

    def one(p):
        before = dict(acc)
        out = fn(p)
        splits.append({k: 1e3 * (acc[k] - before[k]) for k in acc})
        return out

    totals, chunks, foreign, out = timed_runs(one, runs)
    warm = splits[1:] or splits
    split = {k: median([s[k] for s in warm]) for k in acc}
    split["run_minus_compute"] = median([s["run"] - s["compute"] for s in warm])
    return totals, chunks, foreign, out, split


def worker_encode(args) -> dict:
    acc = instrument()
    codec, load_s = _load(args)
    audio = np.load(WORK / "audio48k.npy")
    with counting() as work:
        totals, chunks, foreign, codes, split = _timed_split(
            acc, lambda p: codec.encode(audio, SAMPLE_RATE, progress=p), args.runs)
    if args.save:
        np.save(WORK / f"{args.variant}_codes_ggml_{args.type}.npy", codes)
    out = run_summary(load_s, totals, chunks, foreign, codec, "encoder")
    out["frames"] = int(codes.shape[1])
    out["split_ms"] = split
    out["gflop"] = gflop_per_call(work, len(totals))
    return out


def worker_decode(args) -> dict:
    acc = instrument()
    codec, load_s = _load(args)
    codes = np.load(WORK / f"codes{codec.n_quantizers}.npy")
    with counting() as work:
        totals, chunks, foreign, audio, split = _timed_split(
            acc, lambda p: codec.decode(codes, progress=p), args.runs)
    if args.save:
        np.save(WORK / f"{args.variant}_audio_ggml_{args.type}.npy", audio)
    out = run_summary(load_s, totals, chunks, foreign, codec, "decoder")
    out["split_ms"] = split
    out["gflop"] = gflop_per_call(work, len(totals))
    out["samples"] = list(audio.shape)
    out["rms"] = float(np.sqrt(np.mean(audio.astype(np.float64) ** 2)))
    return out


def worker_stream(args) -> dict:
    """StreamDecoder.push of `--push` frames at a time (default 1; first push = graph build,
    reported apart); medians per frame; the concatenation is checked against decode()."""
    acc = instrument()
    codec, load_s = _load(args)
    codes = np.load(WORK / f"codes{codec.n_quantizers}_stream.npy")[:, :STREAM_FRAMES]
    runs, split = [], []
    c = Contention()
    for _ in range(max(1, args.runs)):
        times, parts, sp = [], [], []
        with codec.stream_decoder() as sd:
            for t in range(0, codes.shape[1], args.push):
                before = dict(acc)
                t0 = time.perf_counter()
                parts.append(sd.push(codes[:, t:t + args.push]))
                times += [(time.perf_counter() - t0) / args.push] * args.push
                sp.append({k: 1e3 * (acc[k] - before[k]) for k in acc})
            r = sd._runner
            buf_mib = r.allocator.buffer_size / 2**20
            kv_mib = sum(x.nbytes for x in r.state.caches.values()) / 2**20
        runs.append(times)
        split.append(sp)
    foreign = c.share()
    streamed = np.concatenate(parts)
    whole = codec.decode(codes)
    diff = float(np.max(np.abs(streamed - whole)) / (np.sqrt(np.mean(whole ** 2)) + 1e-30))
    steady = [t for times in runs for t in times[1:]]
    # once every stage's window is full (the 50 Hz stage needs 10 s = 125 frames)
    full = [t for times in runs for t in times[FULL_WINDOW_FRAMES:]]
    full_split = {k: median([sp[i][k] for sp in split for i in range(FULL_WINDOW_FRAMES, len(sp))])
                  for k in acc}
    # by push index: the cost grows while the windows fill
    by_index = [1e3 * median([times[i] for times in runs]) for i in range(codes.shape[1])]
    # a 10 s utterance: the mean over its frames (the windows fill during it), later runs
    ten_s = int(round(SECONDS * codec.config.frame_rate))
    later = runs[1:] or runs
    return {"load_s": load_s, "push": args.push, "first_ms": 1e3 * runs[0][0],
            "mean_10s_ms": 1e3 * float(np.mean([t[:ten_s] for t in later])),
            "first_ms_later_sessions": [1e3 * t[0] for t in runs[1:]],
            "median_ms": 1e3 * median(steady), "p90_ms": 1e3 * float(np.percentile(steady, 90)),
            "full_window_ms": 1e3 * median(full),
            "full_window_p90_ms": 1e3 * float(np.percentile(full, 90)),
            "full_window_split_ms": full_split,
            "ms_push_by_index": {i + 1: by_index[i] for i in PUSH_INDEX if i < len(by_index)},
            "frame_ms": 1e3 / codec.config.frame_rate, "stream_vs_decode_rel": diff,
            "foreign": foreign, "threads": args.threads, "peak_rss_gb": peak_rss_gb(),
            "compute_buffer_mib": buf_mib, "kv_cache_mib": kv_mib}


def worker_sweep(args) -> dict:
    """chunk_seconds sweep in ONE process, runs interleaved across the chunk values (this
    machine's speed drifts ±20 % over minutes, so separate processes compare badly): per value
    the warm median of encode and decode, their compute / host split, KV cache size."""
    from moss_tts.codec import Codec

    acc = instrument()
    chunks = [float(c) for c in args.chunks.split(",")]
    codecs = {c: Codec.load(gguf_path(args.variant, args.type), threads=args.threads, chunk_seconds=c)
              for c in chunks}
    audio = np.load(WORK / "audio48k.npy")
    codes = np.load(WORK / f"codes{codecs[chunks[0]].n_quantizers}.npy")
    ops_ = {"encode": lambda cd: cd.encode(audio, SAMPLE_RATE), "decode": lambda cd: cd.decode(codes)}
    times = {(c, w): [] for c in chunks for w in ops_}
    splits = {(c, w): [] for c in chunks for w in ops_}
    for c in chunks:                       # cold calls: graph builds, first touch
        for w, fn in ops_.items():
            fn(codecs[c])
    con = Contention()
    for _ in range(args.runs):
        for c in chunks:
            for w, fn in ops_.items():
                before = dict(acc)
                t0 = time.perf_counter()
                fn(codecs[c])
                times[(c, w)].append(time.perf_counter() - t0)
                splits[(c, w)].append({k: 1e3 * (acc[k] - before[k]) for k in acc})
    out = {"foreign": con.share(), "peak_rss_gb": peak_rss_gb(), "runs": args.runs, "rows": []}
    for c in chunks:
        kv = {t: sum(x.nbytes for x in r.state.caches.values()) / 2**20
              for t, r in codecs[c]._runners.items()}
        for w in ops_:
            sp = splits[(c, w)]
            out["rows"].append({"chunk": c, "op": w, "median_s": median(times[(c, w)]),
                                "all_s": times[(c, w)],
                                "compute_ms": median([x["compute"] for x in sp]),
                                "host_ms": median([x["advance"] for x in sp]),
                                "kv_mib": kv.get("encoder" if w == "encode" else "decoder")})
    return out


WORKERS = {"convert": worker_convert, "encode": worker_encode, "decode": worker_decode,
           "stream": worker_stream, "sweep": worker_sweep}


def worker_loop(args) -> dict:
    """For perf: `runs` calls of decode (or encode, or a 160-frame stream) after one warm call."""
    codec, _ = _load(args)
    if args.op == "stream":
        codes = np.load(WORK / f"codes{codec.n_quantizers}_stream.npy")
        for _ in range(args.runs):
            with codec.stream_decoder() as sd:
                for t in range(codes.shape[1]):
                    sd.push(codes[:, t:t + 1])
        return {}
    codes = np.load(WORK / f"codes{codec.n_quantizers}.npy")
    audio = np.load(WORK / "audio48k.npy")
    fn = (lambda: codec.decode(codes)) if args.op == "decode" else (lambda: codec.encode(audio, SAMPLE_RATE))
    fn()
    for _ in range(args.runs):
        fn()
    return {}


WORKERS["loop"] = worker_loop


# --- driver -----------------------------------------------------------------------------------



def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--variants", default="nano,v2")
    ap.add_argument("--types", default="f32,f16,q8_0", help="Nano types")
    ap.add_argument("--v2-types", default="f32,f16,q8_0")
    ap.add_argument("--chunks", default="1,2,5,10", help="chunk_seconds sweep (Nano, every type; one process, interleaved)")
    ap.add_argument("--v2-chunks", default="", help="chunk_seconds sweep for v2 decode (f16)")
    ap.add_argument("--v2-encode", action="store_true", help="also time v2 encode")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    add_no_wait(ap)
    ap.add_argument("--upstream", help="python of a venv with torch + transformers: also time "
                    "upstream's PyTorch Nano codec (f32) on the same checkpoint and inputs")
    ap.add_argument("--upstream-src", default=None,
                    help=f"upstream MOSS-Audio-Tokenizer-Nano checkout (default ${NANO_CODEC.env})")
    ap.add_argument("--save", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--worker", choices=sorted(WORKERS), help=argparse.SUPPRESS)
    ap.add_argument("--variant", default="nano", help=argparse.SUPPRESS)
    ap.add_argument("--type", default="f32", help=argparse.SUPPRESS)
    ap.add_argument("--chunk", type=float, default=None, help=argparse.SUPPRESS)
    ap.add_argument("--op", default="decode", help=argparse.SUPPRESS)
    ap.add_argument("--push", type=int, default=1, help=argparse.SUPPRESS)
    ap.add_argument("--perf", action="store_true",
                    help="also attribute Nano f32 decode and streaming with `perf record` (top symbols)")
    args = ap.parse_args(argv)
    if args.worker:
        if args.chunk is None:
            args.chunk = NANO_DEFAULT_CHUNK
        print(json.dumps(WORKERS[args.worker](args)))
        return 0
    return drive(args)


# the package's default for the 48 kHz codecs: 1000 positions of their 400 Hz stage
# (moss_tts.codec.codec.default_chunk_seconds)
NANO_DEFAULT_CHUNK = 2.5


def drive(args) -> int:

    WORK.mkdir(parents=True, exist_ok=True)
    d = Driver(args, WORK / "log.txt", script=Path(__file__))
    default_chunk = NANO_DEFAULT_CHUNK
    d.say(start_line("bench/codec48k.py"))
    variants = [v for v in args.variants.split(",") if v]
    types = {"nano": [t for t in args.types.split(",") if t],
             "v2": [t for t in args.v2_types.split(",") if t]}
    check_plan()
    t_start = time.perf_counter()
    conv, ckpt_gb = {}, {}
    for v in variants:
        if v == "v2" and not (ckpt_dir(v) / INDEX_FILE).exists():
            st = os.statvfs(WORK)
            free = st.f_bavail * st.f_frsize
            if free < 30e9:
                d.say(f"only {free / 1e9:.0f} GB free: v2 needs ~8.5 GB checkpoint + ~15 GB of GGUFs")
                return 1
            d.say(f"writing the random v2 checkpoint ({free / 1e9:.0f} GB free) ...")
        make_checkpoint(v, log=d.say)
        ckpt_gb[v] = sum(p.stat().st_size for p in ckpt_dir(v).glob("*.safetensors")) / 1e9
        for t in types[v]:
            if not gguf_path(v, t).exists():
                d.say(f"converting {v} to {t} ...")
                conv[(v, t)] = d.worker("convert", timing=False, variant=v, type=t)
                d.say(f"  {v} {t}: {json.dumps(conv[(v, t)])}")
    make_inputs(16)
    make_inputs(32)
    for stale in [*WORK.glob("nano_*_upstream*.npy"), *WORK.glob("nano_*_ggml_*.npy")]:
        stale.unlink()                # parity only between outputs of this run

    res: dict = {}
    common = {"threads": args.threads, "runs": args.runs}
    d.say(f"peak: {json.dumps(measure_peak(d, args.threads))}")
    if "nano" in variants:
        for t in types["nano"]:
            for what in ("encode", "decode", "stream"):
                r = d.worker(what, variant="nano", type=t, save=what != "stream", **common)
                res[("nano", t, what)] = r
                d.say(f"nano {t} {what}: {json.dumps(r)}")
        if args.upstream:
            for what in ("encode", "decode"):
                r = d.run(upstream_cmd(args, what))
                res[("nano", "upstream", what)] = r
                d.say(f"nano upstream {what}: {json.dumps(r)}")
        r = d.worker("stream", variant="nano", type="f32", threads=1, runs=args.runs)
        res[("nano", "f32", "stream1t")] = r
        d.say(f"nano f32 stream (1 thread): {json.dumps(r)}")
        for push in (2, 8):
            r = d.worker("stream", variant="nano", type="f32", push=push, **common)
            res[("nano", "f32", f"stream_push{push}")] = r
            d.say(f"nano f32 stream, {push} frames per push: {json.dumps(r)}")
        if args.perf:
            for op, runs in (("decode", 3), ("stream", 1)):
                cmd = [sys.executable, str(Path(__file__).resolve().relative_to(ROOT)), "--worker",
                       "loop", "--variant", "nano", "--type", "f32", "--op", op, "--runs", str(runs),
                       "--threads", str(args.threads)]
                d.quiet.wait()
                d.commands.append("perf record -F 2000 -g -- " + " ".join(shlex.quote(c) for c in cmd))
                res[("nano", "f32", "perf_" + op)] = perf_top(cmd, WORK / f"perf-nano-{op}.data")
                d.say(f"perf nano f32 {op}:\n" + "\n".join(res[("nano", "f32", "perf_" + op)]))
        for t in types["nano"]:
            r = d.worker("sweep", variant="nano", type=t, chunks=args.chunks, threads=args.threads,
                         runs=max(3, args.runs))
            res[("nano", t, "sweep")] = r
            d.say(f"sweep nano {t}: {json.dumps(r)}")
    if "v2" in variants:
        v2runs = max(1, args.runs - 1)
        for t in types["v2"]:
            r = d.worker("decode", variant="v2", type=t, threads=args.threads, runs=v2runs)
            res[("v2", t, "decode")] = r
            d.say(f"v2 {t} decode: {json.dumps(r)}")
            if args.v2_encode:
                r = d.worker("encode", variant="v2", type=t, threads=args.threads, runs=v2runs)
                res[("v2", t, "encode")] = r
                d.say(f"v2 {t} encode: {json.dumps(r)}")
        for c in [float(c) for c in args.v2_chunks.split(",") if c]:
            key = ("v2", "f16", "decode", c)
            res[key] = d.worker("decode", variant="v2", type="f16", chunk=c, threads=args.threads,
                                runs=v2runs)
            d.say(f"v2 f16 decode chunk {c:g}: {fmt(res[key].get('median_s'))} s")
    measure_peak(d, args.threads)   # again: the best of the probes is the peak
    report = render(args, variants, types, res, conv, ckpt_gb, d, default_chunk,
                    time.perf_counter() - t_start)
    publish(d, report, WORK / "report.md")
    return 0


def upstream_cmd(args, what: str) -> list[str]:
    """bench/upstream_codec.py (variant nano) in the torch interpreter: encode or decode of the
    same inputs with the same checkpoint, threads and runs."""
    cmd = [args.upstream, "bench/upstream_codec.py", "--variant", "nano", "--mode", what,
           "--ckpt", str(ckpt_dir("nano").relative_to(ROOT)), "--work", str(WORK.relative_to(ROOT)),
           "--threads", str(args.threads), "--runs", str(args.runs)]
    return cmd + (["--upstream-src", args.upstream_src] if args.upstream_src else [])


def upstream_lines(types, res) -> list[str]:
    """Below the Nano table: ours against upstream (upstream ÷ ours per type and op), what
    upstream ran, and the parity of codes and decoded audio."""
    up = {w: res.get(("nano", "upstream", w)) or {} for w in ("encode", "decode")}
    if not any(up.values()):
        return []
    L = []
    for t in types:
        ratios = []
        for w in ("encode", "decode"):
            ours, theirs = res.get(("nano", t, w), {}).get("median_s"), up[w].get("median_s")
            if ours and theirs:
                ratios.append(f"{w} {theirs / ours:.2f}x")
        if ratios:
            L.append(f"- ggml {t} against upstream torch f32 (upstream s ÷ ours): " + ", ".join(ratios))
    for w, r in up.items():
        if "median_s" in r:
            L.append(f"- upstream {w}: torch {r['torch']}, {r['threads']} threads, one pass "
                     f"(chunk_duration None), warm runs " + " ".join(f"{x:.2f}" for x in r["warm_s"])
                     + f" s, load {r['load_s']:.1f} s, commit {r['upstream_commit'][:12]}")
        elif r:
            L.append(f"- upstream {w}: {r}")
    L.append("parity with upstream (same random weights and inputs):")
    L.extend(codec_parity_lines(WORK, types, prefix="nano_", decode_input="codes16.npy"))
    return L


def _mark(v, goal):
    return "" if v is None or goal is None else (" OK" if v <= goal else " MISS")


def render(args, variants, types, res, conv, ckpt_gb, d, default_chunk, total_s) -> str:
    L = [(f"## 48 kHz stereo codecs, real dims, random weights: {SECONDS:g} s of stereo audio, "
          f"{args.threads} threads, chunk_seconds={default_chunk:g}, warm medians of {args.runs} "
          f"(v2: {max(1, args.runs - 1)})"), ""]
    if "nano" in variants:
        rows = []
        for t in types["nano"]:
            e, dd, s = (res.get(("nano", t, w), {}) for w in ("encode", "decode", "stream"))
            rows.append({
                "Nano": t, "encode s": fmt(e.get("median_s")) + (_mark(e.get("median_s"), NANO_GOALS["encode_s"])),
                "decode s": fmt(dd.get("median_s")) + _mark(dd.get("median_s"), NANO_GOALS["decode_s"]),
                "RTF enc/dec": rtf(SECONDS, e, dd),
                "stream ms/frame: first 10 s mean / full window": f"{fmt(s.get('mean_10s_ms'), '{:.1f}')}"
                    + _mark(s.get("mean_10s_ms"), NANO_GOALS["stream_ms"]) + " / "
                    + fmt(s.get("full_window_ms"), "{:.1f}") + _mark(s.get("full_window_ms"), NANO_GOALS["stream_ms"]),
                "stream p90 (full) / first push ms": f"{fmt(s.get('full_window_p90_ms'), '{:.1f}')} / {fmt(s.get('first_ms'), '{:.0f}')}",
                "stream vs decode": fmt(s.get("stream_vs_decode_rel"), "{:.1e}"),
                "peak RSS GB enc/dec/stream": f"{fmt(e.get('peak_rss_gb'))}/{fmt(dd.get('peak_rss_gb'))}/"
                                              f"{fmt(s.get('peak_rss_gb'))}",
                "cold enc/dec s": f"{fmt(e.get('cold_s'))}/{fmt(dd.get('cold_s'))}",
                "GFLOP/s enc / dec (% of peak)": enc_dec_rates((e, dd), (e, dd),
                                                               getattr(d, "peak", None)),
                "other load % e/d/s": other_load(e, dd, s),
            })
        sk = "stream ms/frame: first 10 s mean / full window"
        ue, ud = (res.get(("nano", "upstream", w)) for w in ("encode", "decode"))
        if ue or ud:
            ue, ud = ue or {}, ud or {}
            rows.append({
                "Nano": "upstream torch f32, one pass", "encode s": fmt(ue.get("median_s")),
                "decode s": fmt(ud.get("median_s")),
                "RTF enc/dec": rtf(SECONDS, ue, ud),
                "peak RSS GB enc/dec/stream": f"{fmt(ue.get('peak_rss_gb'))}/{fmt(ud.get('peak_rss_gb'))}/-",
                "cold enc/dec s": f"{fmt(ue.get('cold_s'))}/{fmt(ud.get('cold_s'))}",
                # the same math: our f32 graphs' work over upstream's time
                "GFLOP/s enc / dec (% of peak)": enc_dec_rates(
                    (res.get(("nano", "f32", "encode"), {}), res.get(("nano", "f32", "decode"), {})),
                    (ue, ud), getattr(d, "peak", None)),
                "other load % e/d/s": other_load(ue, ud) + "/-"})
        rows.append({"Nano": "upstream f32, issue text (other machine)",
                     "encode s": f"{NANO_ISSUE['encode_s']}", "decode s": f"{NANO_ISSUE['decode_s']}",
                     sk: f"{NANO_ISSUE['stream_ms']}"})
        rows.append({"Nano": "goal", "encode s": f"<= {NANO_GOALS['encode_s']}",
                     "decode s": f"<= {NANO_GOALS['decode_s']}", sk: f"<= {NANO_GOALS['stream_ms']}"})
        L.append(f"### MOSS-Audio-Tokenizer-Nano ({ckpt_gb.get('nano', 0) * 1e3:.0f} MB f32 checkpoint)")
        L.append(table(rows, list(rows[0])))
        L.extend(upstream_lines(types["nano"], res))
        for w in ("encode", "decode"):
            g = res.get(("nano", "f32", w), {}).get("gflop")
            if g:
                L.append("- " + work_line(f"f32 {w} of {SECONDS:g} s", g, "{:.1f}"))
        for push in (2, 8):
            sp = res.get(("nano", "f32", f"stream_push{push}"), {})
            if "median_ms" in sp:
                L.append(f"- f32 stream, {push} frames per push: first 10 s mean "
                         f"{sp['mean_10s_ms']:.1f} ms/frame, full window {sp['full_window_ms']:.1f} "
                         f"ms/frame; stream vs decode {sp['stream_vs_decode_rel']:.1e}; other load "
                         f"{100 * sp['foreign']:.0f} %")
        s1 = res.get(("nano", "f32", "stream1t"), {})
        if "median_ms" in s1:
            L.append(f"- f32 stream with 1 thread: median {s1['median_ms']:.1f} ms/frame, full window "
                     f"{s1['full_window_ms']:.1f} (p90 {s1['full_window_p90_ms']:.1f}); other load "
                     f"{100 * s1['foreign']:.0f} %")
        for t in types["nano"]:
            s = res.get(("nano", t, "stream"), {})
            if "median_ms" in s:
                fs = s["full_window_split_ms"]
                L.append(f"- {t} stream: ms by push # " + ", ".join(f"#{k}: {v:.1f}" for k, v in
                                                                  s["ms_push_by_index"].items())
                         + f"; full-window push split: compute {fs['compute']:.2f}, Graph.run "
                         f"{fs['run']:.2f}, host advance {fs['advance']:.2f} (masks {fs['mask']:.2f})"
                         + "; first push of later sessions "
                         + "/".join(f"{x:.0f}" for x in s["first_ms_later_sessions"])
                         + f" ms; compute buffer {s['compute_buffer_mib']:.1f} MiB, KV "
                         f"{s['kv_cache_mib']:.0f} MiB")
            for w in ("encode", "decode"):
                r = res.get(("nano", t, w), {})
                if "chunk_ms" in r:
                    sp = r.get("split_ms", {})
                    L.append(f"- {t} {w}: warm runs " + " ".join(f"{x:.3f}" for x in r["warm_s"])
                             + (f" s; split ms: compute {sp['compute']:.0f}, host advance "
                                f"{sp['advance']:.0f} (masks {sp['mask']:.0f}), Graph.run − compute "
                                f"{sp['run_minus_compute']:.0f}, build {sp['build']:.0f}" if sp else "")
                             + " s; per chunk ms " + " ".join(f"{x:.0f}" for x in r["chunk_ms"])
                             + f"; compute buffer {r.get('compute_buffer_mib', 0):.1f} MiB, KV "
                             f"{r.get('kv_cache_mib', 0):.0f} MiB; load {r['load_s']:.2f} s")
        for t in types["nano"]:
            r = res.get(("nano", t, "sweep"), {})
            if "rows" not in r:
                continue
            L.append("")
            L.append(f"chunk_seconds sweep, Nano {t}, one process, runs interleaved across values (warm "
                     f"median of {r['runs']}; other load {100 * r['foreign']:.0f} %): s for 10 s "
                     f"(ggml compute ms / host slots+masks ms; KV MiB)")
            srows = []
            for w in ("encode", "decode"):
                row = {"op": w}
                for x in r["rows"]:
                    if x["op"] == w:
                        row[f"{x['chunk']:g} s"] = (f"{x['median_s']:.3f} ({x['compute_ms']:.0f}/"
                                                    f"{x['host_ms']:.0f}; {x['kv_mib']:.0f})")
                srows.append(row)
            L.append(table(srows, list(srows[0])))
        L.append("")
    for op in ("decode", "stream"):
        top = res.get(("nano", "f32", "perf_" + op))
        if top:
            L.append(f"perf, Nano f32 {op} ({'3 × 10 s decode' if op == 'decode' else '160 one-frame pushes'}"
                     f", 2 threads), top symbols by self time over all threads:")
            L.extend("    " + x for x in top)
            L.append("")
    if "v2" in variants:
        rows = []
        for t in types["v2"]:
            dd, e = res.get(("v2", t, "decode"), {}), res.get(("v2", t, "encode"), {})
            rows.append({"v2": t, "decode s": fmt(dd.get("median_s")),
                         "RTF": rtf(SECONDS, dd),
                         "warm runs s": " ".join(f"{x:.2f}" for x in dd.get("warm_s", [])),
                         "cold s": fmt(dd.get("cold_s")), "load s": fmt(dd.get("load_s")),
                         "peak RSS GB": fmt(dd.get("peak_rss_gb")), "weight GB": fmt(dd.get("weight_gb")),
                         "KV MiB": fmt(dd.get("kv_cache_mib"), "{:.0f}"),
                         "encode s": fmt(e.get("median_s")),
                         "other load %": other_load(dd)})
        L.append(f"### MOSS-Audio-Tokenizer-v2 ({ckpt_gb.get('v2', 0):.2f} GB f32 checkpoint), decode of 10 s")
        L.append(table(rows, list(rows[0])))
        for t in types["v2"]:
            r = res.get(("v2", t, "decode"), {})
            if "chunk_ms" in r:
                L.append(f"- {t} decode per chunk ms: " + " ".join(f"{x:.0f}" for x in r["chunk_ms"])
                         + " [cold " + " ".join(f"{x:.0f}" for x in r["cold_chunk_ms"]) + "]")
        for k, r in res.items():
            if len(k) == 4 and k[0] == "v2":
                L.append(f"- v2 f16 decode chunk_seconds={k[3]:g}: {fmt(r.get('median_s'))} s, peak "
                         f"{fmt(r.get('peak_rss_gb'))} GB, KV {fmt(r.get('kv_cache_mib'), '{:.0f}')} MiB")
        L.append("")
    L.extend(report_footer(d, total_s, conv))
    return "\n".join(L)


if __name__ == "__main__":
    raise SystemExit(main())
