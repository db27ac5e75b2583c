"""MOSS-TTS-Nano at the REAL dimensions (docs/upstream-notes.md §nano-1: 12 × 768 global GPT-2 +
RoPE, 1 local layer, 16 × 1024 codebooks, text vocab 16384, n_inner 3072), random weights: ms per
generated frame split into the global step, the 17-position depth loop (of which the audio heads),
sampling and Python overhead (wall − ggml compute); prefill of a 100-row prompt; first-audio
latency of a one-sentence prompt (prompt → prefill → 1 frame → codec streaming decode of that
frame with the real-dims Nano codec of bench/codec48k.py); RTF; f32, f16, q8_0. Then where the
time goes: 1 vs 2 threads, graph build per utterance, a cProfile of the frame loop.

    python bench/nano.py [--types f32,f16,q8_0] [--frames 120] [--warmup 10] [--threads 2]
                         [--no-profile] [--no-threads1] [--perf] [--upstream PY [--upstream-src DIR]]

With --upstream (the python of a venv with torch + transformers; torch is never a dependency of
the package), bench/upstream_nano.py times upstream's PyTorch prefill (f32) of the same 100 rows
on the same checkpoint (its docstring says what that includes); the report puts it beside ours
(upstream ÷ ours) with the parity of the last row's hidden state. Its modeling code comes from
--upstream-src DIR or $MOSS_TTS_UPSTREAM_NANO and is copied at run time into
bench/results/upstream_nano/ (gitignored).

First run: writes the random checkpoint (fixtures.make_nano, stop_bias −50 so the model never
stops) into bench/results/nano_real/ (gitignored) and converts it once per type with
converters.nano.convert; the real-dims Nano codec for first audio is built the same way (into
bench/results/codec48k/, shared with bench/codec48k.py) when missing. Every measurement runs in
a fresh subprocess (`--worker ...`) after waiting for a quiet machine (no other bench/ process,
other CPU use ≤ 15 %; see bench/codec48k.py `Quiet`), so peak RSS is its own and the "other
load" is reported.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import math
import pstats
import shlex
import statistics
import sys
import time
from contextlib import nullcontext
from collections import defaultdict
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.codec48k import ensure_gguf as ensure_codec_gguf
from bench.codec48k import gguf_path as codec_gguf_path
from bench.common import table
from bench.harness import (NANO_TTS, Contention, Driver, add_no_wait, counting,
                           gflop_per_call, measure_peak, of_peak, other_load, peak_rss_gb,
                           perf_top, publish, report_footer, start_line, timed_convert)
from bench.parity import rel_diff
from bench.upstream_nano import HIDDEN_FILE as UPSTREAM_HIDDEN
from bench.upstream_nano import ROWS_FILE as UPSTREAM_ROWS

WORK = ROOT / "bench" / "results" / "nano_real"
CKPT = WORK / "checkpoint"
FRAME_MS = 80.0
SENTENCE = "The quick brown fox reads a short sentence in the morning, with a calm voice."
PREFILL_ROWS = 100
# from the issue text (another machine; context only: the prefill is measured here against
# upstream with --upstream, the frame loop is not)
ISSUE = {"torch f32 ms/frame": 108, "torch prefill 100 rows ms": "143-177",
         "onnx ms/frame": "88-96", "bandwidth floor f32 ms/frame": 20}
# res key of upstream's prefill: a (what, op) pair like every other result, as render unpacks them
UPSTREAM_KEY = ("upstream", "prefill")
GOALS = {"f32": 30.0, "q8_0": 15.0, "prefill_ms": 50.0, "first_audio_ms": 250.0}
DIMS = {"n_vq": 16, "audio_vocab_size": 1024, "vocab_size": 16384, "stop_bias": -50.0,
        "n_embd": 768, "n_head": 12, "n_layer": 12, "n_inner": 3072}


def gguf_path(outtype: str) -> Path:
    return WORK / f"nano-{outtype}.gguf"


def make_checkpoint(log=print) -> Path:
    from fixtures.make_nano import make_tiny_nano_tts_checkpoint
    from fixtures.make_spm import make_tiny_spm

    if (CKPT / "model.safetensors").exists():
        return CKPT
    t0 = time.perf_counter()
    make_tiny_nano_tts_checkpoint(CKPT, tokenizer_model_bytes=make_tiny_spm(), seed=0, **DIMS)
    log(f"  checkpoint written in {time.perf_counter() - t0:.0f} s")
    return CKPT


# --- instrumentation (bench only: wraps package functions at run time) --------------------------


class Rec:
    """Accumulated seconds and call counts per key; `snap()` / `diff()` per frame."""

    def __init__(self):
        self.t = defaultdict(float)
        self.n = defaultdict(int)

    def add(self, key, dt):
        self.t[key] += dt
        self.n[key] += 1

    def snap(self):
        return dict(self.t), dict(self.n)

    @staticmethod
    def diff(a, b):
        return ({k: a[0].get(k, 0.0) - b[0].get(k, 0.0) for k in a[0]},
                {k: a[1].get(k, 0) - b[1].get(k, 0) for k in a[1]})


def _graph_kind(name: str) -> str:
    if name.startswith("nano.global"):   # DecodeSession names: nano.global[variant,rows x slots]
        return "global" if ",1x" in name else "prefill"
    if name.startswith("nano.depth"):
        return "depth"
    if name.startswith(("decoder", "encoder")):
        return "codec"
    return "other"


def instrument(rec: Rec) -> None:
    """Time Graph.run / compute / allocate per graph kind, NanoModel.prefill / depth_logits,
    graph building, the samplers NanoTTS calls, the codec stream push and NanoTTS.plan."""
    import moss_tts.codec.codec as codec_mod
    import moss_tts.models.nano as nano_mod
    import moss_tts.models.nano_decode as decode_mod
    import moss_tts.models.nano_tts as tts_mod
    from moss_tts.ggml.graph import Graph

    pc = time.perf_counter

    def wrap_method(cls, name, key_fn):
        orig = getattr(cls, name)

        def wrapped(self, *a, **kw):
            t0 = pc()
            try:
                return orig(self, *a, **kw)
            finally:
                rec.add(key_fn(self, *a), pc() - t0)
        setattr(cls, name, wrapped)

    def wrap_func(mod, name, key):
        orig = getattr(mod, name)

        def wrapped(*a, **kw):
            t0 = pc()
            try:
                return orig(*a, **kw)
            finally:
                rec.add(key, pc() - t0)
        setattr(mod, name, wrapped)

    wrap_method(Graph, "run", lambda g, *a: f"{_graph_kind(g.name)}.run")
    wrap_method(Graph, "compute", lambda g, *a: f"{_graph_kind(g.name)}.compute")
    wrap_method(Graph, "allocate", lambda g, *a: f"{_graph_kind(g.name)}.allocate")
    wrap_method(nano_mod.NanoModel, "prefill",
                lambda m, state, rows, *a: "global.wall" if len(rows) == 1 else "prefill.wall")
    wrap_method(nano_mod.NanoModel, "depth_logits", lambda *a: "depth.wall")
    wrap_func(nano_mod, "build_global_step", "build.global")
    wrap_func(nano_mod, "build_depth_step", "build.depth")
    wrap_func(decode_mod, "sample_audio_code", "sample.audio")    # FrameSampler's samplers
    wrap_func(decode_mod, "decide_continue", "sample.decide")
    wrap_method(tts_mod.NanoTTS, "plan", lambda *a: "plan.wall")
    wrap_method(codec_mod.StreamDecoder, "push", lambda *a: "codec.push")
    wrap_method(codec_mod._TowerRunner, "_build", lambda *a: "build.codec")
    wrap_method(nano_mod.NanoModel, "make_state", lambda *a: "make_state")
    wrap_method(codec_mod.Codec, "stream_decoder", lambda *a: "codec.stream_decoder")


def _med(xs):
    return statistics.median(xs) if xs else float("nan")


# --- workers --------------------------------------------------------------------------------------


def _load(args, codec=None):
    from moss_tts.models.nano_tts import NanoTTS

    t0 = time.perf_counter()
    tts = NanoTTS.load(gguf_path(args.type), codec=codec, threads=args.threads)
    return tts, time.perf_counter() - t0


def weight_bytes(tts) -> dict:
    """Bytes the matmuls of one step read: the 12 global layers; the local layer; one audio head;
    the text embedding table (only 2 rows of it are read per frame)."""
    tensors = tts.model.weights.file.tensors
    out = defaultdict(int)
    for name, info in tensors.items():
        if name.startswith("transformer.h."):
            out["global_layers"] += info.nbytes
        elif name.startswith("local_transformer.h."):
            out["local_layer"] += info.nbytes
        elif name == "audio_embeddings.0.weight":
            out["audio_head"] += info.nbytes
        elif name == "transformer.wte.weight":
            out["wte"] += info.nbytes
    return dict(out)


def worker_frames(args) -> dict:
    """Generate warmup + frames frames after the one-sentence prompt with NanoTTS.iter_frames
    (default SamplingOptions), per frame: wall, global step, depth loop, sampling, ggml compute."""
    from moss_tts.models.nano_tts import frame_budget

    rec = Rec()
    instrument(rec)
    c_all = Contention()
    tts, load_s = _load(args)
    rows = tts.plan(SENTENCE)[0][1]
    n = args.warmup + args.frames
    c = Contention()
    per = []
    t_prev = time.perf_counter()
    s_prev = rec.snap()
    t_start = t_prev
    nodes = {}
    # the frame budget NanoTTS.stream gives this text (it sizes the KV cache and the slots the
    # global step attends over); we stop after n frames
    budget = max(n, frame_budget(len(tts.tokenizer.encode(SENTENCE))))
    gen = tts.iter_frames(rows, seed=0, max_frames=budget)
    for codes in gen:
        t = time.perf_counter()
        s = rec.snap()
        dt, dn = Rec.diff(s, s_prev)
        per.append((t - t_prev, dt, dn))
        if len(per) == 3:  # the generator's state: node counts of the replayed graphs
            st = gen.gi_frame.f_locals["state"]
            steps = list(st.global_.step_graphs.items())
            nodes = {"global_step_nodes": steps[-1][1].n_nodes,
                     "depth_nodes": [g.n_nodes for g in list(st.depth.step_graphs.values())[:3]],
                     "global_slots": steps[-1][0][1]}
        if len(per) == n:
            break
        t_prev, s_prev = time.perf_counter(), rec.snap()
    gen.close()
    foreign = c.share()
    total_s = time.perf_counter() - t_start
    if len(per) < n:
        raise SystemExit(f"the model stopped after {len(per)} frames (stop_bias should prevent it)")
    first = per[0]
    steady = per[args.warmup:]

    def col(key, src=1):
        return [1e3 * f[src].get(key, 0.0) for f in steady]

    wall = [1e3 * f[0] for f in steady]
    compute = [1e3 * (f[1].get("global.compute", 0) + f[1].get("depth.compute", 0)) for f in steady]
    g_wall, d_wall = col("global.wall"), col("depth.wall")
    sample = [a + b for a, b in zip(col("sample.audio"), col("sample.decide"))]
    g_comp, d_comp = col("global.compute"), col("depth.compute")
    g_run, d_run = col("global.run"), col("depth.run")
    n_depth = _med([f[2].get("depth.wall", 0) for f in steady])
    out = {
        "type": args.type, "threads": args.threads, "load_s": load_s, "prompt_rows": len(rows),
        "frames": len(steady), "warmup": args.warmup,
        "ms_frame": _med(wall), "ms_frame_p90": float(np.percentile(wall, 90)),
        "ms_frame_mean": float(np.mean(wall)), "ms_frame_min": min(wall),
        "global_ms": _med(g_wall), "global_compute_ms": _med(g_comp), "global_run_ms": _med(g_run),
        "depth_ms": _med(d_wall), "depth_compute_ms": _med(d_comp), "depth_run_ms": _med(d_run),
        "depth_calls": n_depth, "sample_ms": _med(sample),
        "sample_audio_ms": _med(col("sample.audio")), "decide_ms": _med(col("sample.decide")),
        "compute_ms": _med(compute), "python_ms": _med([w - c for w, c in zip(wall, compute)]),
        "loop_other_ms": _med([w - g - d - s for w, g, d, s in zip(wall, g_wall, d_wall, sample)]),
        # first interval: state + graph builds + prefill of the prompt + frame 1
        "first_interval_ms": 1e3 * first[0],
        "first_prefill_ms": 1e3 * first[1].get("prefill.wall", 0.0),
        "first_build_depth_ms": 1e3 * first[1].get("build.depth", 0.0),
        "first_build_global_ms": 1e3 * (per[1][1].get("build.global", 0.0) + first[1].get("build.global", 0.0)),
        "first_depth_ms": 1e3 * first[1].get("depth.wall", 0.0),
        "first_alloc_ms": 1e3 * sum(v for k, v in first[1].items() if k.endswith(".allocate")),
        "second_interval_ms": 1e3 * per[1][0],
        "total_s": total_s, "foreign": foreign, "peak_rss_gb": peak_rss_gb(),
        "weight_bytes": weight_bytes(tts),
        "ms_frame_by_decile": [_med(wall[i:i + max(1, len(wall) // 10)])
                               for i in range(0, len(wall), max(1, len(wall) // 10))],
    }
    out |= nodes
    out |= micro_heads(tts, args)
    out["foreign_loop"] = foreign
    out["foreign"] = max(foreign, c_all.share())  # the micro graphs after the loop included
    return out


def micro_heads(tts, args) -> dict:
    """The depth step's parts as their own graphs (compute only, medians of 200 replays):
    the local layer + ln_f without a head; the 16 audio heads in one graph (÷ 16 = one head);
    a full depth step (as the model builds it)."""
    from moss_tts.ggml import I32, Graph, ops
    from moss_tts.models import gpt2
    from moss_tts.nn import CacheView

    m = tts.model
    w, cfg = m.w, m.config
    state = m.make_state(8)
    session = state.depth
    cache = session.cache
    d = cfg.local.n_embd
    rng = np.random.default_rng(0)

    def feed_for(g):
        f = {}
        for name, t in g.inputs.items():
            if name in ("depth.code", "depth.token"):
                f[name] = np.array([5], np.int32)
            elif name == "depth.decision_ids":
                f[name] = m.decision_ids
            elif name == "depth.pos" or name == "depth.slots":
                f[name] = np.array([2], np.int32)
            elif name == "depth.mask":
                f[name] = cache.mask([2], n_slots=t.ne[0], dtype=np.float16)
            else:
                f[name] = (0.5 * rng.standard_normal(t.shape)).astype(np.float32)
        return f

    def time_graph(g, reps=200):
        f = feed_for(g)
        g.run(f)
        ts = []
        for _ in range(reps):
            # inputs are rewritten before every compute: the allocator may reuse an input's
            # memory once its last reader ran, so replaying compute() alone reads garbage
            for name, v in f.items():
                g.set_input(name, v)
            t0 = time.perf_counter()
            g.compute()
            ts.append(time.perf_counter() - t0)
        run_ts = []
        for _ in range(50):
            t0 = time.perf_counter()
            g.run(f)
            run_ts.append(time.perf_counter() - t0)
        return 1e3 * _med(ts), 1e3 * _med(run_ts)

    cache.reserve([0, 1, 2])
    out = {}
    g = Graph(m.backend, name="micro.nohead")
    x = ops.get_rows(w.audio_embeddings[0], g.input("depth.code", (1,), I32))
    kv = CacheView.inputs(g, cache, 1, cache.capacity, prefix="depth")
    h = gpt2.forward(x, w.local_layers, w.local_ln_f, cfg.local, kv=kv, stage="micro")
    g.output(h, "h", ndim=1)
    g.build()
    out["micro_local_nohead_ms"], out["micro_local_nohead_run_ms"] = time_graph(g)
    g.close()
    g = Graph(m.backend, name="micro.heads16")
    x = g.input("x", (1, d))
    for c in range(cfg.n_vq):
        g.output(ops.mul_mat(w.audio_embeddings[c], x), f"l{c}", ndim=1)
    g.build()
    t16, _ = time_graph(g)
    out["micro_head_ms"] = t16 / cfg.n_vq
    g.close()
    g = session.step_graph(cache.capacity, 2)
    out["micro_depth_step_ms"], out["micro_depth_step_run_ms"] = time_graph(g)
    out["micro_depth_step_nodes"] = g.n_nodes
    state.close()
    return out


def _random_rows(cfg, n, rng):
    """n prompt rows: ~half text rows [tok, pad × 16], then audio rows [9, codes]."""
    rows = np.full((n, cfg.n_vq + 1), cfg.audio_pad_token_id, dtype=np.int32)
    n_text = n // 2
    rows[:n_text, 0] = rng.integers(10, cfg.vocab_size, n_text)
    rows[n_text:, 0] = cfg.audio_assistant_slot_token_id
    rows[n_text:, 1:] = rng.integers(0, cfg.audio_vocab_size, (n - n_text, cfg.n_vq))
    return rows


def prefill_matmuls(m, n_rows: int) -> dict:
    """The prefill's 48 weight matmuls alone (12 layers × c_attn, c_proj, fc_in, fc_out on
    n_rows rows), as one graph: how close the full prefill is to its matmul time."""
    from moss_tts.ggml import Graph, ops
    from moss_tts.nn import linear

    d = m.config.backbone.n_embd
    g = Graph(m.backend, name="micro.prefill_matmuls")
    y = g.input("x", (n_rows, d))
    for layer in m.w.layers:
        qkv = linear(y, layer.attn_c_attn_weight, layer.attn_c_attn_bias)
        o = linear(ops.cont(ops.view(qkv, (d, n_rows), (qkv.nb[1],))), layer.attn_c_proj_weight,
                   layer.attn_c_proj_bias)
        f = linear(linear(o, layer.mlp_fc_in_weight, layer.mlp_fc_in_bias), layer.mlp_fc_out_weight,
                   layer.mlp_fc_out_bias)
        y = ops.add(y, f)
    g.output(y, "y", ndim=2)
    g.build()
    x = (0.5 * np.random.default_rng(0).standard_normal((n_rows, d))).astype(np.float32)
    g.run({"x": x})
    ts = []
    for _ in range(7):
        g.set_input("x", x)
        t0 = time.perf_counter()
        g.compute()
        ts.append(time.perf_counter() - t0)
    g.close()
    params = sum(int(np.prod(s)) for s in (  # weights of the four matmuls, 12 layers
        (3 * d, d), (d, d), (m.config.backbone.ffn_dim, d), (d, m.config.backbone.ffn_dim)))
    gflop = 2.0 * params * len(m.w.layers) * n_rows / 1e9
    ms = 1e3 * _med(ts)
    return {"matmuls_ms": ms, "matmul_gflop": gflop, "matmul_gflops": gflop / (ms / 1e3)}


def worker_prefill(args) -> dict:
    """Prefill of a 100-row prompt into a fresh state (as NanoTTS does per utterance: graph
    built, allocated, run, freed); cold first call apart; the split build / compute / rest."""
    rec = Rec()
    instrument(rec)
    tts, _ = _load(args)
    m = tts.model
    rows = _random_rows(m.config, PREFILL_ROWS, np.random.default_rng(0))
    np.save(WORK / UPSTREAM_ROWS, rows)       # bench/upstream_nano.py prefills the same rows
    c = Contention()
    res = []
    work = None
    for i in range(args.runs + 1):
        state = m.make_state(PREFILL_ROWS + 28)
        s0 = rec.snap()
        # the work is counted on the cold call only: each fresh state builds a fresh graph,
        # whose node walk stays out of the warm times
        with counting() if i == 0 else nullcontext() as counted:
            t0 = time.perf_counter()
            hidden = m.prefill(state, rows)
            wall = time.perf_counter() - t0
        if i == 0:
            work = counted
        dt, _ = Rec.diff(rec.snap(), s0)
        res.append({"wall": 1e3 * wall, "compute": 1e3 * dt.get("prefill.compute", 0),
                    "build": 1e3 * dt.get("build.global", 0),
                    "alloc": 1e3 * dt.get("prefill.allocate", 0)})
        state.close()
    warm = res[1:]
    np.save(WORK / f"prefill_hidden_ggml_{args.type}.npy", hidden)   # for the parity with upstream
    mm = prefill_matmuls(m, PREFILL_ROWS)
    return {**mm, "type": args.type, "threads": args.threads, "rows": PREFILL_ROWS,
            "cold_ms": res[0]["wall"], "ms": _med([r["wall"] for r in warm]),
            "compute_ms": _med([r["compute"] for r in warm]),
            "build_ms": _med([r["build"] for r in warm]),
            "alloc_ms": _med([r["alloc"] for r in warm]),
            "runs_ms": [r["wall"] for r in warm], "foreign": c.share(), "peak_rss_gb": peak_rss_gb(),
            "gflop": gflop_per_call(work, 1)}


def worker_first_audio(args) -> dict:
    """NanoTTS.stream(one sentence) until its first audio chunk: text → rows, state, prefill,
    frame 1, codec stream decoder push of frame 1. First call in the process (cold: weights
    paged in, caches allocated, graphs built) and warm repeats (a new utterance each: the
    generation state and the codec stream decoder of the previous one are reset and reused)."""
    codec_path = codec_gguf_path("nano", args.codec_type)
    if not codec_path.exists():
        raise SystemExit(f"{codec_path} missing: bench/nano.py builds it before this worker runs")
    rec = Rec()
    instrument(rec)
    tts, load_s = _load(args, codec=str(codec_path))
    c = Contention()
    res = []
    for i in range(args.runs + 1):
        s0 = rec.snap()
        t0 = time.perf_counter()
        gen = tts.stream(SENTENCE, seed=i)       # default frame budget, as a user gets it
        audio = next(gen)
        wall = time.perf_counter() - t0
        dt, _ = Rec.diff(rec.snap(), s0)
        gen.close()
        frame = dt.get("depth.wall", 0) + dt.get("sample.audio", 0) + dt.get("sample.decide", 0)
        res.append({"wall": 1e3 * wall, "plan": 1e3 * dt.get("plan.wall", 0),
                    "prefill": 1e3 * dt.get("prefill.wall", 0),
                    "prefill_compute": 1e3 * dt.get("prefill.compute", 0),
                    "frame": 1e3 * frame, "build_depth": 1e3 * dt.get("build.depth", 0),
                    "codec_push": 1e3 * dt.get("codec.push", 0),
                    "codec_build": 1e3 * dt.get("build.codec", 0),
                    "codec_compute": 1e3 * dt.get("codec.compute", 0),
                    "make_state": 1e3 * dt.get("make_state", 0),
                    "stream_decoder_new": 1e3 * dt.get("codec.stream_decoder", 0),
                    "samples": int(audio.shape[0])})
    warm = res[1:]
    keys = [k for k in res[0] if k != "samples"]
    from moss_tts.models.nano_tts import frame_budget

    n_rows = len(tts.plan(SENTENCE)[0][1])
    return {"type": args.type, "codec": str(codec_path.name), "threads": args.threads,
            "prompt_rows": n_rows, "load_s": load_s,
            "kv_slots": n_rows + frame_budget(len(tts.tokenizer.encode(SENTENCE))),
            "cold": res[0], "warm": {k: _med([r[k] for r in warm]) for k in keys},
            "samples": res[0]["samples"], "foreign": c.share(), "peak_rss_gb": peak_rss_gb()}


def worker_profile(args) -> dict:
    """cProfile over the steady frame loop: where the Python time goes."""
    tts, _ = _load(args)
    rows = tts.plan(SENTENCE)[0][1]
    gen = tts.iter_frames(rows, seed=0, max_frames=args.warmup + args.frames)
    for _ in range(args.warmup):
        next(gen)
    prof = cProfile.Profile()
    t0 = time.perf_counter()
    prof.enable()
    n = 0
    for _ in gen:
        n += 1
    prof.disable()
    wall = time.perf_counter() - t0
    s = io.StringIO()
    st = pstats.Stats(prof, stream=s)
    st.sort_stats("tottime").print_stats(22)
    st.sort_stats("cumulative").print_stats(30)
    return {"frames": n, "profiled_ms_frame": 1e3 * wall / max(1, n), "text": s.getvalue()}


def worker_loop(args) -> dict:
    """For perf: the steady frame loop (warm-up frames, then `frames` frames) or `runs` prefills
    of 100 rows, nothing else timed."""
    tts, _ = _load(args)
    m = tts.model
    if args.op == "prefill":
        rows = _random_rows(m.config, PREFILL_ROWS, np.random.default_rng(0))
        for _ in range(args.runs + 1):
            st = m.make_state(PREFILL_ROWS + 28)
            m.prefill(st, rows)
            st.close()
        return {}
    gen = tts.iter_frames(tts.plan(SENTENCE)[0][1], seed=0, max_frames=args.warmup + args.frames)
    for _ in gen:
        pass
    return {}


def worker_convert(args) -> dict:
    from converters.nano import convert

    return timed_convert(convert, CKPT, gguf_path(args.type), args.type)


WORKERS = {"frames": worker_frames, "loop": worker_loop, "prefill": worker_prefill,
           "first_audio": worker_first_audio, "profile": worker_profile, "convert": worker_convert}


# --- driver -------------------------------------------------------------------------------------


def fmt(x, fmt="{:.1f}"):
    return "" if x is None or (isinstance(x, float) and math.isnan(x)) else fmt.format(x)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--types", default="f32,f16,q8_0")
    ap.add_argument("--frames", type=int, default=120)
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--codec-type", default="f32", help="Nano codec GGUF type for first audio")
    ap.add_argument("--no-profile", action="store_true")
    ap.add_argument("--no-threads1", action="store_true")
    add_no_wait(ap)
    ap.add_argument("--upstream", help="python of a venv with torch + transformers: also time "
                    "upstream's PyTorch prefill (f32) on the same checkpoint and rows")
    ap.add_argument("--upstream-src", default=None,
                    help=f"upstream MOSS-TTS-Nano checkout (default ${NANO_TTS.env})")
    ap.add_argument("--worker", choices=sorted(WORKERS), help=argparse.SUPPRESS)
    ap.add_argument("--type", default="f32", help=argparse.SUPPRESS)
    ap.add_argument("--op", default="frames", help=argparse.SUPPRESS)
    ap.add_argument("--perf", action="store_true",
                    help="attribute the frame loop (first and last type) and the f32 prefill with "
                         "`perf record` (top symbols over all threads)")
    args = ap.parse_args(argv)
    if args.worker:
        print(json.dumps(WORKERS[args.worker](args)))
        return 0
    return drive(args)


def drive(args) -> int:
    WORK.mkdir(parents=True, exist_ok=True)
    d = Driver(args, WORK / "log.txt", script=Path(__file__))
    d.say(start_line("bench/nano.py"))
    t_start = time.perf_counter()
    types = [t for t in args.types.split(",") if t]
    make_checkpoint(log=d.say)
    conv = {}
    for t in types:
        if not gguf_path(t).exists():
            conv[t] = d.worker("convert", timing=False, type=t)
            d.say(f"converted {t}: {json.dumps(conv[t])}")
    ensure_codec_gguf("nano", args.codec_type, log=d.say)   # first audio decodes with it
    for stale in [*WORK.glob("prefill_hidden_*.npy"), WORK / UPSTREAM_ROWS]:
        stale.unlink(missing_ok=True)     # parity only between outputs of this run
    base = {"threads": args.threads, "frames": args.frames, "warmup": args.warmup, "runs": args.runs}
    d.say(f"peak: {json.dumps(measure_peak(d, args.threads))}")
    res = {}
    for t in types:
        for what in ("frames", "prefill", "first_audio"):
            kw = {**base, "type": t}
            if what == "first_audio":
                kw["codec-type"] = args.codec_type
            r = d.worker(what, **kw)
            res[(t, what)] = r
            d.say(f"{t} {what}: {json.dumps({k: v for k, v in r.items() if k != 'text'})}")
    if args.upstream:
        res[UPSTREAM_KEY] = run_upstream(d, args)
        d.say(f"upstream prefill: {json.dumps(res[UPSTREAM_KEY])}")
    if not args.no_threads1:
        for t in dict.fromkeys([types[0], types[-1]]):
            r = d.worker("frames", **{**base, "threads": 1, "frames": 60, "type": t})
            res[(t, "frames1t")] = r
            d.say(f"{t} frames (1 thread): {json.dumps(r)}")
    if args.perf:
        jobs = [(t, "frames", {"frames": 300, "runs": 0}) for t in dict.fromkeys([types[0], types[-1]])]
        jobs.append((types[0], "prefill", {"frames": 0, "runs": 15}))
        for t, op, kw in jobs:
            cmd = [sys.executable, str(Path(__file__).resolve().relative_to(ROOT)), "--worker", "loop",
                   "--type", t, "--op", op, "--threads", str(args.threads), "--warmup", "10",
                   "--frames", str(kw["frames"]), "--runs", str(kw["runs"])]
            d.quiet.wait()
            d.commands.append("perf record -F 2000 -g -- " + " ".join(shlex.quote(c) for c in cmd))
            res[(t, "perf_" + op)] = perf_top(cmd, WORK / f"perf-{t}-{op}.data", n=16)
            d.say(f"perf {t} {op}:\n" + "\n".join(res[(t, "perf_" + op)]))
    if not args.no_profile:
        r = d.worker("profile", **dict(base, frames=40, type=types[0]))
        res[(types[0], "profile")] = r
        d.say(f"profile {types[0]}: {r.get('profiled_ms_frame', 0):.1f} ms/frame under cProfile\n"
              f"{r.get('text', r)}")
    measure_peak(d, args.threads)   # again: the best of the probes is the peak
    report = render(args, types, res, conv, d, time.perf_counter() - t_start)
    publish(d, report, WORK / "report.md")
    return 0


def run_upstream(d: Driver, args) -> dict:
    """bench/upstream_nano.py in the torch interpreter: upstream's prefill of the rows our
    prefill worker saved (it must have run first), same checkpoint, threads and runs."""
    if not (WORK / UPSTREAM_ROWS).exists():
        return {"error": f"no {UPSTREAM_ROWS}: our prefill worker did not run"}
    cmd = [args.upstream, "bench/upstream_nano.py", "--ckpt", str(CKPT.relative_to(ROOT)),
           "--work", str(WORK.relative_to(ROOT)), "--threads", str(args.threads),
           "--runs", str(max(5, args.runs))]
    if args.upstream_src:
        cmd += ["--upstream-src", args.upstream_src]
    return d.run(cmd)


def upstream_lines(types, res, d=None) -> list[str]:
    """The prefill against upstream PyTorch f32 (same run, checkpoint and rows): ms side by side,
    upstream ÷ ours, and the parity of the last row's hidden state."""
    up = res.get(UPSTREAM_KEY)
    if not up:
        return []
    L = ["### prefill of 100 rows against upstream PyTorch f32 (same run, same random weights "
         "and rows)"]
    if "ms" not in up:
        return L + [f"- upstream: {up}", ""]
    peak = getattr(d, "peak", None)
    f32_work = res.get(("f32", "prefill"), {}).get("gflop", {}).get("total")
    rows = [{"who": f"upstream torch {up['torch']} f32 ({up['attention']})", "prefill ms": f"{up['ms']:.1f}",
             "GFLOP/s (% of peak)": of_peak(f32_work, up["ms"] / 1e3, peak),
             "upstream ÷ ours": "", "runs ms": " ".join(f"{1e3 * x:.1f}" for x in up["warm_s"]),
             "cold ms": f"{1e3 * up['cold_s']:.0f}", "peak RSS GB": f"{up['peak_rss_gb']:.2f}",
             "other load %": f"{100 * up['foreign']:.0f}"}]
    for t in types:
        p = res.get((t, "prefill"), {})
        if "ms" in p:
            rows.append({"who": f"ggml {t}", "prefill ms": f"{p['ms']:.1f}",
                         "GFLOP/s (% of peak)": of_peak(p.get("gflop", {}).get("total"),
                                                        p["ms"] / 1e3, peak),
                         "upstream ÷ ours": f"{up['ms'] / p['ms']:.2f}x",
                         "runs ms": " ".join(f"{x:.1f}" for x in p["runs_ms"]),
                         "cold ms": f"{p['cold_ms']:.0f}", "peak RSS GB": f"{p['peak_rss_gb']:.2f}",
                         "other load %": f"{100 * p['foreign']:.0f}"})
    L.append(table(rows, list(rows[0])))
    L.append("(both: the rows' embedding (text + 16 masked audio tables), 12 layers over all rows "
             "keeping their K/V for the frames, ln_f, the last row's hidden state returned. Ours: "
             "NanoModel.prefill into a fresh state, graph build and allocation included; upstream: "
             "step 0 of _iter_generation_events, _build_inputs_embeds + the GPT-2 transformer with "
             "use_cache=True. Neither includes frame 1's local transformer)")
    ref = WORK / UPSTREAM_HIDDEN
    for t in types:
        ours = WORK / f"prefill_hidden_ggml_{t}.npy"
        if ref.exists() and ours.exists():
            r = rel_diff(np.load(ours), np.load(ref))
            L.append(f"- parity, last row's hidden state (after ln_f) ggml {t} vs upstream: max|Δ|/RMS "
                     f"{r['max_rel']:.2e}, RMS(Δ)/RMS {r['rms_rel']:.2e} (upstream RMS {r['ref_rms']:.3f}, "
                     f"{r['n']} values)")
    L.append(f"- upstream: commit {up['upstream_commit'][:12]}, load {up['load_s']:.1f} s, weights "
             f"{up['weight_gb']:.2f} GB, ignored on load: {', '.join(up['ignored']) or 'nothing'}")
    return L + [""]


def render(args, types, res, conv, d, total_s) -> str:
    L = [(f"## MOSS-TTS-Nano, real dims (12 × 768 global + 1 local layer, 16 × 1024 codebooks, "
          f"vocab 16384), random weights, {args.threads} threads"),
         (f"per-frame numbers: medians over {args.frames} frames after {args.warmup} warm-up frames "
          f"of NanoTTS.iter_frames (default SamplingOptions: sampled, top-k 25, top-p 0.95, "
          f"penalty 1.2); prefill / first audio: warm medians of {args.runs}"), ""]
    rows = []
    for t in types:
        f, p, a = (res.get((t, w), {}) for w in ("frames", "prefill", "first_audio"))
        goal = GOALS.get(t)
        ms = f.get("ms_frame")
        fa = a.get("warm", {}).get("wall")
        rows.append({
            "type": t,
            "ms/frame": fmt(ms) + ("" if goal is None or ms is None else (" OK" if ms <= goal else f" MISS (<= {goal:g})")),
            "p90": fmt(f.get("ms_frame_p90")),
            "RTF": fmt(None if ms is None else ms / FRAME_MS, "{:.3f}"),
            "global step": f"{fmt(f.get('global_ms'))} ({fmt(f.get('global_compute_ms'))})",
            "depth x17": f"{fmt(f.get('depth_ms'))} ({fmt(f.get('depth_compute_ms'))})",
            "heads x16": fmt(None if "micro_head_ms" not in f else 16 * f["micro_head_ms"]),
            "sampling": fmt(f.get("sample_ms")),
            "ggml compute": fmt(f.get("compute_ms")),
            "python": fmt(f.get("python_ms")),
            "prefill 100 ms": fmt(p.get("ms")) + ("" if p.get("ms") is None else
                                                (" OK" if p["ms"] <= GOALS["prefill_ms"] else " MISS")),
            "first audio ms": (fmt(fa, "{:.0f}") + ("" if fa is None else
                                                   (" OK" if fa <= GOALS["first_audio_ms"] else " MISS"))
                               + f" [cold {fmt(a.get('cold', {}).get('wall'), '{:.0f}')}]"),
            "peak RSS GB": fmt(f.get("peak_rss_gb"), "{:.2f}"),
            "other load % f/p/a": other_load(f, p, a),
        })
    L.append(table(rows, list(rows[0])))
    L.append("(global step / depth: wall incl. host work, (ggml compute); heads x16: the 16 audio head "
             "matmuls timed as their own graph; python = frame wall − ggml compute)")
    L.append(f"from the issue text (another machine, not measured here): upstream PyTorch f32 "
             f"{ISSUE['torch f32 ms/frame']} ms/frame, prefill {ISSUE['torch prefill 100 rows ms']} ms "
             f"for 100 rows; ONNX {ISSUE['onnx ms/frame']} ms/frame; bandwidth floor ≈ "
             f"{ISSUE['bandwidth floor f32 ms/frame']} ms f32; goals "
             f"≤ {GOALS['f32']:g} ms/frame f32, ≤ {GOALS['q8_0']:g} q8_0, prefill ≤ {GOALS['prefill_ms']:g} ms, "
             f"first audio ≤ {GOALS['first_audio_ms']:g} ms")
    L.append("")
    L.extend(upstream_lines(types, res, d))
    L.append("### where the frame time goes")
    for t in types:
        f = res.get((t, "frames"), {})
        if "ms_frame" not in f:
            L.append(f"- {t}: {f}")
            continue
        wb = f["weight_bytes"]
        gcomp, dcomp = f["global_compute_ms"], f["depth_compute_ms"]
        per_depth = dcomp / max(1, f["depth_calls"])
        L.append(
            f"- {t}: frame {f['ms_frame']:.1f} ms = global step {f['global_ms']:.2f} (compute "
            f"{gcomp:.2f}; {wb['global_layers'] / 1e6:.0f} MB of layer weights → "
            f"{wb['global_layers'] / 1e6 / max(gcomp, 1e-9):.1f} GB/s) + depth loop {f['depth_ms']:.2f} "
            f"({f['depth_calls']:.0f} calls; compute {dcomp:.2f} = {per_depth:.3f}/step; host "
            f"{(f['depth_ms'] - dcomp) / max(1, f['depth_calls']) * 1e3:.0f} µs/step of which "
            f"Graph.run−compute {(f['depth_run_ms'] - dcomp) / max(1, f['depth_calls']) * 1e3:.0f} µs) "
            f"+ sampling {f['sample_ms']:.2f} (audio {f['sample_audio_ms']:.2f}, decision "
            f"{f['decide_ms']:.3f}) + loop {f['loop_other_ms']:.2f}")
        L.append(
            f"  depth step parts (own graphs, compute only): local layer + ln_f without head "
            f"{f['micro_local_nohead_ms']:.3f} ms ({wb['local_layer'] / 1e6:.0f} MB weights), one audio "
            f"head {f['micro_head_ms']:.3f} ms ({wb['audio_head'] / 1e6:.1f} MB f32), full step "
            f"{f['micro_depth_step_ms']:.3f} ms / {f['micro_depth_step_run_ms']:.3f} ms via Graph.run "
            f"({f['micro_depth_step_nodes']} nodes; global step graph {f.get('global_step_nodes')} nodes "
            f"over {f.get('global_slots')} cache slots; loop-only other load {100 * f['foreign_loop']:.0f} %)")
        L.append(
            f"  first interval after load (state + graph builds + prompt prefill of {f['prompt_rows']} "
            f"rows + frame 1): {f['first_interval_ms']:.0f} ms (prefill {f['first_prefill_ms']:.0f}, "
            f"17 depth graph builds {f['first_build_depth_ms']:.0f}, depth loop {f['first_depth_ms']:.0f}, "
            f"allocations {f['first_alloc_ms']:.0f}); frame 2 {f['second_interval_ms']:.0f} ms "
            f"(global step graph build {f['first_build_global_ms']:.0f}); by decile "
            + " ".join(f"{x:.1f}" for x in f["ms_frame_by_decile"]))
        f1 = res.get((t, "frames1t"), {})
        if "ms_frame" in f1:
            L.append(f"  1 thread: {f1['ms_frame']:.1f} ms/frame (global {f1['global_ms']:.2f} / "
                     f"compute {f1['global_compute_ms']:.2f}, depth {f1['depth_ms']:.2f} / compute "
                     f"{f1['depth_compute_ms']:.2f}, sampling {f1['sample_ms']:.2f}); other load "
                     f"{100 * f1['foreign']:.0f} %")
    L.append("")
    L.append("### prefill (100 rows, fresh state as per utterance) and first audio")
    for t in types:
        p, a = res.get((t, "prefill"), {}), res.get((t, "first_audio"), {})
        if "ms" in p:
            L.append(f"- {t} prefill: {p['ms']:.1f} ms (compute {p['compute_ms']:.1f}, graph build "
                     f"{p['build_ms']:.1f}, allocation {p['alloc_ms']:.1f}); cold {p['cold_ms']:.0f} ms; "
                     f"runs " + " ".join(f"{x:.1f}" for x in p["runs_ms"])
                     + f"; its 48 weight matmuls alone: {p['matmuls_ms']:.1f} ms = {p['matmul_gflop']:.1f} "
                     f"GFLOP at {p['matmul_gflops']:.0f} GFLOP/s (goal 50 ms needs "
                     f"{p['matmul_gflop'] / 0.05:.0f} GFLOP/s for the matmuls alone)"
                     + (f"; the whole prefill's work (count_flops) {p['gflop']['total']:.1f} GFLOP "
                        f"at {of_peak(p['gflop']['total'], p['ms'] / 1e3, getattr(d, 'peak', None))} "
                        "GFLOP/s (% of peak)" if p.get("gflop") else ""))
        if "warm" in a:
            w, c0 = a["warm"], a["cold"]
            L.append(f"- {t} first audio ({a['prompt_rows']} prompt rows, KV cache of {a['kv_slots']} slots, "
                     f"codec {a['codec']}): warm "
                     f"{w['wall']:.0f} ms = plan {w['plan']:.1f} + prefill {w['prefill']:.1f} (compute "
                     f"{w['prefill_compute']:.1f}) + frame 1 {w['frame']:.1f} (of which 17 depth graph "
                     f"builds {w['build_depth']:.1f}) + codec push {w['codec_push']:.1f} (graph build "
                     f"{w['codec_build']:.1f}, compute {w['codec_compute']:.1f}) + rest "
                     f"{w['wall'] - w['plan'] - w['prefill'] - w['frame'] - w['codec_push']:.1f} (of which "
                     f"make_state {w['make_state']:.1f}, new stream decoder {w['stream_decoder_new']:.1f}); cold "
                     f"(first in process) {c0['wall']:.0f} ms (prefill {c0['prefill']:.0f}, frame "
                     f"{c0['frame']:.0f}, codec push {c0['codec_push']:.0f}); {a['samples']} samples")
        elif a:
            L.append(f"- {t} first audio: {a}")
    for (t, w), top in res.items():
        if w.startswith("perf_"):
            what = ("300 frames of the steady loop (after 10)" if w == "perf_frames"
                    else "16 prefills of 100 rows (fresh state each)")
            L.append("")
            L.append(f"### perf, {t}, {what}: top symbols by self time over all threads (startup included)")
            L.extend("    " + x for x in top)
    prof = next((r for (t, w), r in res.items() if w == "profile"), None)
    if prof and "text" in prof:
        L.append("")
        L.append(f"### cProfile of the steady frame loop ({types[0]}, {prof['frames']} frames, "
                 f"{prof['profiled_ms_frame']:.1f} ms/frame under the profiler)")
        L.extend("    " + line for line in prof["text"].splitlines() if line.strip())
    L.append("")
    L.extend(report_footer(d, total_s, conv))
    return "\n".join(L)


if __name__ == "__main__":
    raise SystemExit(main())
