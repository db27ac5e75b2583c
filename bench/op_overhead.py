"""Python overhead of the binding: one raw ctypes call, one checked op, building a graph node,
and replaying a tiny graph (input write + compute + output read).

    python bench/op_overhead.py [--n 20000]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import table  # noqa: E402
from moss_tts.ggml import Graph, lib, ops  # noqa: E402


def per_call_us(fn, n: int) -> float:
    best = float("inf")
    for _ in range(5):
        t0 = time.perf_counter()
        fn(n)
        best = min(best, (time.perf_counter() - t0) / n)
    return best * 1e6


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=20000)
    args = ap.parse_args(argv)
    L = lib.get()
    g = Graph(name="overhead")
    x = g.input("x", (4, 64))
    b = g.input("b", (64,))

    def raw_calls(n):
        f = L.ggml_type_size
        for _ in range(n):
            f(0)

    def build_ops(n):
        g.reset()
        xx = g.input("x", (4, 64))
        bb = g.input("b", (64,))
        for _ in range(n):
            xx = ops.add(xx, bb)

    def build_views(n):
        g.reset()
        xx = g.input("x", (4, 64))
        for _ in range(n):
            ops.view(xx, (32, 4), offset=128)

    tiny = Graph(name="tiny")
    tx = tiny.input("x", (1, 768))
    tiny.output(ops.silu(tx), "y")
    tiny.build()
    xv = np.ones((1, 768), np.float32)

    def replay(n):
        for _ in range(n):
            tiny.run({"x": xv})

    rows = [{"what": "raw ctypes call (ggml_type_size)", "us": f"{per_call_us(raw_calls, args.n):.2f}"},
            {"what": "checked op: ops.add (build one node)", "us": f"{per_call_us(build_ops, args.n):.2f}"},
            {"what": "checked op: ops.view", "us": f"{per_call_us(build_views, args.n):.2f}"},
            {"what": "replay a 1-node graph: write 3 KB, compute, read 3 KB",
             "us": f"{per_call_us(replay, args.n // 10):.2f}"}]
    del x, b
    print(table(rows, ["what", "us"]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
