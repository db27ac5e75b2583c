"""A 12-layer, 768-wide GPT-2-like decode step (Nano's global backbone shape) with a 512-slot KV
cache, random weights: Python graph build vs allocation vs input/output vs compute, with and
without graph reuse, for f32 / f16 / q8_0 matmul weights.

    python bench/decode_step.py [--types f32,f16,q8_0] [--steps 40] [--past 256] [--threads N]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import median_ms, random_model, table  # noqa: E402
from moss_tts.ggml import Backend, Graph, Weights  # noqa: E402
from moss_tts.models import gpt2  # noqa: E402
from moss_tts.nn import KVCache  # noqa: E402

CFG = gpt2.GPT2Config(n_embd=768, n_head=12, n_layer=12, n_inner=3072)
CAPACITY = 512


def model_shapes() -> dict[str, tuple]:
    shapes = {f"h.{i}.{n}": s for i in range(CFG.n_layer) for n, s in CFG.layer_shapes().items()}
    shapes.update({"ln_f.weight": (CFG.n_embd,), "ln_f.bias": (CFG.n_embd,)})
    return shapes


def build_step(g: Graph, w: Weights, cache: KVCache, n_rows: int, n_slots: int, flash: bool):
    gpt2.build_cached_graph(g, w, CFG, cache, n_rows, n_slots, flash=flash)


def step_inputs(cache: KVCache, rng, positions, n_slots, flash):
    x = rng.standard_normal((len(positions), CFG.n_embd)).astype(np.float32)
    return gpt2.cached_feed(cache, x, positions, n_slots, flash=flash)


def run_mode(w, backend, *, reuse: bool, past: int, steps: int, flash: bool):
    rng = np.random.default_rng(0)
    cache = KVCache(CFG.n_layer, CFG.n_head, CFG.head_dim, CAPACITY, backend=backend)
    g = Graph(backend, name="decode")
    # prefill `past` rows so attention has a realistic length
    build_step(g, w, cache, past, past, flash)
    g.run(step_inputs(cache, rng, np.arange(past), past, flash))
    keys = ("prep", "build", "alloc", "inputs", "compute", "outputs", "total")
    times = {k: [] for k in keys}
    if reuse:
        g.reset()
        build_step(g, w, cache, 1, CAPACITY, flash)
    for s in range(steps):
        p = past + s
        t0 = time.perf_counter()
        feed = step_inputs(cache, rng, [p], CAPACITY if reuse else p + 1, flash)  # host numpy
        t1 = time.perf_counter()
        if not reuse:
            g.reset()
            build_step(g, w, cache, 1, p + 1, flash)
        t2 = time.perf_counter()
        g.allocate()
        t3 = time.perf_counter()
        for name, value in feed.items():
            g.set_input(name, value)
        t4 = time.perf_counter()
        g.compute()
        t5 = time.perf_counter()
        g.read("hidden")
        t6 = time.perf_counter()
        for k, a, b in zip(keys, (t0, t1, t2, t3, t4, t5, t0), (t1, t2, t3, t4, t5, t6, t6)):
            times[k].append(b - a)
    n_nodes = g.n_nodes
    g.close()
    cache.close()
    return {k: median_ms(v) for k, v in times.items()}, n_nodes


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--types", default="f32,f16,q8_0")
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--past", type=int, default=256)
    ap.add_argument("--threads", type=int, default=None)
    args = ap.parse_args(argv)
    backend = Backend("cpu", threads=args.threads)
    rows = []
    for t in args.types.split(","):
        path = random_model("gpt2-12x768", model_shapes(), t)
        with Weights.load(path, backend) as w:
            for flash, reuse in ((False, False), (True, False), (True, True)):
                r, n_nodes = run_mode(w, backend, reuse=reuse, past=args.past, steps=args.steps,
                                      flash=flash)
                python = r["build"] + r["alloc"] + r["inputs"] + r["outputs"]
                step = python + r["compute"]
                rows.append({"type": t, "attention": "flash" if flash else "softmax",
                             "graph": "reused" if reuse else "rebuilt",
                             "nodes": n_nodes, **{k: f"{v:.2f}" for k, v in r.items()},
                             "python %": f"{100 * python / step:.1f}",
                             "weights MiB": f"{w.nbytes / 2**20:.0f}"})
    print(f"decode step, 12 x 768 GPT-2 (RoPE), KV cache {CAPACITY} slots, {args.past} past rows, "
          f"{backend.threads} threads, medians of {args.steps} steps (ms)")
    print(table(rows, ["type", "attention", "graph", "nodes", "prep", "build", "alloc", "inputs",
                       "compute", "outputs", "total", "python %", "weights MiB"]))
    print("prep = the host numpy work of a step (random row, slot, mask), not binding overhead; "
          "python % = (build + alloc + inputs + outputs) / (those + compute), from medians")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
