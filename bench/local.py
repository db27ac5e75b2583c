"""MOSS-TTS-Local generation at the real dimensions on seeded random weights: ours per frame
(backbone step, the depth loop, heads, sampling, Python), first audio, peak RSS, beside the
bandwidth floor and upstream's PyTorch f32 loop (bench/local_upstream.py) on the same weights.

    python bench/local.py [--variant v2|v2b] [--types q8_0,q4_K,f16] [--frames 12]
        [--prompt 200] [--threads N] [--no-peer] [--tiny]

--variant v2 (default) is MossTTSLocal 1.7B: Qwen3-1.7B backbone, a 4-layer 1536-wide
RoPE-free depth stack over 33 positions with per-channel SwiGLU adapters and heads (§family-3);
v2b (MOSS-TTS-Local-Transformer-v1.5) is `bench/local_v15.py`'s `run(args)`.

The weights are written once per type straight in the target type (pooled rows from
bench/delay_weights.py: ggml quantizes q4_K too slowly to quantize 2 B values here), as a
moss-tts Local GGUF under --data. A frame reads every backbone matrix once and every depth-stack
matrix once per depth position (33 ×: each position depends on the token sampled at the one
before): the floor is those bytes (+ the adapters, the heads of the frame, the KV prefix) ÷ the
read bandwidth measured just before. Prefill: the median of 3 runs on fresh states after a first
one that pays the first touch of the mmapped weights (reported as prefill_cold); both sides'
figures are the warm median. First audio = warm prefill + the first codec chunk's 4 frames (the
adaptive ladder's first chunk; the codec's own decode not included).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import table  # noqa: E402
from bench.delay_weights import PooledRows  # noqa: E402
from bench.harness import (ROOT, Driver, add_no_wait, end_report, fmt, measure_types,  # noqa: E402
                           median, peak_rss_gb, prefill_times, PREFILL_RATE)
from bench.matmul import ReadProbe  # noqa: E402
from converters.gguf_io import write_gguf  # noqa: E402
from converters.local import local_group, tensor_types  # noqa: E402
from fixtures.make_delay import make_tokenizer_json  # noqa: E402
from moss_tts.ggml import Graph, Weights, get_backend, ops  # noqa: E402
from moss_tts.models.local import (FORMAT_VERSION, KIND, LOCAL, TOKENIZER_KEY,  # noqa: E402
                                   LocalConfig, LocalModel, choose, row_feed)
from moss_tts.models.chunk_ladder import FIRST_CHUNK_FRAMES as FIRST_CHUNK  # noqa: E402
from moss_tts.models.qwen3 import Qwen3Config  # noqa: E402
from moss_tts.sampling import LocalSamplingOptions, seen_per_head  # noqa: E402

REAL = Qwen3Config(2048, 28, 16, 8, 128, 6144, 1e6)          # Qwen3-1.7B (§family-3.1)
TINY = Qwen3Config(64, 2, 4, 2, 16, 96, 1e6)                 # a smoke run of the script itself
KV_BYTES = 2                                                 # the f16 backbone cache (default)


def config(tiny: bool) -> LocalConfig:
    if tiny:
        return LocalConfig(TINY, vocab_size=151680, n_vq=8, audio_vocab_size=64,
                           audio_pad_code=64, local_num_layers=2, local_hidden_size=48,
                           local_ffn_hidden_size=96, additional_mlp_ffn_hidden_size=64)
    return LocalConfig(REAL, vocab_size=155648)


# -- the weights ------------------------------------------------------------------------------
def tensor_values(cfg: LocalConfig) -> dict:
    """Every tensor: pooled random rows for matrices, ones for norms (speed does not depend
    on the values; the peer builds the same f32 values from the same names)."""
    return {n: PooledRows(n, s) if len(s) == 2 else np.ones(s, np.float32)
            for n, s in cfg.tensor_shapes().items()}


def weights_file(args) -> Path:
    cfg = config(args.tiny)
    out = Path(args.data) / f"local-{'tiny' if args.tiny else 'real'}-{args.type}.gguf"
    if not out.exists():
        out.parent.mkdir(parents=True, exist_ok=True)
        t0 = time.perf_counter()
        # a working tokenizer: bench/streams.py loads it as a LocalTTS and plans a sentence
        meta = cfg.to_metadata() | {TOKENIZER_KEY: make_tokenizer_json()}
        write_gguf(out, tensor_values(cfg), meta,
                   kind=KIND, version=FORMAT_VERSION,
                   type_for=tensor_types(args.type))
        print(f"{out}: written in {time.perf_counter() - t0:.0f} s", file=sys.stderr)
    return out


# -- the prompt ---------------------------------------------------------------------------------
def voice_clone_prompt(cfg: LocalConfig, n: int) -> np.ndarray:
    """n rows shaped like a voice-clone prompt without delay (§family-3.5): text, AUDIO_START, user
    slots carrying random frames, AUDIO_END, text, AUDIO_START last."""
    rng = np.random.default_rng(0)
    pad = cfg.audio_pad_code
    frames = max(1, n - 24)
    rows = np.full((n, cfg.n_vq + 1), pad, dtype=np.int64)
    rows[:, 0] = rng.integers(1000, 150000, n)
    at = n - frames - 3
    rows[at, 0], rows[at + frames + 1, 0] = cfg.audio_start_token_id, cfg.audio_end_token_id
    rows[at + 1:at + 1 + frames, 0] = cfg.audio_user_slot_token_id
    rows[at + 1:at + 1 + frames, 1:] = rng.integers(0, cfg.audio_vocab_size, (frames, cfg.n_vq))
    rows[-1, 0] = cfg.audio_start_token_id
    return rows


# -- ours -------------------------------------------------------------------------------------
class HeadsProbe:
    """The heads of one frame alone (head c of position c, the text head at 0: they run inside
    each depth step's graph), run once after each frame: the depth loop's share is its graph
    time minus this (interleaved, so a busy machine slows both alike)."""

    def __init__(self, model: LocalModel):
        d = model.config.language_config.hidden_size
        self.graphs = []
        for head in model.w.heads:
            g = Graph(model.backend, name="heads")
            g.output(ops.mul_mat(head, g.input("y", (d,))), "logits")
            self.graphs.append(g.build())
            g.allocate()
        self.y = np.random.default_rng(0).standard_normal(d).astype(np.float32)

    def seconds(self) -> float:
        total = 0.0
        for g in self.graphs:
            g.set_input("y", self.y)
            t0 = time.perf_counter()
            g.compute()
            total += time.perf_counter() - t0
        return total

    def close(self) -> None:
        for g in self.graphs:
            g.close()


def run_ours(args) -> dict:
    backend = get_backend(None, args.threads)
    model = LocalModel(Weights.load(weights_file(args), backend))
    cfg, rows = model.config, voice_clone_prompt(model.config, args.prompt)
    heads, compute, plain = HeadsProbe(model), [], backend.compute

    def prefill_once():
        with model.make_state(len(rows) + 1) as fresh:
            fresh.backbone.run(row_feed(rows, cfg.n_vq), len(rows), variant=(cfg.n_vq, True))

    prefills = prefill_times(prefill_once)

    def timed_compute(cgraph):   # ggml time of every graph run
        t0 = time.perf_counter()
        plain(cgraph)
        compute.append(time.perf_counter() - t0)

    backend.compute = timed_compute
    opts, rng = LocalSamplingOptions(), np.random.default_rng(0)
    seen = seen_per_head(rows[:, 1:], cfg.audio_rows)
    state = model.make_state(len(rows) + args.frames)
    parts, feed = [], rows
    t_start = time.perf_counter()
    prefill = None
    for _ in range(args.frames):
        t0 = time.perf_counter()
        k = len(compute)
        h = state.backbone.run(row_feed(feed, cfg.n_vq), len(feed), variant=(cfg.n_vq, True))
        backbone = sum(compute[k:])
        if prefill is None:
            prefill = time.perf_counter() - t0
            t0, backbone = time.perf_counter(), 0.0
        k, sampling, value = len(compute), 0.0, h["hidden"][0]
        row = np.zeros(cfg.n_vq + 1, dtype=np.int64)
        for c in range(cfg.n_vq + 1):
            logits = model.depth_step(state, c, value)
            t1 = time.perf_counter()
            row[c] = value = choose(logits, c, seen, cfg, opts, rng)
            sampling += time.perf_counter() - t1
        depth = sum(compute[k:])
        row[0] = cfg.audio_assistant_gen_slot_token_id   # random weights: keep speaking
        seen |= seen_per_head(row[None, 1:], cfg.audio_rows)
        wall = time.perf_counter() - t0
        heads_s = heads.seconds()
        parts.append({"backbone": backbone, "depth": depth - heads_s, "heads": heads_s,
                      "sampling": sampling, "python": wall - backbone - depth - sampling})
        feed = row[None]
    first_audio = prefill + sum(sum(p.values()) for p in parts[:FIRST_CHUNK])
    total = time.perf_counter() - t_start
    backend.compute = plain
    heads.close()
    state.close()
    model.close()
    warm = parts[2:] or parts
    out = {f"{k}_ms": 1e3 * median([p[k] for p in warm]) for k in parts[0]}
    return out | prefills | {"frame_ms": 1e3 * median([sum(p.values()) for p in warm]),
                             "first_audio_ms": 1e3 * first_audio, "total_s": total,
                             "threads": backend.threads}


def run_peer(args) -> dict:
    from bench.local_upstream import run_upstream

    return run_upstream(config(args.tiny), tensor_values(config(args.tiny)),
                        voice_clone_prompt(config(args.tiny), args.prompt), args.frames,
                        args.threads)


def worker(args) -> None:
    run = {"ours": run_ours, "peer": run_peer}[args.worker]
    print(json.dumps(run(args) | {"peak_rss_gb": peak_rss_gb()}))


# -- the floor ------------------------------------------------------------------------------------
def frame_bytes(path: Path, cfg: LocalConfig, n_past: int) -> dict[str, int]:
    """Bytes one frame reads, by part: the backbone (every block matrix, one row of each
    embedding table, the KV prefix), the depth loop (the depth stack and the input adapter once
    per position, each output adapter and norm once) and the heads (each once)."""
    from moss_tts.ggml import GGUFFile

    with GGUFFile(path) as f:
        info = f.tensors
    size = {n: i.nbytes for n, i in info.items()}
    head_names = [n for n in size if local_group(n) == "head"]
    embed_names = [n for n in size if local_group(n) == "embed"]
    local = sum(v for n, v in size.items() if n.startswith(LOCAL) or n.startswith(
        "speech_embedding_to_local_mlp."))
    out_mlps = sum(v for n, v in size.items() if n.startswith(
        ("local_to_speech_embedding_mlps.", "layer_norm_before_lm_heads.")))
    blocks = sum(v for n, v in size.items() if n.startswith("blk.") or n == "output_norm.weight")
    rows = sum(size[n] // info[n].shape[0] for n in embed_names)
    lc = cfg.language_config
    kv = 2 * lc.num_hidden_layers * lc.num_key_value_heads * lc.head_dim * KV_BYTES * n_past
    return {"backbone": blocks + rows + kv, "depth": (cfg.n_vq + 1) * local + out_mlps,
            "heads": sum(size[n] for n in head_names)}


def measure_type(driver: Driver, args, outtype: str, probe: ReadProbe) -> list[dict]:
    cfg = config(args.tiny)
    kw = dict(type=outtype, frames=args.frames, prompt=args.prompt, threads=args.threads,
              data=args.data, tiny=args.tiny)
    path = weights_file(argparse.Namespace(**kw))       # written here, before any timing
    gbps = probe.gbps(5)
    parts = frame_bytes(path, cfg, args.prompt + args.frames // 2)
    floor = {f"{k}_floor_ms": 1e3 * v / (gbps * 1e9) for k, v in parts.items()}
    r = driver.worker("ours", **kw)
    out = [{"type": outtype, "side": "ours", "read_gbs": gbps,
            "floor_ms": sum(floor.values()), "weights_gb": path.stat().st_size / 1e9}
           | floor | r]
    if not args.no_peer and outtype == args.types.split(",")[0]:   # f32: one run is enough
        try:
            p = driver.worker("peer", **kw)
        except Exception as e:   # torch / transformers missing: say so in the table
            p = {"error": str(e).splitlines()[0] if str(e) else type(e).__name__}
        out.append({"type": "f32", "side": "upstream", "read_gbs": gbps} | p)
    return out


def report(results: list[dict]) -> str:
    peer = next((r for r in results if r["side"] == "upstream" and "error" not in r), {})
    lines = [{"type": r["type"], "side": r["side"],
              **{c: fmt(r.get(f"{c}_ms")) for c in ("backbone", "depth", "heads", "sampling",
                                                     "python", "frame", "prefill",
                                                     "prefill_cold", "first_audio")},
              PREFILL_RATE: r.get(PREFILL_RATE, ""),
              "floor": fmt(r.get("floor_ms")),
              "/floor": fmt(r.get("frame_ms", float("nan")) / r["floor_ms"])
              if r.get("floor_ms") else "",
              "upstream/this": fmt(peer.get("frame_ms", float("nan")) / r["frame_ms"])
              if r.get("frame_ms") else r.get("error", "")[:40],
              "peak RSS GB": fmt(r.get("peak_rss_gb")), "threads": r.get("threads", "")}
             for r in results]
    floors = [{"type": r["type"], **{k: fmt(r[f"{k}_floor_ms"]) for k in
                                     ("backbone", "depth", "heads")},
               "read GB/s": fmt(r["read_gbs"], "{:.1f}"), "weights GB": fmt(r["weights_gb"])}
              for r in results if "backbone_floor_ms" in r]
    return "\n\n".join(["per frame (ms): ours by part vs upstream PyTorch f32",
                        table(lines, list(lines[0])), "bandwidth floor by part (ms):",
                        table(floors, list(floors[0])) if floors else "(none)"])


def main(argv=None) -> int:
    variant = argparse.ArgumentParser(add_help=False)
    variant.add_argument("--variant", choices=["v2", "v2b"], default="v2",
                         help="v2: MOSS-TTS-Local-Transformer (1.7B); v2b: its v1.5 (4B)")
    if variant.parse_known_args(argv)[0].variant == "v2b":
        from bench import local_v15   # the V2b bench, written beside this one: its own flags
        ap = argparse.ArgumentParser(description=local_v15.__doc__.splitlines()[0],
                                     parents=[variant])
        local_v15.add_arguments(ap)
        local_v15.run(ap.parse_args(argv))
        return 0
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0], parents=[variant])
    ap.add_argument("--types", default="q8_0,q4_K,f16", help="weight types, comma-separated")
    ap.add_argument("--frames", type=int, default=12, help=f"≥ {FIRST_CHUNK} (first audio)")
    ap.add_argument("--prompt", type=int, default=200, help="prompt rows (a voice clone)")
    ap.add_argument("--threads", type=int, default=None)
    default_data = str(ROOT / "bench" / "results" / "local_data")
    ap.add_argument("--data", default=os.environ.get("MOSS_TTS_BENCH_DATA", default_data),
                    help="where the random-weight files are written once and reused")
    ap.add_argument("--no-peer", action="store_true", help="skip upstream PyTorch")
    add_no_wait(ap)
    ap.add_argument("--tiny", action="store_true", help="small dims: check the script runs")
    ap.add_argument("--worker", choices=["ours", "peer"], help=argparse.SUPPRESS)
    ap.add_argument("--type", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.frames < FIRST_CHUNK:
        ap.error(f"--frames must be at least {FIRST_CHUNK} (the first audio chunk)")
    if args.worker:
        worker(args)
        return 0
    driver, results = measure_types(args, __file__, "local-bench.log", measure_type)
    driver.say(report(results))
    end_report(driver, results)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
