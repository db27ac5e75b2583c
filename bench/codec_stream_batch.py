"""Several codec streams decoded together (issue 35, moss_tts/codec/stream_batch.py) against the
same pushes through one StreamDecoder per stream: the Nano codec at its real dimensions (random
weights, bench/codec48k.py writes it), one frame per stream per push, ms per step.

    python bench/codec_stream_batch.py [--codec bench/results/codec48k/nano-f32.gguf]
                                       [--streams 1,2,4] [--frames 160] [--runs 3] [--threads 2]

A step is one frame (80 ms of audio) for every stream. Reported per stream count: the median
step once every stage's window is full (from frame 126: the 50 Hz stage holds 10 s), the
median over the frames before (the windows fill), and the batched outputs' largest difference
from the separate decoders' (bit-equal by design). Modes and stream counts are interleaved
run by run; the first run of each builds the graphs and is not timed.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.common import cpu_line, table  # noqa: E402
from moss_tts.codec import Codec  # noqa: E402

FULL_WINDOW_FRAMES = 126     # bench/codec48k.py: the 50 Hz decoder stage's 10 s window is full


def separate(codec, codes: list[np.ndarray]) -> tuple[list[float], list[np.ndarray]]:
    """One StreamDecoder per stream, each stream's frame pushed in turn: (seconds per step,
    each stream's audio)."""
    decoders = [codec.stream_decoder() for _ in codes]
    times, out = [], [[] for _ in codes]
    try:
        for t in range(codes[0].shape[1]):
            t0 = time.perf_counter()
            for i, d in enumerate(decoders):
                out[i].append(d.push(codes[i][:, t:t + 1]))
            times.append(time.perf_counter() - t0)
    finally:
        for d in decoders:
            d.close()
    return times, [np.concatenate(o) for o in out]


def batched(batch, codes: list[np.ndarray]) -> tuple[list[float], list[np.ndarray]]:
    """The same pushes through one StreamBatch, one push per step for all streams."""
    slots = [batch.open() for _ in codes]
    times, out = [], [[] for _ in codes]
    try:
        for t in range(codes[0].shape[1]):
            t0 = time.perf_counter()
            got = batch.push({s: c[:, t:t + 1] for s, c in zip(slots, codes)})
            times.append(time.perf_counter() - t0)
            for i, s in enumerate(slots):
                out[i].append(got[s])
    finally:
        for s in slots:
            batch.release(s)
    return times, [np.concatenate(o) for o in out]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--codec", default=str(ROOT / "bench/results/codec48k/nano-f32.gguf"))
    ap.add_argument("--streams", default="1,2,4")
    ap.add_argument("--frames", type=int, default=160)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    counts = [int(n) for n in args.streams.split(",")]
    print(cpu_line())
    print(f"codec {args.codec}, {args.threads} threads, {args.frames} frames per stream, "
          f"one frame per stream per push, {args.runs} timed runs")
    with Codec.load(args.codec, threads=args.threads) as codec:
        rng = np.random.default_rng(0)
        codes = [rng.integers(0, codec.config.codebook_size, (codec.n_quantizers, args.frames),
                              dtype=np.int32) for _ in range(max(counts))]
        batch = codec.stream_batch(max(counts))
        steps = {(n, m): [] for n in counts for m in ("separate", "batched")}
        worst = {n: 0.0 for n in counts}
        for run in range(args.runs + 1):
            for n in counts:
                t_sep, a_sep = separate(codec, codes[:n])
                t_bat, a_bat = batched(batch, codes[:n])
                worst[n] = max([worst[n]] + [float(np.abs(a - b).max())
                                             for a, b in zip(a_sep, a_bat)])
                if run:            # the first run builds the graphs
                    steps[n, "separate"].append(t_sep)
                    steps[n, "batched"].append(t_bat)
        batch.close()
    rows = []
    for n in counts:
        row = {"streams": n}
        for m in ("separate", "batched"):
            runs = steps[n, m]
            row[f"{m} full ms"] = 1e3 * statistics.median(
                [t for r in runs for t in r[FULL_WINDOW_FRAMES:]])
            row[f"{m} filling ms"] = 1e3 * statistics.median(
                [t for r in runs for t in r[1:FULL_WINDOW_FRAMES]])
        row["speedup full"] = row["separate full ms"] / row["batched full ms"]
        row["per stream full ms"] = row["batched full ms"] / n
        row["max |diff|"] = worst[n]
        rows.append({k: (f"{v:.2f}" if isinstance(v, float) and k != "max |diff|" else v)
                     for k, v in row.items()})
    print(table(rows, list(rows[0])))


if __name__ == "__main__":
    main()
