"""MossTTSRealtime at the real dimensions (Qwen3-1.7B backbone: 28 × 2048, GQA 16/8, head_dim
128, SwiGLU 6144, vocab 151936; the 4-layer local transformer of the same widths; 16 × 1027
tables and heads) on seeded random weights: one frame (backbone step + 16 local steps +
sampling), the 12th text token to the first frame, the RTF of a live session fed text at a
fixed token rate, and each type's bandwidth floor; beside upstream's PyTorch f32 modules on
the same weights (`--peer`: runs at the tiny dims only for now).

    python bench/realtime.py [--types q4_K,q8_0] [--frames 24] [--rate 12.5] [--threads N]
        [--tiny] [--peer PYTHON]

Codec decode is not included (the frames are counted, 80 ms each): the session runs with a
silent frame sink. The floor = bytes a frame must read (every backbone block matrix, one row
of each table, the KV prefix; 16 passes over the local blocks and one head each) ÷ the read
bandwidth measured just before. `--peer PYTHON` is a Python with torch and transformers (e.g.
`pip install torch==2.13.0 transformers` in a venv of its own; never a package dependency);
it times upstream's `MossTTSRealtimeInference.prefill/step` from the upstream source
($MOSS_TTS_UPSTREAM_REALTIME: upstream's `moss_tts_realtime/` directory).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import table  # noqa: E402
from bench.delay_weights import PooledRows  # noqa: E402
from bench.harness import (ROOT, Driver, add_no_wait, end_report, fmt, measure_types,  # noqa: E402
                           median, peak_rss_gb, prefill_times, prefill_work, of_peak, PREFILL_RATE)
from converters.gguf_io import write_gguf  # noqa: E402
from converters.realtime import tensor_types  # noqa: E402
from fixtures.make_delay import make_tokenizer_json  # noqa: E402
from moss_tts.ggml import GGUFFile, get_backend  # noqa: E402
from moss_tts.models.qwen3 import Qwen3Config  # noqa: E402
from moss_tts.models.realtime import (FORMAT_VERSION, KIND, TOKENIZER_KEY,  # noqa: E402
                                      RealtimeConfig, RealtimeModel)
from moss_tts.models.realtime_tts import RealtimeTTS  # noqa: E402
from moss_tts.ggml import Weights  # noqa: E402
from moss_tts.sampling import RealtimeSamplingOptions  # noqa: E402

REAL = Qwen3Config(2048, 28, 16, 8, 128, 6144, 1e6)
REAL_LOCAL = Qwen3Config(2048, 4, 16, 8, 128, 6144, 1e6)
TINY = Qwen3Config(64, 2, 4, 2, 16, 96, 1e6)          # a smoke run of the script itself
FRAME_S = 0.08
PROMPT_ROWS = 120                                      # about the system block's length
KV_BYTES = 2                                           # f16 backbone KV (RealtimeModel default)


def config(tiny: bool) -> RealtimeConfig:
    return RealtimeConfig(TINY if tiny else REAL, TINY if tiny else REAL_LOCAL,
                          vocab_size=151680 if tiny else 151936)


def weights(args) -> Path:
    """The random-weight GGUF of a type (written once, reused)."""
    out = Path(args.data) / f"realtime-{'tiny' if args.tiny else 'real'}-{args.type}.gguf"
    if not out.exists():
        out.parent.mkdir(parents=True, exist_ok=True)
        cfg = config(args.tiny)
        tensors = {n: PooledRows(n, s) if len(s) == 2 else np.ones(s, np.float32)
                   for n, s in cfg.tensor_shapes().items()}
        meta = cfg.to_metadata() | {TOKENIZER_KEY: make_tokenizer_json()}
        t0 = time.perf_counter()
        write_gguf(out, tensors, meta, kind=KIND, version=FORMAT_VERSION,
                   type_for=tensor_types(args.type, embed="f16"))
        print(f"{out}: written in {time.perf_counter() - t0:.0f} s", file=sys.stderr)
    return out


class SilentFrames:
    """The session's frame sink without a codec (FrameAudio's interface): one frame's worth of
    zeros per frame, codes [n_vq, n] or one frame [n_vq]."""

    frame_rate = 1.0 / FRAME_S

    def __init__(self, hop: int):
        self.hop, self.ended = hop, False

    def push(self, codes) -> np.ndarray:
        codes = np.asarray(codes)
        return np.zeros(self.hop * (codes.shape[1] if codes.ndim == 2 else 1), np.float32)

    def close(self) -> None:
        pass


class SilentTTS(RealtimeTTS):
    """RealtimeTTS whose sessions skip the codec (its decode is benchmarked in bench/codec.py)."""

    def _need_codec(self):
        return None

    def frame_audio(self):
        return SilentFrames(int(self.sample_rate * FRAME_S))


# -- the worker ---------------------------------------------------------------------------------
def frame_parts(model: RealtimeModel, frames: int) -> dict:
    """Per frame: backbone graph, local graphs (16), sampling + Python; medians after 2."""
    compute, plain = [], model.backend.compute

    def timed(cgraph):
        t0 = time.perf_counter()
        plain(cgraph)
        compute.append(time.perf_counter() - t0)

    model.backend.compute = timed
    cfg, rng = model.config, np.random.default_rng(0)
    rows = np.full((PROMPT_ROWS, cfg.rvq + 1), cfg.audio_pad_token, dtype=np.int64)
    rows[:, 0] = rng.integers(1000, 150000, PROMPT_ROWS)
    rows[-1, 1] = cfg.audio_bos
    parts = []

    def prefill_once():
        with model.stream(PROMPT_ROWS + 1) as fresh:
            fresh.start(rows)

    prefills = prefill_times(prefill_once)
    with model.stream(PROMPT_ROWS + frames + 1) as s:
        s.start(rows)
        for _ in range(frames):
            k = len(compute)
            t0 = time.perf_counter()
            s.step(int(rng.integers(1000, 150000)))
            total = time.perf_counter() - t0
            backbone, local = compute[k], sum(compute[k + 1:])
            parts.append({"backbone": backbone, "local": local,
                          "sampling": total - backbone - local, "frame": total})
    model.backend.compute = plain
    warm = parts[2:] or parts
    return {f"{k}_ms": 1e3 * median([p[k] for p in warm]) for k in parts[0]} | prefills


def live_session(tts: RealtimeTTS, tokens: int, rate: float) -> dict:
    """A session fed `tokens` ids at `rate` per second, then drained: the 12th token's call
    (its first frame), the busy share of the audio time, and how far the audio fell behind."""
    rng = np.random.default_rng(1)
    ids = rng.integers(1000, 150000, tokens).tolist()
    with tts.session(seed=0, max_frames=tokens) as s:
        start, busy, first, produced = time.perf_counter(), 0.0, None, []
        for n, token in enumerate(ids):
            wait = start + n / rate - time.perf_counter()
            if wait > 0:
                time.sleep(wait)
            t0 = time.perf_counter()
            got = s.push_tokens([token]).size
            t1 = time.perf_counter()
            busy += t1 - t0
            if got:
                first = first if first is not None else 1e3 * (t1 - t0)
                produced.append(t1)
        t0 = time.perf_counter()
        for _ in s.drain():
            produced.append(time.perf_counter())
        busy += time.perf_counter() - t0
    audio_s = len(produced) * FRAME_S
    # frame n must be ready when playback started at the first frame reaches it
    lag = max(t - (produced[0] + n * FRAME_S) for n, t in enumerate(produced))
    return {"first_audio_ms": first, "live_frames": len(produced), "live_audio_s": audio_s,
            "live_rtf": busy / audio_s, "live_lag_s": max(0.0, lag)}


def run_ours(args) -> dict:
    backend = get_backend(None, args.threads)
    tts = SilentTTS(RealtimeModel(Weights.load(weights(args), backend)), None)
    try:
        out = frame_parts(tts.model, args.frames)
        out |= live_session(tts, args.frames + 11, args.rate)
    finally:
        tts.close()
    return out | {"threads": backend.threads, "peak_rss_gb": peak_rss_gb()}


def worker(args) -> None:
    print(json.dumps(run_ours(args)))


# -- the floor ----------------------------------------------------------------------------------
def frame_bytes(path: Path, cfg: RealtimeConfig, n_past: int) -> int:
    """Bytes one frame reads: the backbone blocks, a row of the text table and of each audio
    table, the f16 KV prefix; per local position the local blocks and one head (and a row of a
    local table)."""
    with GGUFFile(path) as f:
        t = f.tensors
        rows = t["token_embd.weight"].nbytes // cfg.vocab_size
        backbone = sum(i.nbytes for n, i in t.items() if n.startswith("blk."))
        local = sum(i.nbytes for n, i in t.items() if n.startswith("local.blk."))
        head = t["local.lm_heads.0.weight"].nbytes
        table = t["embed_tokens.1.weight"].nbytes // cfg.audio_vocab_size
    lc = cfg.language_config
    kv = 2 * lc.num_hidden_layers * lc.num_key_value_heads * lc.head_dim * KV_BYTES * n_past
    return backbone + rows + cfg.rvq * table + kv + cfg.rvq * (local + head + table)


# -- the peer -----------------------------------------------------------------------------------
def run_peer(args) -> dict:
    """Upstream's PyTorch f32 (bench/realtime_peer.py in the --peer Python) and ours on one tiny
    checkpoint with upstream's fixed local shape (16 codebooks of 1027): per frame, and whether
    the greedy frames agree."""
    src = os.environ.get("MOSS_TTS_UPSTREAM_REALTIME")
    if not src:
        return {"error": "set MOSS_TTS_UPSTREAM_REALTIME to upstream's moss_tts_realtime/"}
    if not args.tiny:
        return run_peer_real(args, src)
    from converters.realtime import convert
    from fixtures.make_realtime import make_tiny_realtime_checkpoint, tiny_config

    root = Path(args.data) / "peer-tiny"
    ckpt = make_tiny_realtime_checkpoint(root / "hf", seed=0, config=tiny_config(
        rvq=16, audio_pad_token=1024, audio_vocab_size=1027, sampling_rate=24000))
    r = subprocess.run([args.peer, str(Path(__file__).with_name("realtime_peer.py")), src,
                        str(ckpt), str(args.frames)], capture_output=True, text=True)
    if r.returncode:
        return {"error": (r.stderr.strip().splitlines() or ["failed"])[-1]}
    peer = json.loads(r.stdout.strip().splitlines()[-1])
    if args.golden:      # the greedy frames upstream drew, for tests/models/test_realtime.py
        Path(args.golden).write_text(json.dumps(
            {"upstream": "OpenMOSS/MOSS-TTS 58b20a0 moss_tts_realtime, transformers 5.0.0, "
                         "torch f32 eager, MossTTSRealtimeInference.prefill/step, greedy, "
                         "repetition penalty 1.1 window 50",
             "checkpoint": "fixtures.make_realtime seed 0, rvq 16, audio_pad_token 1024",
             **{k: peer[k] for k in ("prompt", "text", "frames")}}) + "\n")
    model = RealtimeModel(Weights.load(convert(str(ckpt), root / "ours.gguf", strict=True),
                                       get_backend(None, args.threads)))
    cfg = model.config
    rows = np.vstack([np.array(peer["prompt"]), np.full((12, cfg.rvq + 1), cfg.audio_pad_token)])
    rows[-12:, 0] = peer["text"][:12]
    rows[-1, 1] = cfg.audio_bos
    greedy = RealtimeSamplingOptions(do_sample=False)
    t0 = time.perf_counter()
    ours = model.generate(rows, peer["text"][12:], options=greedy, max_frames=args.frames)
    per_frame = (time.perf_counter() - t0) / max(1, len(ours))
    model.close()
    want = np.array(peer["frames"])[:len(ours)]
    return {"peer_frame_ms": peer["frame_ms"], "peer_threads": peer["threads"],
            "ours_frame_ms_incl_prefill": 1e3 * per_frame, "frames": len(ours),
            "greedy_frames_equal": bool(np.array_equal(ours, want))}


def real_config_json() -> dict:
    """Upstream's config.json keys at the real dimensions (REAL, REAL_LOCAL)."""
    from fixtures.make_realtime import tiny_config

    def qwen3(c: Qwen3Config) -> dict:
        return {"hidden_size": c.hidden_size, "num_hidden_layers": c.num_hidden_layers,
                "num_attention_heads": c.num_attention_heads,
                "num_key_value_heads": c.num_key_value_heads, "head_dim": c.head_dim,
                "intermediate_size": c.intermediate_size, "rope_theta": c.rope_theta,
                "rms_norm_eps": 1e-6}
    tiny = tiny_config()
    return tiny | {"language_config": tiny["language_config"] | qwen3(REAL) | {"vocab_size": 151936},
                   "local_config": tiny["local_config"] | qwen3(REAL_LOCAL),
                   "rvq": 16, "audio_pad_token": 1024, "audio_vocab_size": 1027,
                   "sampling_rate": 24000}


def run_peer_real(args, src: str) -> dict:
    """Upstream at the real dimensions with its own random init (a frame's time does not depend
    on the values, and no 7 GB f32 checkpoint is written): per frame, same prompt and text
    lengths as the tiny check, greedy."""
    root = Path(args.data) / "peer-real"
    root.mkdir(parents=True, exist_ok=True)
    (root / "config.json").write_text(json.dumps(real_config_json()))
    r = subprocess.run([args.peer, str(Path(__file__).with_name("realtime_peer.py")), src,
                        str(root), str(args.frames)], capture_output=True, text=True)
    if r.returncode:
        return {"error": (r.stderr.strip().splitlines() or ["failed"])[-1]}
    peer = json.loads(r.stdout.strip().splitlines()[-1])
    return {"peer_frame_ms": peer["frame_ms"], "peer_prefill_ms": peer["prefill_ms"],
            "peer_threads": peer["threads"], "frames": len(peer["frames"])}


# -- the driver ---------------------------------------------------------------------------------
def measure_type(driver: Driver, args, outtype: str, probe) -> list[dict]:
    kw = dict(type=outtype, frames=args.frames, rate=args.rate, threads=args.threads,
              data=args.data, tiny=args.tiny)
    path = weights(argparse.Namespace(**kw))        # written here, before any timing
    gbps = probe.gbps(5)
    r = driver.worker("ours", **kw)
    floor = frame_bytes(path, config(args.tiny), PROMPT_ROWS + args.frames) / (gbps * 1e9)
    return [{"type": outtype, "read_gbs": gbps, "floor_ms": 1e3 * floor} | r]


def report(results: list[dict]) -> str:
    cols = ["type", "frame ms", "floor ms", "frame/floor", "backbone", "local", "sampling",
            "prefill", "prefill cold", PREFILL_RATE, "12th→first ms", "first/frame", "live RTF", "live lag s", "peak RSS GB",
            "read GB/s", "threads"]
    lines = [{"type": r["type"], "frame ms": fmt(r.get("frame_ms")), "floor ms": fmt(r["floor_ms"]),
              "frame/floor": fmt(r.get("frame_ms", float("nan")) / r["floor_ms"]),
              "backbone": fmt(r.get("backbone_ms")), "local": fmt(r.get("local_ms")),
              "sampling": fmt(r.get("sampling_ms")), "prefill": fmt(r.get("prefill_ms")),
              "prefill cold": fmt(r.get("prefill_cold_ms")), PREFILL_RATE: r.get(PREFILL_RATE, ""),
              "12th→first ms": fmt(r.get("first_audio_ms")),
              "first/frame": fmt((r.get("first_audio_ms") or float("nan"))
                                 / r.get("frame_ms", float("nan"))),
              "live RTF": fmt(r.get("live_rtf")), "live lag s": fmt(r.get("live_lag_s")),
              "peak RSS GB": fmt(r.get("peak_rss_gb")), "read GB/s": fmt(r["read_gbs"], "{:.1f}"),
              "threads": r.get("threads", "")} for r in results]
    return table(lines, cols)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--types", default="q4_K,q8_0", help="block types, comma-separated")
    ap.add_argument("--frames", type=int, default=24, help="frames per measurement")
    ap.add_argument("--rate", type=float, default=12.5,
                    help="text tokens per second fed to the live session (12.5 = speaking pace)")
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--data", default=os.environ.get(
        "MOSS_TTS_BENCH_DATA", str(ROOT / "bench" / "results" / "realtime_data")),
        help="where the random-weight files are written once and reused")
    add_no_wait(ap)
    ap.add_argument("--tiny", action="store_true", help="small dims: check the script runs")
    ap.add_argument("--peer", help="a Python with torch + transformers: time upstream too")
    ap.add_argument("--golden", help="with --peer: write upstream's greedy frames to this JSON")
    ap.add_argument("--worker", choices=["ours"], help=argparse.SUPPRESS)
    ap.add_argument("--type", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:
        worker(args)
        return 0
    driver, results = measure_types(args, __file__, "realtime-bench.log", measure_type)
    driver.say(report(results))
    if args.peer:
        peer = run_peer(args)
        driver.say(f"upstream PyTorch f32 ({'tiny' if args.tiny else 'real'} dims): "
                   f"{json.dumps(peer)}")
        for r in results if "peer_frame_ms" in peer and not args.tiny else ():
            driver.say(f"upstream / ours per frame, {r['type']}: "
                       f"{peer['peer_frame_ms'] / r['frame_ms']:.2f}×")
        if peer.get("peer_prefill_ms"):
            driver.say(f"upstream prefill {peer['peer_prefill_ms']:.0f} ms = " + (of_peak(
                prefill_work(results), peer["peer_prefill_ms"] / 1e3, driver.peak) or "?")
                + " GFLOP/s (% of peak) on our graphs' work for the same prompt")
    end_report(driver, results)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
