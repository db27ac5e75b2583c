"""Matmul throughput per weight type: sequence length 1 (decode, bandwidth-bound: GB/s of
weights read) and 64 rows (prefill, compute-bound: GFLOP/s and % of the host's peak), against
numpy on the same shapes; quantized types ggml repacks on this CPU run plain and repacked
(CPU_REPACK) interleaved in one process.

    python bench/matmul.py [--types f32,f16,bf16,q8_0,q4_0,q4_K,q6_K] [--rows 1,64] [--gib 1.0]
                           [--repack off,on] [--peak-n 2048]

The peak is the best of numpy's and ggml's f32 GEMM at n = --peak-n, printed beside the FMA
width × clock × cores figure. "× f32" is each type's speed against ggml f32 at the same rows
(issue 13: quantized prefill should never be slower than f32).

    python bench/matmul.py --codec [--peer PY]

times instead the f32 matmuls of the 24 kHz codec's encoder on 10 s (its real shapes and row
counts, docs/upstream-notes.md §codecs-1.4): ggml, numpy, and with --peer PY (a python with torch)
PyTorch's F.linear on the same shapes and threads, in one run — where the codec's time against
upstream goes, shape by shape.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import cpu_line, fma_peak_gflops, median_ms, random_model, table  # noqa: E402
from moss_tts.ggml import Backend, Graph, TensorStore, Weights, ops  # noqa: E402

K = N = 4096


class ReadProbe:
    """GB/s of a plain streaming read (numpy max, one slice per thread; numpy releases the GIL):
    the machine's memory read bandwidth. This machine's bandwidth drifts from minute to minute,
    so it is measured right next to each matmul it is compared with."""

    def __init__(self, nbytes: int, threads: int):
        self.array = np.random.default_rng(1).standard_normal(nbytes // 4, dtype=np.float32)
        self.parts = np.array_split(self.array, threads)

    def gbps(self, repeat: int) -> float:
        best = float("inf")
        for _ in range(repeat):
            workers = [threading.Thread(target=np.max, args=(p,)) for p in self.parts]
            t0 = time.perf_counter()
            for w in workers:
                w.start()
            for w in workers:
                w.join()
            best = min(best, time.perf_counter() - t0)
        return self.array.nbytes / best / 1e9


def best_s(fn, repeat: int) -> float:
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def ggml_gemm_s(backend: Backend, w: np.ndarray, x: np.ndarray, repeat: int) -> float:
    """Best seconds of ggml's mul_mat of f32 weights w [N, K] by rows x [M, K]."""
    with TensorStore({"w": w}, backend) as store:
        g = Graph(backend, name="gemm")
        g.output(ops.mul_mat(store["w"], g.input("x", x.shape)), "y")
        g.build()
        g.allocate()
        g.set_input("x", x)
        g.compute()
        try:
            return best_s(g.compute, repeat)
        finally:
            g.close()


def measured_peak(backend: Backend, n: int, repeat: int) -> dict[str, float]:
    """GFLOP/s of an n×n×n f32 GEMM: numpy (its BLAS) and ggml (mul_mat of n rows)."""
    rng = np.random.default_rng(2)
    a, b = (rng.standard_normal((n, n), dtype=np.float32) for _ in range(2))
    flops = 2.0 * n ** 3
    return {"numpy": flops / best_s(lambda: a @ b, repeat) / 1e9,
            "ggml": flops / ggml_gemm_s(backend, b, a, repeat) / 1e9}


def matmul_graph(backend, weights, n_mats: int, m: int, x) -> Graph:
    g = Graph(backend, name="matmul")
    xin = g.input("x", (m, K))
    for i in range(n_mats):
        g.output(ops.mul_mat(weights[f"w.{i}.weight"], xin), f"y{i}")
    g.build()
    g.allocate()
    g.set_input("x", x)
    g.compute()  # warm-up (page-in of the mmap)
    return g


def interleaved(graphs: list[Graph], repeat: int) -> list[float]:
    """Median ms of each graph, timed in turn within every repeat (A B A B ...)."""
    samples = [[] for _ in graphs]
    for _ in range(repeat):
        for g, out in zip(graphs, samples):
            t0 = time.perf_counter()
            g.compute()
            out.append(time.perf_counter() - t0)
    return [median_ms(s) for s in samples]


# The 24 kHz codec's encoder on a 10 s chunk: (rows, d_model, ffn, layers) per transformer stage
# (patch 240 → 1000 rows at 768 wide, then /2 per patch stage; the last stage 1280 wide, 32
# layers); a layer multiplies by [d, 3d] (fused qkv), [d, d], [d, ffn] and [ffn, d]
CODEC_ENCODER_10S = ((1000, 768, 3072, 12), (500, 768, 3072, 12), (250, 768, 3072, 12),
                     (125, 1280, 5120, 32))


def codec_shapes() -> list[tuple[int, int, int, int]]:
    """(K, N, rows, count) of every layer matmul of CODEC_ENCODER_10S."""
    out = []
    for m, d, ffn, layers in CODEC_ENCODER_10S:
        out += [(d, 3 * d, m, layers), (d, d, m, layers), (d, ffn, m, layers), (ffn, d, m, layers)]
    return out


def torch_worker(threads: int, repeat: int) -> dict:
    """Run inside --peer's interpreter: best seconds of F.linear per codec shape."""
    import torch
    torch.set_num_threads(threads)
    out = {}
    for k, n, m, _ in codec_shapes():
        w, x = torch.randn(n, k), torch.randn(m, k)
        torch.nn.functional.linear(x, w)
        out[f"{k}x{n}x{m}"] = best_s(lambda: torch.nn.functional.linear(x, w), repeat)
    return {"seconds": out, "torch": torch.__version__}


def codec_main(args, backend: Backend) -> int:
    rng = np.random.default_rng(0)
    peer = {}
    if args.peer:
        cmd = [args.peer, __file__, "--torch-worker", "--threads", str(backend.threads),
               "--repeat", str(args.repeat)]
        peer = json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True)
                          .stdout.splitlines()[-1])
    rows, totals = [], {"ggml": 0.0, "numpy": 0.0, "torch": 0.0}
    for k, n, m, count in codec_shapes():
        w = rng.standard_normal((n, k), dtype=np.float32) * k ** -0.5
        x = rng.standard_normal((m, k), dtype=np.float32)
        t = {"ggml": ggml_gemm_s(backend, w, x, args.repeat),
             "numpy": best_s(lambda: x @ w.T, args.repeat)}
        if peer:
            t["torch"] = peer["seconds"][f"{k}x{n}x{m}"]
        gf = 2.0 * k * n * m / 1e9
        row = {"K x N": f"{k} x {n}", "rows": m, "count": count}
        for side, sec in t.items():
            row[f"{side} GFLOP/s"] = f"{gf / sec:.0f}"
            totals[side] += count * sec
        rows.append(row)
    print(f"CPU: {cpu_line()}")
    print(f"24 kHz codec encoder, 10 s: its layer matmuls in f32, {backend.threads} threads, best of "
          f"{args.repeat}" + (f"; torch {peer['torch']} via {args.peer}" if peer else ""))
    cols = ["K x N", "rows", "count", "ggml GFLOP/s", "numpy GFLOP/s"] + (
        ["torch GFLOP/s"] if peer else [])
    print(table(rows, cols))
    print("all of them: " + ", ".join(f"{side} {sec:.2f} s" for side, sec in totals.items()
                                      if sec or side != "torch"))
    return 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--types", default="f32,f16,bf16,q8_0,q4_0,q4_K,q6_K")
    ap.add_argument("--rows", default="1,64,300")
    ap.add_argument("--gib", type=float, default=1.0, help="f32 size of the weight stack "
                    "(keep it well above the last-level cache)")
    ap.add_argument("--repack", default="off,on", help="plain (off) and/or repacked (on) "
                    "weights, for the types this CPU repacks")
    ap.add_argument("--peak-n", type=int, default=2048, help="GEMM size of the peak probe")
    ap.add_argument("--repeat", type=int, default=7)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--codec", action="store_true", help="the codec encoder's shapes instead")
    ap.add_argument("--peer", help="with --codec: a python with torch, timed on the same shapes")
    ap.add_argument("--torch-worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--peak-only", action="store_true",
                    help="print the measured f32 GEMM peak as one JSON line (for the other benches)")
    args = ap.parse_args(argv)
    if args.peak_only:
        backend = Backend("cpu", threads=args.threads)
        peaks = measured_peak(backend, args.peak_n, args.repeat)
        theory, how = fma_peak_gflops(backend.threads)
        print(json.dumps({**peaks, "peak": max(peaks.values()), "n": args.peak_n, "fma": theory,
                          "how": how, "cpu": cpu_line()}))
        return 0
    if args.torch_worker:
        print(json.dumps(torch_worker(args.threads or 1, args.repeat)))
        return 0
    n_mats = max(1, round(args.gib * 2**30 / (K * N * 4)))
    shapes = {f"w.{i}.weight": (N, K) for i in range(n_mats)}
    backend = Backend("cpu", threads=args.threads)
    if args.codec:
        return codec_main(args, backend)
    modes = args.repack.split(",")
    peaks = measured_peak(backend, args.peak_n, args.repeat)
    peak = max(peaks.values())
    theory, how = fma_peak_gflops(backend.threads)
    rows_out = []
    rng = np.random.default_rng(0)
    probe = ReadProbe(n_mats * N * K * 4, backend.threads)
    np_mats = None
    for m in (int(r) for r in args.rows.split(",")):
        x = rng.standard_normal((m, K)).astype(np.float32)
        if np_mats is None:
            np_mats = [rng.standard_normal((N, K), dtype=np.float32) for _ in range(n_mats)]
        samples = []
        for _ in range(args.repeat):
            t0 = time.perf_counter()
            for w in np_mats:
                x @ w.T
            samples.append(time.perf_counter() - t0)
        bw = probe.gbps(args.repeat)
        rows_out.append(_row("numpy f32", m, median_ms(samples), n_mats * N * K * 4, n_mats, bw,
                             peak))
        for t in args.types.split(","):
            path = random_model(f"stack{n_mats}x{N}", shapes, t)
            loaded = {}
            try:
                for mode in modes:
                    w = Weights.load(path, backend, repack=(lambda n, t: True) if mode == "on"
                                     else None)
                    if mode == "off" or w.packed:   # "on" only where ggml repacks this type
                        loaded[mode] = w
                    else:
                        w.close()
                graphs = {mode: matmul_graph(backend, w, n_mats, m, x)
                          for mode, w in loaded.items()}
                bw = probe.gbps(args.repeat)
                for (mode, g), ms in zip(graphs.items(), interleaved(list(graphs.values()),
                                                                      args.repeat)):
                    label = f"ggml {t}" + (" repacked" if mode == "on" else "")
                    rows_out.append(_row(label, m, ms, loaded[mode].nbytes, n_mats, bw, peak))
                    g.close()
            finally:
                for w in loaded.values():
                    w.close()
    print(f"CPU: {cpu_line()}")
    print(f"peak: measured f32 GEMM n={args.peak_n}: numpy {peaks['numpy']:.0f}, ggml "
          f"{peaks['ggml']:.0f} GFLOP/s (best of {args.repeat}); FMA figure {theory:.0f} GFLOP/s "
          f"({how}); '% of peak' uses the measured {peak:.0f}")
    print(f"{n_mats} x [{N} x {K}] weights, {backend.threads} threads, medians of {args.repeat} "
          f"(plain and repacked timed in turn); read BW = numpy max over the same bytes, "
          f"{backend.threads} threads, best of {args.repeat}, measured just before each row")
    f32_ms = {r["rows"]: r["_ms"] for r in rows_out if r["what"] == "ggml f32"}
    for r in rows_out:
        if r["rows"] in f32_ms:
            r["× f32"] = f"{f32_ms[r['rows']] / r['_ms']:.2f}"
    print(table(rows_out, ["what", "rows", "ms", "weight GB/s", "read BW", "% of read BW",
                           "GFLOP/s", "% of peak", "× f32"]))
    return 0


def _row(what, m, ms, nbytes, n_mats, bw, peak):
    flops = 2.0 * m * N * K * n_mats
    gflops = flops / ms / 1e6
    row = {"what": what, "rows": m, "_ms": ms, "ms": f"{ms:.1f}",
           "weight GB/s": f"{nbytes / ms / 1e6:.1f}",
           "read BW": f"{bw:.1f}", "GFLOP/s": f"{gflops:.1f}"}
    if m == 1:
        row["% of read BW"] = f"{100 * nbytes / ms / 1e6 / bw:.0f}"
    else:
        row["% of peak"] = f"{100 * gflops / peak:.0f}"
    return row


if __name__ == "__main__":
    raise SystemExit(main())
