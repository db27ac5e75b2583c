"""Matmul throughput per weight type: sequence length 1 (decode, bandwidth-bound: GB/s of
weights read) and 64 rows (prefill, compute-bound: GFLOP/s), against numpy on the same shapes.

    python bench/matmul.py [--types f32,f16,bf16,q8_0,q4_0,q4_K,q6_K] [--rows 1,64] [--gib 1.0]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import median_ms, random_model, table  # noqa: E402
from moss_tts.ggml import Backend, Graph, Weights, ops  # noqa: E402

K = N = 4096


class ReadProbe:
    """GB/s of a plain streaming read (numpy max, one slice per thread; numpy releases the GIL):
    the machine's memory read bandwidth. This machine's bandwidth drifts from minute to minute,
    so it is measured right next to each matmul it is compared with."""

    def __init__(self, nbytes: int, threads: int):
        self.array = np.random.default_rng(1).standard_normal(nbytes // 4, dtype=np.float32)
        self.parts = np.array_split(self.array, threads)

    def gbps(self, repeat: int) -> float:
        import threading
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


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--types", default="f32,f16,bf16,q8_0,q4_0,q4_K,q6_K")
    ap.add_argument("--rows", default="1,64")
    ap.add_argument("--gib", type=float, default=1.0, help="f32 size of the weight stack "
                    "(keep it well above the last-level cache)")
    ap.add_argument("--repeat", type=int, default=7)
    ap.add_argument("--threads", type=int, default=None)
    args = ap.parse_args(argv)
    n_mats = max(1, round(args.gib * 2**30 / (K * N * 4)))
    shapes = {f"w.{i}.weight": (N, K) for i in range(n_mats)}
    backend = Backend("cpu", threads=args.threads)
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
        rows_out.append(_row("numpy f32", m, median_ms(samples), n_mats * N * K * 4, n_mats, bw))
        for t in args.types.split(","):
            with Weights.load(random_model(f"stack{n_mats}x{N}", shapes, t), backend) as wts:
                g = Graph(backend, name="matmul")
                xin = g.input("x", (m, K))
                for i in range(n_mats):
                    g.output(ops.mul_mat(wts[f"w.{i}.weight"], xin), f"y{i}")
                g.build()
                g.allocate()
                g.set_input("x", x)
                g.compute()  # warm-up (page-in of the mmap)
                bw = probe.gbps(args.repeat)
                samples = []
                for _ in range(args.repeat):
                    t0 = time.perf_counter()
                    g.compute()
                    samples.append(time.perf_counter() - t0)
                rows_out.append(_row(f"ggml {t}", m, median_ms(samples), wts.nbytes, n_mats, bw))
                g.close()
    print(f"{n_mats} x [{N} x {K}] weights, {backend.threads} threads, medians of {args.repeat}; "
          f"read BW = numpy max over the same bytes, {backend.threads} threads, best of "
          f"{args.repeat}, measured just before each row")
    print(table(rows_out, ["what", "rows", "ms", "weight GB/s", "read BW", "% of read BW",
                           "GFLOP/s"]))
    return 0


def _row(what, m, ms, nbytes, n_mats, bw):
    flops = 2.0 * m * N * K * n_mats
    row = {"what": what, "rows": m, "ms": f"{ms:.1f}", "weight GB/s": f"{nbytes / ms / 1e6:.1f}",
           "read BW": f"{bw:.1f}", "GFLOP/s": f"{flops / ms / 1e6:.1f}"}
    if m == 1:
        row["% of read BW"] = f"{100 * nbytes / ms / 1e6 / bw:.0f}"
    return row


if __name__ == "__main__":
    raise SystemExit(main())
