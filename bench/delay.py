"""MossTTSDelay per-step cost on seeded random weights at the real dimensions (36 × 4096, GQA
32/8, head_dim 128, SwiGLU 12288, vocab 155648, 32 × 1025 audio heads): one generation step
split into ggml compute (backbone + heads), sampling and Python; the prefill of a voice-clone-
sized prompt; peak RSS; and the bandwidth floor — the bytes a step must read divided by this
machine's measured read bandwidth. (The llama.cpp peer of issue 12 §3 is not run yet.)

    python bench/delay.py [--types q4_K,q8_0] [--steps 20] [--prompt 300] [--tiny]

Weights are generated one tensor at a time and quantized as written (no whole-model f32
copy); the GGUFs are cached under bench/results/models.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import zlib
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import CACHE, table  # noqa: E402
from bench.harness import fmt, median, peak_rss_gb  # noqa: E402
from converters.delay import tensor_types  # noqa: E402
from converters.gguf_io import Lazy, write_gguf  # noqa: E402
from moss_tts.ggml import Weights, get_backend  # noqa: E402
from moss_tts.models.delay import (FORMAT_VERSION, KIND, TOKENIZER_KEY, DelayConfig,  # noqa: E402
                                   DelayModel, audio_seen, next_row, row_feed)
from moss_tts.models.delay_state import DelayState  # noqa: E402
from moss_tts.models.qwen3 import Qwen3Config  # noqa: E402
from moss_tts.sampling import DelaySamplingOptions  # noqa: E402

REAL = Qwen3Config(4096, 36, 32, 8, 128, 12288, 1e6)
TINY = Qwen3Config(64, 2, 4, 2, 16, 96, 1e6)      # a smoke run of the script itself


def config(args) -> DelayConfig:
    lc = TINY if args.tiny else REAL
    return DelayConfig(lc, vocab_size=151680 if args.tiny else 155648)


def random_gguf(cfg: DelayConfig, outtype: str, tag: str) -> Path:
    """Seeded random weights in `outtype`, written one tensor at a time (cached)."""
    path = CACHE / f"delay-{tag}-{outtype}.gguf"
    if path.exists():
        return path

    def load(name, shape):
        rng = np.random.default_rng(zlib.crc32(name.encode()))   # the same on every run
        if len(shape) == 1:
            return np.ones(shape, np.float32)
        return rng.standard_normal(shape, dtype=np.float32) * np.float32(shape[-1] ** -0.5)

    tensors = {n: Lazy(s, np.float32, lambda n=n, s=s: load(n, s))
               for n, s in cfg.tensor_shapes().items()}
    return write_gguf(path, tensors, cfg.to_metadata() | {TOKENIZER_KEY: "{}"}, kind=KIND,
                      version=FORMAT_VERSION, type_for=tensor_types(outtype))


def read_bandwidth_gbs(nbytes: int = 1 << 29) -> float:
    """Streaming read bandwidth of this machine (best of 5 sums over nbytes)."""
    a = np.ones(nbytes // 8)
    best = min(_timed(a.sum) for _ in range(5))
    return nbytes / best / 1e9


def _timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def step_bytes(weights: Weights, cfg: DelayConfig, n_past: int, kv_bytes: int) -> int:
    """Bytes one step reads: every block and head matrix, the rows it embeds, the KV prefix."""
    infos = weights.file.tensors
    per_row = {n: i.nbytes // i.shape[0] for n, i in infos.items()
               if n.startswith(("token_embd", "emb_ext"))}
    read = sum(i.nbytes for n, i in infos.items() if n not in per_row)
    lc = cfg.language_config
    kv = 2 * lc.num_hidden_layers * lc.num_key_value_heads * lc.head_dim * kv_bytes * n_past
    return read + sum(per_row.values()) + kv


def prompt(cfg: DelayConfig, n: int) -> np.ndarray:
    """n rows: text ids, the last one AUDIO_START (generation starts in audio)."""
    rows = np.full((n, cfg.n_vq + 1), cfg.audio_pad_code, dtype=np.int64)
    rows[:, 0] = np.random.default_rng(0).integers(100, 150000, n) % cfg.vocab_size
    rows[-1, 0] = cfg.audio_start_token_id
    return rows


def measure(model: DelayModel, args) -> dict:
    cfg, backend = model.config, model.backend
    compute = []
    plain = backend.compute

    def timed_compute(cgraph):   # ggml compute time of every graph run
        t0 = time.perf_counter()
        plain(cgraph)
        compute.append(time.perf_counter() - t0)

    backend.compute = timed_compute
    rows = prompt(cfg, args.prompt)
    opts, rng = DelaySamplingOptions(), np.random.default_rng(0)
    try:
        with model.make_session(len(rows) + args.steps) as session:
            t0 = time.perf_counter()
            out = session.run(row_feed(rows), len(rows), variant=True)
            prefill = time.perf_counter() - t0
            state, seen = DelayState.from_prompt(rows[:, 0], cfg.ids), audio_seen(rows[:, 1:], cfg)
            steps = []
            for _ in range(args.steps):
                t0 = time.perf_counter()
                row, state = next_row(state, out["text_logits"][0], out["audio_logits"][0],
                                      seen, cfg, opts, rng)
                seen |= audio_seen(row[None, 1:], cfg)
                t1 = time.perf_counter()
                n_compute = len(compute)
                out = session.run(row_feed(row[None]), 1, variant=True)
                t2 = time.perf_counter()
                steps.append((t2 - t0, t1 - t0, sum(compute[n_compute:])))
    finally:
        backend.compute = plain
    warm = steps[2:] or steps
    return {"prefill_ms": 1e3 * prefill, "step_ms": 1e3 * median([s[0] for s in warm]),
            "sample_ms": 1e3 * median([s[1] for s in warm]),
            "compute_ms": 1e3 * median([s[2] for s in warm]),
            "python_ms": 1e3 * median([s[0] - s[1] - s[2] for s in warm]),
            # the first frame is whole after n_vq rows (codec decode not included)
            "first_frame_ms": 1e3 * (prefill + sum(s[0] for s in steps[:cfg.n_vq]))}


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--types", default="q4_K,q8_0")
    ap.add_argument("--steps", type=int, default=20, help="> n_vq, for first_frame_ms")
    ap.add_argument("--prompt", type=int, default=300)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--tiny", action="store_true", help="small dims: check the script runs")
    args = ap.parse_args(argv)
    cfg = config(args)
    bandwidth = read_bandwidth_gbs()
    results = []
    for outtype in args.types.split(","):
        path = random_gguf(cfg, outtype, "tiny" if args.tiny else "real")
        model = DelayModel(Weights.load(path, get_backend(None, args.threads)))
        try:
            r = {"type": outtype} | measure(model, args)
            floor_bytes = step_bytes(model.weights, cfg, args.prompt + args.steps // 2, 2)
            r["floor_ms"] = 1e3 * floor_bytes / (bandwidth * 1e9)
            r["step_over_floor"] = r["step_ms"] / r["floor_ms"]
            r["weights_gb"] = model.weights.nbytes / 1e9
            r["peak_rss_gb"] = peak_rss_gb()
        finally:
            model.close()
        results.append(r)
    shown = [{k: v if isinstance(v, str) else fmt(v) for k, v in r.items()} for r in results]
    print(table(shown, list(results[0])))
    print(json.dumps({"read_bandwidth_gbs": bandwidth, "results": results}))


if __name__ == "__main__":
    main()
