"""Attention at the Nano codec decoder's streaming shapes (one frame per push: 4/8/16/32 query
rows per stage against rings of 544/864/1232/1632 slots, 4 heads of 64): ggml's flash attention
vs the softmax path over a transposed-V cache, and the softmax path's three parts (q·kᵀ, softmax,
p·v), each as its own graph. Medians of replayed graphs (compute only), one process.

    python bench/attention.py [--threads 2] [--runs 300] [--kv f32,f16]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import median_ms, table  # noqa: E402
from moss_tts.ggml import F16, F32, Graph, get_backend, ops  # noqa: E402
from moss_tts.nn import attention  # noqa: E402

HEADS, DH = 4, 64
# (stage, slots, rows): the decoder's four transformer stages, one frame per push, rings sized
# for up to 8-frame pushes with one-frame pushes attending over the full ring
STAGES = [("50 Hz", 544, 4), ("100 Hz", 864, 8), ("200 Hz", 1232, 16), ("400 Hz", 1632, 32)]
TYPES = {"f32": (F32, np.float32), "f16": (F16, np.float16)}


def compute_us(g: Graph, feed: dict, runs: int) -> float:
    g.run(feed)                               # allocate, write inputs once
    samples = []
    for _ in range(runs):
        t0 = time.perf_counter()
        g.compute()
        samples.append(time.perf_counter() - t0)
    return median_ms(samples) * 1e3


def graphs(backend, slots: int, rows: int, kv) -> dict[str, Graph]:
    """The five graphs over one layer's cache: flash, softmax+vtrans, and its three parts."""
    w = HEADS * DH
    out = {}
    g = Graph(backend, name="flash")
    k, v = g.input("k", (slots, w), kv), g.input("v", (slots, w), kv)
    q, m = g.input("q", (rows, HEADS, DH)), g.input("m", (rows, slots), F16)
    kv_view = lambda t: ops.view(t, (DH, HEADS, slots), (DH * t.nb[0], t.nb[1]))  # noqa: E731
    g.output(attention(q, kv_view(k), kv_view(v), m, scale=DH ** -0.5, flash=True), "o")
    out["flash"] = g.build()
    g = Graph(backend, name="softmax_vtrans")
    k, vt = g.input("k", (slots, w), kv), g.input("vt", (w, slots), kv)
    q, m = g.input("q", (rows, HEADS, DH)), g.input("m", (rows, slots), F16)
    vv = ops.view(vt, (slots, DH, HEADS), (vt.nb[1], DH * vt.nb[1]))
    g.output(attention(q, kv_view(k), vv, m, scale=DH ** -0.5, v_transposed=True), "o")
    out["softmax+vtrans"] = g.build()
    g = Graph(backend, name="qk")
    k, q = g.input("k", (slots, w), kv), g.input("q", (rows, HEADS, DH))
    g.output(ops.mul_mat(ops.permute(kv_view(k), 0, 2, 1), ops.cont(ops.permute(q, 0, 2, 1))), "s")
    out["q·kᵀ"] = g.build()
    g = Graph(backend, name="softmax")
    s, m = g.input("s", (HEADS, rows, slots)), g.input("m", (rows, slots), F16)
    g.output(ops.softmax(s, m, DH ** -0.5), "p")
    out["softmax"] = g.build()
    g = Graph(backend, name="pv")
    vt, p = g.input("vt", (w, slots), kv), g.input("p", (HEADS, rows, slots))
    g.output(ops.mul_mat(ops.view(vt, (slots, DH, HEADS), (vt.nb[1], DH * vt.nb[1])), p), "o")
    out["p·v"] = g.build()
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--runs", type=int, default=300)
    ap.add_argument("--kv", default="f32,f16", help="cache types")
    args = ap.parse_args(argv)
    backend = get_backend(None, args.threads)
    rng = np.random.default_rng(0)
    rows_out = []
    for kv_name in args.kv.split(","):
        kv, np_kv = TYPES[kv_name]
        for stage, slots, rows in STAGES:
            feed = {"k": rng.standard_normal((slots, HEADS * DH)).astype(np_kv),
                    "v": rng.standard_normal((slots, HEADS * DH)).astype(np_kv),
                    "vt": rng.standard_normal((HEADS * DH, slots)).astype(np_kv),
                    "q": rng.standard_normal((rows, HEADS, DH)).astype(np.float32),
                    "m": np.zeros((rows, slots), np.float16),
                    "s": rng.standard_normal((HEADS, rows, slots)).astype(np.float32),
                    "p": rng.random((HEADS, rows, slots)).astype(np.float32)}
            row = {"kv": kv_name, "stage": stage, "rows x slots": f"{rows} x {slots}"}
            flop = 2 * 2 * slots * rows * HEADS * DH         # q·kᵀ and p·v
            for name, g in graphs(backend, slots, rows, kv).items():
                us = compute_us(g, {n: feed[n] for n in g.inputs}, args.runs)
                row[f"{name} µs"] = f"{us:.0f}"
                if name in ("q·kᵀ", "p·v"):
                    row[f"{name} GFLOP/s"] = f"{flop / 2 / us / 1e3:.0f}"
                g.close()
            rows_out.append(row)
    print(f"one layer, {HEADS} heads of {DH}, {args.threads} threads, medians of {args.runs} "
          "replays (compute only)")
    print(table(rows_out, list(rows_out[0])))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
