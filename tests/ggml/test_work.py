"""Graph work counting (moss_tts.ggml.work): the flops a graph asks ggml for, checked against
counts written from the operand shapes, and the counter's scope (what it sees, what it does not)."""

import threading

import numpy as np

from moss_tts.ggml import F16, Graph, count_flops, ops
from moss_tts.ggml.work import graph_work


def _graph(build):
    g = Graph(name="work")
    build(g)
    g.build()
    return g


def test_mul_mat_counts_two_flops_per_multiply_add_with_broadcast_batches():
    k, n, m = 32, 48, 5
    def build(g):
        w = g.input("w", (2, n, k))           # ggml [K, N, 2]
        x = g.input("x", (6, m, k))           # ggml [K, M, 6]: each w batch serves 3 x batches
        g.output(ops.mul_mat(w, x), "y")
        g.output(ops.mul_mat(g.input("a", (n, k)), g.input("b", (m, k))), "z")
    g = _graph(build)
    try:
        w = graph_work(g.lib, g.cgraph)
        assert w.mul_mat == 2 * k * n * m * 6 + 2 * k * n * m
        assert w.flash_attn == 0 and w.runs == 1
    finally:
        g.close()


def test_flash_attention_counts_every_key_slot_it_is_given_per_query_row_and_head():
    dh, tq, tk, hq, hkv = 16, 7, 40, 4, 2
    def build(g):
        q = g.input("q", (hq, tq, dh))
        k = g.input("k", (hkv, tk, dh))
        v = g.input("v", (hkv, tk, dh))
        mask = g.input("mask", (tq, tk), F16)
        g.output(ops.flash_attn(q, k, v, mask, 0.25), "o")
    g = _graph(build)
    try:
        assert graph_work(g.lib, g.cgraph).flash_attn == 2 * (dh + dh) * tq * hq * tk
    finally:
        g.close()


def test_count_flops_sums_computes_inside_the_block_only(rng):
    k, n, m = 64, 32, 3
    per_run = 2 * k * n * m
    g = Graph(name="count")
    g.output(ops.mul_mat(g.input("w", (n, k)), g.input("x", (m, k))), "y")
    feed = {"w": rng.standard_normal((n, k)).astype(np.float32),
            "x": rng.standard_normal((m, k)).astype(np.float32)}
    try:
        g.run(feed)                                        # before any counter: not seen
        with count_flops() as outer:
            g.run(feed)
            with count_flops() as inner:
                g.run(feed)
                t = threading.Thread(target=g.run, args=(feed,))   # another thread's compute
                t.start()
                t.join()
        g.run(feed)                                        # after: not seen
        assert (inner.runs, inner.mul_mat) == (2, 2 * per_run)
        assert (outer.runs, outer.mul_mat) == (3, 3 * per_run)
        assert inner.gflop()["total"] == 2 * per_run / 1e9
    finally:
        g.close()


def test_a_rebuilt_graph_is_counted_at_its_new_shape():
    k, n = 16, 8
    g = Graph(name="rebuild")
    try:
        for m in (2, 9):
            g.reset()
            g.output(ops.mul_mat(g.input("w", (n, k)), g.input("x", (m, k))), "y")
            with count_flops() as c:
                g.run({"w": np.ones((n, k), np.float32), "x": np.ones((m, k), np.float32)})
            assert c.mul_mat == 2 * k * n * m
    finally:
        g.close()
