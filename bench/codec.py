"""MOSS-Audio-Tokenizer (24 kHz v1) at the REAL config.json dimensions, random weights:
encode / decode of 10 s in f32, f16, q8_0 — RTF, peak RSS, time per chunk and per stage,
streaming decode cost per frame, a chunk_seconds sweep — and, side by side, upstream PyTorch
(f32) on the same weights, with a real-dimension parity check (codes and decoded audio).

    python bench/codec.py [--upstream /tmp/torchvenv/bin/python] [--types f32,f16,q8_0]
                          [--chunks 1,2,5,10] [--runs 3] [--threads 2] [--upstream-src DIR]

The real config.json (first run) and, with --upstream, the upstream modeling code come from a
checkout of the upstream codec: --upstream-src DIR or $MOSS_TTS_UPSTREAM_CODEC (a clone of
GitHub OpenMOSS/MOSS-Audio-Tokenizer, or the Hugging Face repo's files without the weights).

First run: writes a random ~7 GB f32 checkpoint (the upstream key layout: v1 names, weight-norm
pairs for the quantizer projections, identity projections absent) into bench/results/codec_real/
(gitignored), then converts it once per type with `converters.codec.convert`; both are reused.
Every measurement runs in a fresh subprocess (`--worker ...`), so its peak RSS (VmHWM) is its
own; each also reports the CPU share other processes took meanwhile ("other load": the machine
is shared, and ggml's spinning threads slow down several-fold when a core is taken), and a
disturbed measurement is repeated. Upstream runs through bench/upstream_codec.py in the
interpreter given by --upstream (a venv with torch; torch is never a dependency of the package).

Also: one graph per stage (time per stage, GFLOP/s), and inside the encoder's first and last
transformer stage the matmuls / attention / GELU / norms as separate graphs (`--worker ops`).
Report: bench/results/codec_real/report.md (+ log.txt with every worker's JSON).

Longer than the 600-line guide (C2) because it is one self-contained driver: the subprocess
workers and the report share their data structures. The random checkpoint's tensor plan is
bench/codec_checkpoint.py (shared with bench/codec48k.py); the measuring harness and the
report's shared pieces are bench/harness.py.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.codec_checkpoint import INDEX_FILE, V1, checkpoint_plan, write_sharded
from bench.common import cpu_line, table
from bench.harness import (
    RETRY_FOREIGN,
    UPSTREAM_ENV,
    Contention,
    add_no_wait,
    conversion_lines,
    counting,
    fmt,
    gflop_per_call,
    measure_peak,
    median,
    of_peak,
    other_load,
    peak_line,
    peak_rss_gb,
    publish,
    rtf,
    run_lines,
    run_worker,
    start_line,
    timed_convert,
    timed_runs,
    upstream_file,
    upstream_source,
)
from bench.parity import codec_parity_lines

WORK = ROOT / "bench" / "results" / "codec_real"
CKPT = WORK / "checkpoint"
SECONDS = 10.0
SAMPLE_RATE = 24000
STREAM_FRAMES = 50
STREAM_ALT_CHUNK = 1.0
TARGETS = {"f32": 2.4, "f16": 1.3}   # s for 10 s, encode and decode each


# --- the real config and a random checkpoint with its exact key layout --------------------------


def real_config(upstream_src: str | None = None) -> dict:
    """config.json of OpenMOSS/MOSS-Audio-Tokenizer, from the upstream source (--upstream-src or
    $MOSS_TTS_UPSTREAM_CODEC; cached beside the checkpoint so later runs do not need it)."""
    cached = CKPT / "config.json"
    if cached.exists():
        return json.loads(cached.read_text())
    return json.loads(upstream_file(upstream_source(upstream_src), "config.json"))


def make_real_checkpoint(out_dir: Path = CKPT, config: dict | None = None, *, seed: int = 0,
                         log=print) -> Path:
    """config.json + sharded safetensors (+ index) of random weights at the real dims, in the
    v1 key layout (bench/codec_checkpoint.py). Reused when the index already exists."""
    out_dir = Path(out_dir)
    if (out_dir / INDEX_FILE).exists():
        return out_dir
    config = real_config() if config is None else config
    return write_sharded(out_dir, config, checkpoint_plan(config, V1), seed=seed, log=log)


def gguf_path(outtype: str) -> Path:
    return WORK / f"codec-{outtype}.gguf"


# --- inputs shared with upstream ------------------------------------------------------------------


def make_inputs(seconds: float = SECONDS, n_q: int = 32, codebook_size: int = 1024) -> dict:
    """audio.npy: a sum of sines + noise (peak ≈ 0.3) at 24 kHz; codes.npy: random codes
    [n_q, frames] for decode. Deterministic; rewritten only if absent."""
    audio_p, codes_p = WORK / "audio.npy", WORK / "codes.npy"
    n = round(seconds * SAMPLE_RATE)
    if not audio_p.exists() or np.load(audio_p).shape[0] != n:
        rng = np.random.default_rng(1)
        t = np.arange(n) / SAMPLE_RATE
        x = sum(a * np.sin(2 * np.pi * f * t + ph) for a, f, ph in
                ((0.08, 220.0, 0.0), (0.05, 523.3, 1.0), (0.03, 1760.0, 2.0), (0.02, 3100.0, 0.5)))
        x = x * (0.6 + 0.4 * np.sin(2 * np.pi * 0.7 * t)) + 0.1 * rng.standard_normal(n) * 0.3
        np.save(audio_p, x.astype(np.float32))
    frames = n // 1920
    if not codes_p.exists() or np.load(codes_p).shape != (n_q, frames):
        rng = np.random.default_rng(2)
        np.save(codes_p, rng.integers(0, codebook_size, size=(n_q, frames), dtype=np.int32))
    return {"audio": audio_p, "codes": codes_p}


# --- workers (each in its own process) --------------------------------------------------------------


def worker_convert(args) -> dict:
    from converters.codec import convert

    return timed_convert(convert, CKPT, gguf_path(args.type), args.type)


def _load(args):
    from moss_tts.codec import Codec

    t0 = time.perf_counter()
    codec = Codec.load(gguf_path(args.type), threads=args.threads, chunk_seconds=args.chunk)
    return codec, time.perf_counter() - t0


def _runner_memory(codec, tower: str) -> dict:
    r = codec._runners.get(tower)
    if r is None:
        return {}
    return {"compute_buffer_mib": r.allocator.buffer_size / 2**20,
            "kv_cache_mib": sum(c.nbytes for c in r.state.caches.values()) / 2**20}


def run_summary(load_s, totals, chunks, foreign, codec, tower) -> dict:
    warm = totals[1:] or totals
    wchunks = chunks[1:] or chunks
    return {"load_s": load_s, "cold_s": totals[0], "warm_s": warm, "median_s": median(warm),
            "min_s": min(warm),
            "chunk_ms": [1e3 * median([c[i] for c in wchunks]) for i in range(len(chunks[0]))],
            "cold_chunk_ms": [1e3 * x for x in chunks[0]],
            "foreign": median(foreign[1:] or foreign), "cold_foreign": foreign[0],
            "peak_rss_gb": peak_rss_gb(),
            "weight_gb": codec.weights.nbytes / 1e9, **_runner_memory(codec, tower)}


def worker_encode(args) -> dict:
    codec, load_s = _load(args)
    audio = np.load(WORK / "audio.npy")
    with counting() as work:
        totals, chunks, foreign, codes = timed_runs(
            lambda p: codec.encode(audio, SAMPLE_RATE, progress=p), args.runs)
    if args.save:
        np.save(WORK / f"codes_ggml_{args.type}.npy", codes)
    return run_summary(load_s, totals, chunks, foreign, codec, "encoder") | {
        "gflop": gflop_per_call(work, len(totals))}


def worker_decode(args) -> dict:
    codec, load_s = _load(args)
    codes = np.load(WORK / "codes.npy")
    with counting() as work:
        totals, chunks, foreign, audio = timed_runs(lambda p: codec.decode(codes, progress=p),
                                                     args.runs)
    if args.save:
        np.save(WORK / f"audio_ggml_{args.type}.npy", audio[:, 0])
    return run_summary(load_s, totals, chunks, foreign, codec, "decoder") | {
        "gflop": gflop_per_call(work, len(totals))}


def worker_stream(args) -> dict:
    """StreamDecoder.push of one frame at a time: the first push (graph build) apart, then the
    median over the rest; and the check that the concatenation equals decode()."""
    codec, load_s = _load(args)
    codes = np.load(WORK / "codes.npy")[:, :STREAM_FRAMES]
    sd = codec.stream_decoder()
    times, parts = [], []
    c = Contention()
    for t in range(codes.shape[1]):
        t0 = time.perf_counter()
        parts.append(sd.push(codes[:, t:t + 1]))
        times.append(time.perf_counter() - t0)
    foreign = c.share()
    streamed = np.concatenate(parts)
    whole = codec.decode(codes)
    diff = float(np.max(np.abs(streamed - whole)) / (np.sqrt(np.mean(whole ** 2)) + 1e-30))
    r = sd._runner
    return {"load_s": load_s, "first_ms": 1e3 * times[0], "median_ms": 1e3 * median(times[1:]),
            "p90_ms": 1e3 * float(np.percentile(times[1:], 90)),
            "frame_ms": 1e3 / codec.config.frame_rate, "stream_vs_decode_rel": diff,
            "foreign": foreign, "threads": args.threads,
            "peak_rss_gb": peak_rss_gb(), "compute_buffer_mib": r.allocator.buffer_size / 2**20,
            "kv_cache_mib": sum(c.nbytes for c in r.state.caches.values()) / 2**20}


def _advance(state, n_frames: int):
    """(slot counts, host feed) of the next chunk; works with TowerState before and after it
    learned to attend over only the filled prefix of its rings (slot_counts)."""
    if hasattr(state, "slot_counts"):
        counts = state.slot_counts(n_frames)
        return counts, state.advance(n_frames, counts)
    return None, state.advance(n_frames)


def _graph_inputs(state, g, n_frames: int, counts):
    return state.graph_inputs(g, n_frames) if counts is None else \
        state.graph_inputs(g, n_frames, counts)


def _attention_inputs(inp: dict) -> dict:
    return {"n_slots": None} | inp      # older TowerState inputs carry no n_slots


# -- per-stage timing: one graph per stage, chained on the host, same chunking and caches --------


def _segments(codec, tower: str) -> list[tuple[str, list[int]]]:
    """Stage indices grouped into timed segments: each transformer with the patch stages before
    it (and, for the decoder, the final patch after it); the quantizer is its own segment."""
    from moss_tts.codec.config import PATCH

    stages = getattr(codec.config, tower)
    segs, pending = [], []
    for i, s in enumerate(stages):
        pending.append(i)
        if s.kind != PATCH:
            segs.append(pending)
            pending = []
    if pending:
        segs[-1].extend(pending)
    named = []
    for idx in segs:
        t = next(i for i in idx if stages[i].kind != PATCH)
        s = stages[t]
        named.append((f"{tower}.{t} d{s.d_model} L{s.n_layers} {s.in_dim}->{s.out_dim}", idx))
    return named


def _stage_flops(cfg, tower: str, n_frames: int) -> dict[int, float]:
    """Useful FLOPs per transformer stage: matmuls (2·params·positions) + attention over each
    query's causal window only (count_flops, in the main table, counts every slot a graph is
    given instead)."""
    from moss_tts.codec.config import TRANSFORMER
    from moss_tts.codec.tower import positions_per_frame

    per = positions_per_frame(cfg, tower)
    out = {}
    for i, s in enumerate(getattr(cfg, tower)):
        if s.kind != TRANSFORMER:
            continue
        t = n_frames * per[i]
        d, f = s.d_model, s.ffn
        params = s.n_layers * (4 * d * d + 2 * d * f)
        params += (d * s.in_dim if s.has_input_proj else 0) + (d * s.out_dim if s.has_output_proj else 0)
        keys = sum(min(q + 1, s.context) for q in range(t))      # causal window, total
        out[i] = 2.0 * params * t + s.n_layers * 4.0 * d * keys
    return out


def worker_stages(args) -> dict:
    """Encode (or decode) the 10 s through one graph per stage; returns ms per stage (median of
    warm runs), the sum vs the whole-graph time, and that the chained result equals the runner's."""
    from moss_tts.codec import rlfq
    from moss_tts.codec.tower import TowerState, transformer_stage
    from moss_tts.ggml import I32, Allocator, Graph
    from moss_tts.nn.patch import patchify, unpatchify

    codec, _ = _load(args)
    cfg, tower = codec.config, args.tower
    stages = codec._encoder if tower == "encoder" else codec._decoder
    n_q = cfg.n_quantizers
    chunk = codec.chunk_frames
    state = TowerState(cfg, tower, chunk, codec.backend)
    graphs: dict = {}
    segs = _segments(codec, tower)
    names = [n for n, _ in segs]
    if tower == "encoder":
        names.append("quantizer (rlfq, 32 codebooks)")
    else:
        names.insert(0, "dequantizer (32 codebooks)")

    def build(seg: int, n: int, x_shape, counts):
        # its own allocator, so the segments stay independent (before 4ee0250, graphs sharing
        # one and replayed after another grew its buffer ran on freed memory)
        g = Graph(codec.backend, name=f"seg{seg}[{n}]", allocator=Allocator(codec.backend))
        inputs = _graph_inputs(state, g, n, counts)
        if tower == "encoder" and seg == len(segs):
            z = g.input("x", x_shape)
            for i, k in enumerate(rlfq.quantize(z, codec.weights, codec.tables, n_q)):
                g.output(k, f"codes.{i}", ndim=1)
            return g.build()
        if tower == "decoder" and seg == -1:
            ids = g.input("ids", (n_q * n,), I32)            # rlfq.stacked_ids of the chunk
            g.output(rlfq.dequantize(ids, n_q, codec.weights, codec.tables), "y", ndim=2)
            return g.build()
        x = g.input("x", x_shape)
        for i in segs[seg][1]:
            st = stages[i]
            if hasattr(st, "layers"):
                x = transformer_stage(x, st, cfg, caches=state.caches[i], inputs=inputs[i],
                                      name=f"{tower}.{i}")
            else:
                x = patchify(x, st.patch) if tower == "encoder" else unpatchify(x, st.patch)
        g.output(x, "y", ndim=2)
        return g.build()

    def run(seg, n, feed, x, counts):
        key = (seg, n, None if x is None else x.shape, counts)
        if key not in graphs:
            graphs[key] = build(seg, n, None if x is None else x.shape, counts)
        t0 = time.perf_counter()
        out = graphs[key].run(feed | ({} if x is None else {"x": x}))
        return out, time.perf_counter() - t0

    audio = np.load(WORK / "audio.npy")
    codes_in = np.load(WORK / "codes.npy")
    n_frames = codes_in.shape[1] if tower == "decoder" else audio.shape[0] // cfg.downsample_rate
    spf = cfg.stream_samples_per_frame
    stream = audio[: n_frames * cfg.downsample_rate].reshape(-1, 1)
    runs_ms, foreign = [], []
    final = None
    for _ in range(args.runs + 1):
        c = Contention()
        state.reset()
        per = [0.0] * len(names)
        host = 0.0
        outs = []
        for start in range(0, n_frames, chunk):
            f = min(chunk, n_frames - start)
            t_host = time.perf_counter()
            counts, feed = _advance(state, f)
            host += time.perf_counter() - t_host
            if tower == "encoder":
                x = stream[start * spf:(start + f) * spf]
                for k in range(len(segs)):
                    o, dt = run(k, f, feed, x, counts)
                    x, per[k] = o["y"], per[k] + dt
                o, dt = run(len(segs), f, feed, x, counts)
                per[-1] += dt
                outs.append(np.stack([o[f"codes.{i}"] for i in range(n_q)]))
            else:
                cfeed = {"ids": rlfq.stacked_ids(codes_in[:n_q, start:start + f],
                                                 cfg.codebook_size)}
                o, dt = run(-1, f, feed | cfeed, None, counts)
                x, per[0] = o["y"], per[0] + dt
                for k in range(len(segs)):
                    o, dt = run(k, f, feed, x, counts)
                    x, per[k + 1] = o["y"], per[k + 1] + dt
                outs.append(x.reshape(-1))
        runs_ms.append([1e3 * p for p in per] + [1e3 * host])
        foreign.append(c.share())
        final = np.concatenate(outs, axis=-1)
    names.append("host: slots + masks (TowerState.advance)")
    warm = runs_ms[1:] or runs_ms
    stage_ms = [median([r[k] for r in warm]) for k in range(len(names))]
    # the whole-graph runner on the same input, for the split's overhead and the equality check
    call = ((lambda: codec.encode(audio, SAMPLE_RATE)) if tower == "encoder"
            else (lambda: codec.decode(codes_in)[:, 0]))
    call()
    whole_times = []
    for _ in range(max(1, args.runs)):
        t0 = time.perf_counter()
        whole = call()
        whole_times.append(time.perf_counter() - t0)
    whole_s = median(whole_times)
    if tower == "encoder":
        same = float(np.mean(whole == final))
    else:
        same = float(np.max(np.abs(whole - final)) / (np.sqrt(np.mean(whole ** 2)) + 1e-30))
    flops = _stage_flops(cfg, tower, n_frames)
    tf_idx = [next(i for i in idx if i in flops) for _, idx in segs]
    gflops = [flops[i] / 1e9 for i in tf_idx]
    if tower == "encoder":
        gflops.append(None)
    else:
        gflops.insert(0, None)
    gflops.append(None)
    return {"names": names, "stage_ms": stage_ms, "gflop": gflops, "sum_ms": sum(stage_ms),
            "whole_ms": 1e3 * whole_s, "match": same, "foreign": median(foreign[1:] or foreign)}


def worker_ops(args) -> dict:
    """Inside one encoder transformer stage at the steady-state chunk (full window): the same
    layer count of (a) the whole stage, (b) its four matmuls only, (c) attention only (RoPE, KV
    write, flash attention over the ring), (d) exact-erf GELU only, (e) norms + layer scales +
    residual adds, each as its own graph; ms per chunk and scaled to the 10 s input."""
    from moss_tts.codec.tower import TowerState, positions_per_frame, transformer_stage
    from moss_tts.ggml import Allocator, Graph, ops
    from moss_tts.nn import cached_self_attention, layer_norm, layer_scale, linear

    codec, _ = _load(args)
    cfg, i = codec.config, args.stage
    stage = codec._encoder[i]
    s = stage.config
    chunk = codec.chunk_frames
    n_frames = round(SECONDS * cfg.frame_rate)
    n_chunks = math.ceil(n_frames / chunk)
    state = TowerState(cfg, "encoder", chunk, codec.backend)
    t = chunk * positions_per_frame(cfg, "encoder")[i]
    for _ in range(n_chunks - 1):
        _advance(state, chunk)        # the last chunk: every query sees a full (or the longest) window
    counts, feed = _advance(state, chunk)
    d, nl = s.d_model, s.n_layers
    rng = np.random.default_rng(0)

    def build(kind):
        g = Graph(codec.backend, name=kind, allocator=Allocator(codec.backend))
        inp = _attention_inputs(_graph_inputs(state, g, chunk, counts)[i])
        if kind == "stage":
            x = g.input("x", (t, s.in_dim))
            stage_inp = inp if counts is not None else {k: v for k, v in inp.items() if k != "n_slots"}
            y = transformer_stage(x, stage, cfg, caches=state.caches[i], inputs=stage_inp, name="s")
        elif kind == "stage_no_attention":
            # the whole stage with attention replaced by the q rows (no RoPE, cache, softmax)
            x = g.input("x", (t, s.in_dim))
            y = linear(x, stage.input_proj) if stage.input_proj is not None else x
            for w in stage.layers:
                h = layer_norm(y, w.norm1_weight, w.norm1_bias, eps=cfg.norm_eps)
                qkv = linear(h, w.self_attn_in_proj_weight)
                o = ops.cont(ops.view(qkv, (d, t), (qkv.nb[1],)))
                y = y + layer_scale(linear(o, w.self_attn_out_proj_weight), w.layer_scale_1_scale)
                h = layer_norm(y, w.norm2_weight, w.norm2_bias, eps=cfg.norm_eps)
                y = y + layer_scale(linear(ops.gelu_erf(linear(h, w.ffn_0_weight)), w.ffn_2_weight),
                                    w.layer_scale_2_scale)
            if stage.output_proj is not None:
                y = linear(y, stage.output_proj)
        elif kind == "matmuls":
            x = y = g.input("x", (t, d))
            for w in stage.layers:
                qkv = linear(y, w.self_attn_in_proj_weight)
                o = linear(y, w.self_attn_out_proj_weight)
                f = linear(linear(y, w.ffn_0_weight), w.ffn_2_weight)
                y = ops.add(ops.add(o, f), ops.view(qkv, (d, t), (qkv.nb[1],)))
        elif kind == "attention":
            qkv = g.input("x", (t, 3 * d))
            y = None
            for il in range(nl):
                o = cached_self_attention(qkv, state.caches[i], il, n_heads=s.n_heads,
                                          rope_mode="normal", rope_base=cfg.rope_base, **inp)
                y = o if y is None else ops.add(y, o)
        elif kind == "gelu_erf":
            y = g.input("x", (t, s.ffn))
            for _ in range(nl):
                y = ops.gelu_erf(y)
        elif kind == "gelu_tanh_table":
            y = g.input("x", (t, s.ffn))
            for _ in range(nl):
                y = ops.gelu_tanh(y, table=True)
        else:  # norms + layer scale + residual
            y = g.input("x", (t, d))
            for w in stage.layers:
                y = ops.add(y, layer_scale(layer_norm(y, w.norm1_weight, w.norm1_bias), w.layer_scale_1_scale))
                y = ops.add(y, layer_scale(layer_norm(y, w.norm2_weight, w.norm2_bias), w.layer_scale_2_scale))
        g.output(y, "y", ndim=2)
        return g.build(), g.inputs["x"].shape

    out = {"name": f"encoder.{i} d{d} L{nl} ffn{s.ffn}", "positions_per_chunk": t,
           "chunks_per_10s": n_chunks, "window": s.context, "ring": state.caches[i].capacity}
    kinds = ("stage", "stage_no_attention", "matmuls", "attention", "gelu_erf",
             "gelu_tanh_table", "norms")
    c = Contention()
    for kind in (args.kinds.split(",") if getattr(args, "kinds", None) else kinds):
        g, shape = build(kind)
        x = (0.5 * rng.standard_normal(shape)).astype(np.float32)
        times = []
        for _ in range(max(3, args.runs) + 1):
            t0 = time.perf_counter()
            g.run(feed | {"x": x})
            times.append(time.perf_counter() - t0)
        out[kind] = 1e3 * median(times[1:])
    out["foreign"] = c.share()
    return out


WORKERS = {"convert": worker_convert, "encode": worker_encode, "decode": worker_decode,
           "stream": worker_stream, "stages": worker_stages, "ops": worker_ops}


# --- the driver -----------------------------------------------------------------------------------

RETRIES, RETRY_WAIT_S = 3, 15   # more patient than the harness default: this bench runs long


class Driver:
    def __init__(self, args):
        self.args = args
        self.commands: list[str] = []
        self.log_path = WORK / "log.txt"

    def say(self, msg: str) -> None:
        print(msg, flush=True)
        with open(self.log_path, "a") as f:
            f.write(msg + "\n")

    def worker(self, mode: str, **kw) -> dict:
        cmd = [sys.executable, str(Path(__file__).relative_to(ROOT)), "--worker", mode,
               "--threads", str(kw.pop("threads", self.args.threads)),
               "--runs", str(kw.pop("runs", self.args.runs))]
        for k, v in kw.items():
            if v is True:
                cmd.append(f"--{k}")
            elif v is not None and v is not False:
                cmd += [f"--{k}", str(v)]
        return self.run(cmd)

    def run(self, cmd: list[str]) -> dict:
        """Run a measuring subprocess; once more if the machine was busy meanwhile (keeping the
        less disturbed result)."""
        out = self._run(cmd)
        for _ in range(0 if getattr(self.args, "no_wait", False) else RETRIES):   # --no-wait
            if out.get("foreign", 0) <= RETRY_FOREIGN:
                break
            self.say(f"  (other processes used {100 * out['foreign']:.0f} % of the CPUs: waiting "
                     f"{RETRY_WAIT_S} s, measuring again)")
            time.sleep(RETRY_WAIT_S)
            again = self._run(cmd, record=False)
            if again.get("foreign", 1) < out["foreign"]:
                out = again
        return out

    def _run(self, cmd: list[str], record=True) -> dict:
        line = " ".join(shlex.quote(c) for c in cmd)
        if record:
            self.commands.append(line)
        return run_worker(cmd, line, self.say)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--upstream", help="python of a venv with torch + transformers")
    ap.add_argument("--upstream-src", default=None,
                    help=f"upstream MOSS-Audio-Tokenizer checkout (default ${UPSTREAM_ENV}): its "
                         "config.json on the first run, its modeling code for --upstream")
    ap.add_argument("--types", default="f32,f16,q8_0")
    ap.add_argument("--chunks", default="1,2,5,10", help="chunk_seconds values to sweep")
    ap.add_argument("--chunk", type=float, default=None,
                    help="chunk_seconds of the main table (default: the package's CHUNK_SECONDS)")
    ap.add_argument("--sweep-types", default="f32,f16,q8_0", help="types the chunk sweep covers")
    ap.add_argument("--upstream-chunk", type=float, default=2.0,
                    help="also time upstream's own chunked mode (chunk_duration); 0: skip")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--no-stages", action="store_true")
    add_no_wait(ap)
    ap.add_argument("--worker", choices=sorted(WORKERS), help=argparse.SUPPRESS)
    ap.add_argument("--type", default="f32", help=argparse.SUPPRESS)
    ap.add_argument("--tower", default="encoder", help=argparse.SUPPRESS)
    ap.add_argument("--stage", type=int, default=1, help=argparse.SUPPRESS)
    ap.add_argument("--kinds", help=argparse.SUPPRESS)
    ap.add_argument("--save", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:
        print(json.dumps(WORKERS[args.worker](args)))
        return 0
    return drive(args)


def drive(args) -> int:
    from moss_tts.codec import codec as codec_module

    WORK.mkdir(parents=True, exist_ok=True)
    if args.chunk is None:  # the package's default for this codec (100 Hz stages → 10 s)
        args.chunk = float(codec_module.CHUNK_SECONDS_RANGE[1])
    d = Driver(args)
    d.say(start_line("bench/codec.py"))
    types = [t for t in args.types.split(",") if t]
    chunks = [float(c) for c in args.chunks.split(",") if c]
    sweep_types = [t for t in args.sweep_types.split(",") if t in types]
    t_start = time.perf_counter()

    # 1. checkpoint and GGUFs (once)
    if not (CKPT / INDEX_FILE).exists():
        free = os.statvfs(WORK).f_bavail * os.statvfs(WORK).f_frsize
        if free < 25e9:
            d.say(f"only {free / 1e9:.0f} GB free: need ~7 GB checkpoint + ~13 GB of GGUFs")
            return 1
        d.say(f"writing the random real-size checkpoint into {CKPT} ...")
        make_real_checkpoint(CKPT, config=real_config(args.upstream_src), log=d.say)
    ckpt_gb = sum(p.stat().st_size for p in CKPT.glob("*.safetensors")) / 1e9
    conv = {}
    for t in types:
        if not gguf_path(t).exists():
            d.say(f"converting to {t} ...")
            conv[t] = d.worker("convert", type=t, runs=0)
            d.say(f"  {t}: {conv[t]}")
    make_inputs()
    for stale in WORK.glob("*_upstream*.npy"):
        stale.unlink()
    for stale in WORK.glob("*_ggml_*.npy"):
        stale.unlink()

    # 2. main table at the default chunk: encode, decode (fresh process each), stream; the
    #    host's GEMM peak first, for the GFLOP/s column
    d.say(f"peak: {json.dumps(measure_peak(d, args.threads))}")
    res = {}
    for t in types:
        res[t] = {}
        for what in ("encode", "decode"):
            res[t][what] = d.worker(what, type=t, chunk=args.chunk, save=True)
            d.say(f"{t} {what}: {json.dumps(res[t][what])}")
        for th in dict.fromkeys([args.threads, 1]):
            res[t][f"stream{th}"] = d.worker("stream", type=t, chunk=args.chunk, runs=0, threads=th)
            d.say(f"{t} stream ({th} thread(s)): {json.dumps(res[t][f'stream{th}'])}")
        if args.chunk != STREAM_ALT_CHUNK:   # the stream decoder's rings are sized by chunk_seconds
            res[t]["stream_alt"] = d.worker("stream", type=t, chunk=STREAM_ALT_CHUNK, runs=0)
            d.say(f"{t} stream (chunk_seconds={STREAM_ALT_CHUNK:g}): {json.dumps(res[t]['stream_alt'])}")

    # 3. upstream torch f32 on the same weights and inputs
    up = {}
    if args.upstream:
        script = str((ROOT / "bench" / "upstream_codec.py").relative_to(ROOT))
        modes = [None] + ([args.upstream_chunk] if args.upstream_chunk else [])
        for chunk in modes:
            for what in ("encode", "decode"):
                cmd = [args.upstream, script, "--mode", what, "--ckpt", str(CKPT.relative_to(ROOT)),
                       "--work", str(WORK.relative_to(ROOT)), "--threads", str(args.threads),
                       "--runs", str(args.runs)]
                if args.upstream_src:
                    cmd += ["--upstream-src", args.upstream_src]
                if chunk:
                    cmd += ["--chunk-duration", f"{chunk:g}"]
                up[(chunk, what)] = d.run(cmd)
                d.say(f"upstream {what} (chunk_duration={chunk}): {json.dumps(up[(chunk, what)])}")

    # 4. chunk_seconds sweep (encode + decode, warm medians)
    sweep = {}
    for t in sweep_types:
        for c in chunks:
            for what in ("encode", "decode"):
                if c == args.chunk:
                    r = res[t][what]
                else:
                    r = d.worker(what, type=t, chunk=c, runs=max(1, args.runs - 1))
                sweep[(t, c, what)] = r
                d.say(f"sweep {t} chunk {c:g} {what}: {fmt(r.get('median_s'))} s "
                      f"(other load {100 * r.get('foreign', 0):.0f} %)")

    # 5. per-stage breakdown (first and last type) at the default chunk
    stages = {}
    if not args.no_stages:
        for t in dict.fromkeys([types[0], types[-1]]):
            for tower in ("encoder", "decoder"):
                stages[(t, tower)] = d.worker("stages", type=t, chunk=args.chunk, tower=tower,
                                              runs=max(1, args.runs - 1))
                d.say(f"stages {t} {tower}: {json.dumps(stages[(t, tower)])}")

    # 6. inside a stage: matmuls vs attention vs GELU vs norms (f32 and the last type)
    ops_res = {}
    if not args.no_stages:
        for t in dict.fromkeys([types[0], types[-1]]):
            for st in (1, 7):
                ops_res[(t, st)] = d.worker("ops", type=t, chunk=args.chunk, stage=st, runs=3)
                d.say(f"ops {t} encoder.{st}: {json.dumps(ops_res[(t, st)])}")

    measure_peak(d, args.threads)   # again: the best of the probes is the peak
    report = render(args, types, chunks, sweep_types, res, up, sweep, stages, conv, ckpt_gb, d,
                    time.perf_counter() - t_start, ops_res)
    publish(d, report, WORK / "report.md")
    return 0


def enc_dec_rates(work: tuple[dict, dict], times: tuple[dict, dict], peak) -> str:
    """'enc / dec' GFLOP/s (% of the measured peak): the count_flops work of the (encode,
    decode) results `work` over the warm median times of `times` (ours for an upstream row:
    the same math at its speed)."""
    return " / ".join(of_peak(w.get("gflop", {}).get("total"), t.get("median_s"), peak)
                      for w, t in zip(work, times))


def work_line(what: str, g: dict, num: str = "{:.0f}") -> str:
    """The count_flops work of one call, by kind."""
    return (f"work of one {what} (count_flops): {num.format(g['total'])} GFLOP = matmuls "
            f"{num.format(g['mul_mat'])} + flash attention {num.format(g['flash_attn'])} (every "
            "key slot given, masked ones included)")


def _row(what, e, dd, stream="", weight=None, work=None, peak=None):
    """One row of the main table; `work`: the (encode, decode) results whose count_flops work
    the GFLOP/s column divides by this row's times (default: this row's own)."""
    return {"what": what, "encode s": fmt(e.get("median_s")), "decode s": fmt(dd.get("median_s")),
            "GFLOP/s enc / dec (% of peak)": enc_dec_rates(work or (e, dd), (e, dd), peak),
            "RTF enc/dec": rtf(SECONDS, e, dd),
            "peak RSS GB enc/dec": f"{fmt(e.get('peak_rss_gb'))}/{fmt(dd.get('peak_rss_gb'))}",
            "weight GB": fmt(weight if weight is not None else e.get("weight_gb")),
            "stream ms/frame 2t/1t": stream,
            "cold enc/dec s": f"{fmt(e.get('cold_s'))}/{fmt(dd.get('cold_s'))}",
            "load s": fmt(e.get("load_s")),
            "other load %": other_load(e, dd)}


def _git_state() -> str:
    try:
        head = subprocess.run(["git", "-C", str(ROOT), "log", "-1", "--format=%h %s"], check=True,
                              capture_output=True, text=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(ROOT), "status", "--porcelain", "--untracked-files=no",
                                "moss_tts", "converters"], check=True, capture_output=True,
                               text=True).stdout.split()
        return head + (f" + uncommitted changes to {', '.join(dirty[1::2])}" if dirty else "")
    except (OSError, subprocess.CalledProcessError):
        return "?"


def render(args, types, chunks, sweep_types, res, up, sweep, stages, conv, ckpt_gb, d, total_s,
           ops_res=None):
    L, rows, budget = [], [], {}
    for t in types:
        e, dd = res[t]["encode"], res[t]["decode"]
        w = e.get("weight_gb") or dd.get("weight_gb")
        budget[t] = 1.2 * w + 0.5 if w else None
        st = "/".join(fmt(res[t].get(f"stream{th}", {}).get("median_ms"), "{:.1f}")
                      for th in dict.fromkeys([args.threads, 1]))
        rows.append(_row(f"ggml {t}", e, dd, st, w, peak=getattr(d, "peak", None)))
    for (chunk, _), _r in list(up.items())[::2]:
        e, dd = up.get((chunk, "encode"), {}), up.get((chunk, "decode"), {})
        f32 = res.get("f32", {})
        rows.append(_row("upstream torch f32" + (f" chunk {chunk:g} s" if chunk else " one pass"),
                         e, dd, work=(f32.get("encode", {}), f32.get("decode", {})),
                         peak=getattr(d, "peak", None)))
    cols = ["what", "encode s", "decode s", "GFLOP/s enc / dec (% of peak)", "RTF enc/dec",
            "peak RSS GB enc/dec", "weight GB",
            "stream ms/frame 2t/1t", "cold enc/dec s", "load s", "other load %"]
    L.append(f"## MOSS-Audio-Tokenizer 24 kHz, real dims, random weights: {SECONDS:g} s of audio, "
             f"{args.threads} threads, chunk_seconds={args.chunk:g}, warm medians of {args.runs}")
    L.append(f"checkpoint: {ckpt_gb:.2f} GB f32 safetensors in {CKPT.relative_to(ROOT)}; 'other load' "
             "= CPU share other processes used meanwhile (shared machine)")
    L.append(f"package: {_git_state()}")
    L.append(f"CPU: {cpu_line()}")
    L.append(peak_line(getattr(d, "peak", None)))
    for t in types:
        for what in ("encode", "decode"):
            g = res[t][what].get("gflop")
            if g:
                L.append(work_line(f"{t} {what}", g))
    L.append("")
    L.append(table(rows, cols))
    L.append("")
    ref = {w: up.get((None, w), {}).get("median_s") for w in ("encode", "decode")}
    for t in types:
        e, dd = res[t]["encode"], res[t]["decode"]
        target = TARGETS.get(t)
        notes = []
        for what, r in (("encode", e), ("decode", dd)):
            v = r.get("median_s")
            if target and v is not None:
                notes.append(f"{what} {v:.2f} s {'<=' if v <= target else '>'} {target} s "
                             f"{'OK' if v <= target else 'MISS'}")
            if ref.get(what) and v:
                notes.append(f"{what} {ref[what] / v:.2f}x upstream speed")
        for what, r in (("encode", e), ("decode", dd)):
            v = r.get("peak_rss_gb")
            if v is not None and budget.get(t):
                notes.append(f"{what} peak {v:.2f} GB {'<=' if v <= budget[t] else '>'} "
                             f"{budget[t]:.2f} GB budget {'OK' if v <= budget[t] else 'MISS'}")
        L.append(f"- {t}: " + "; ".join(notes))
        for th in [*dict.fromkeys([args.threads, 1]), "alt"]:
            s = res[t].get(f"stream{th}" if th != "alt" else "stream_alt", {})
            if th == "alt":
                th = f"{args.threads} thread(s) with chunk_seconds={STREAM_ALT_CHUNK:g}"
            else:
                th = f"{th} thread(s)"
            if "median_ms" in s:
                L.append(f"  stream push(1 frame), {th}: first {s['first_ms']:.0f} ms (graph "
                         f"build), then median {s['median_ms']:.1f} / p90 {s['p90_ms']:.1f} ms per "
                         f"{s['frame_ms']:.0f} ms frame (RTF {s['median_ms'] / s['frame_ms']:.2f}); "
                         f"streamed vs decode() max|d|/RMS {s['stream_vs_decode_rel']:.1e}; peak "
                         f"{s['peak_rss_gb']:.2f} GB; KV caches {s['kv_cache_mib']:.0f} MiB; other "
                         f"load {100 * s['foreign']:.0f} %")
        for what, r in (("encode", e), ("decode", dd)):
            if "compute_buffer_mib" in r:
                L.append(f"  {what}: compute buffer {r['compute_buffer_mib']:.1f} MiB, KV caches "
                         f"{r['kv_cache_mib']:.0f} MiB, load {r['load_s']:.2f} s, warm runs "
                         + " ".join(f"{x:.2f}" for x in r["warm_s"]))
    L.append("")
    L.append(f"### ms per chunk (chunk_seconds={args.chunk:g}; warm median; [cold first call])")
    for t in types:
        for what in ("encode", "decode"):
            r = res[t][what]
            if "chunk_ms" in r:
                L.append(f"- {t} {what}: " + " ".join(f"{x:.0f}" for x in r["chunk_ms"]) +
                         "  [" + " ".join(f"{x:.0f}" for x in r["cold_chunk_ms"]) + "]")
    L.append("")
    if sweep:
        L.append("### chunk_seconds sweep: warm median s for 10 s (peak RSS GB) [other load %]")
        srows = []
        for t in sweep_types:
            for what in ("encode", "decode"):
                row, best = {"type / op": f"{t} {what}"}, None
                for c in chunks:
                    r = sweep.get((t, c, what), {})
                    v = r.get("median_s")
                    row[f"{c:g} s"] = (f"{fmt(v)} ({fmt(r.get('peak_rss_gb'), '{:.1f}')}) "
                                       f"[{other_load(r)}]")
                    if v is not None and (best is None or v < best[1]):
                        best = (c, v)
                row["fastest"] = f"{best[0]:g}" if best else ""
                srows.append(row)
        L.append(table(srows, ["type / op"] + [f"{c:g} s" for c in chunks] + ["fastest"]))
        L.append("")
    if stages:
        L.append(f"### per stage: one graph per stage chained through the host, chunk_seconds="
                 f"{args.chunk:g}, warm median ms for 10 s")
        for (t, tower), r in stages.items():
            if "names" not in r:
                L.append(f"- {t} {tower}: {r}")
                continue
            srows = [{"stage": name, "ms": f"{ms:.0f}", "share": f"{100 * ms / r['sum_ms']:.0f} %",
                      "GFLOP": fmt(gf, "{:.0f}"),
                      "GFLOP/s (% of peak)": of_peak(gf, ms / 1e3, getattr(d, "peak", None))}
                     for name, ms, gf in zip(r["names"], r["stage_ms"], r["gflop"])]
            L.append(f"{t} {tower}: sum {r['sum_ms']:.0f} ms vs whole graph {r['whole_ms']:.0f} ms "
                     f"(other load {100 * r['foreign']:.0f} %); "
                     + (f"codes equal to the runner's: {100 * r['match']:.1f} %" if tower == "encoder"
                        else f"output vs the runner's max|d|/RMS {r['match']:.1e}"))
            L.append(table(srows, ["stage", "ms", "share", "GFLOP", "GFLOP/s (% of peak)"]))
            L.append("")
    if ops_res:
        L.append("### inside a stage (last chunk, longest window): ms per chunk, each part as its own graph")
        orows = []
        for (t, st), r in ops_res.items():
            if "stage" not in r:
                L.append(f"- {t} encoder.{st}: {r}")
                continue
            row = {"type / stage": f"{t} {r['name']}", "rows": str(r["positions_per_chunk"]),
                   "ring/window": f"{r['ring']}/{r['window']}"}
            for k in ("stage", "stage_no_attention", "matmuls", "attention", "gelu_erf",
                      "gelu_tanh_table", "norms"):
                row[k] = fmt(r.get(k), "{:.1f}")
            row["other load %"] = other_load(r)
            orows.append(row)
        L.append(table(orows, list(orows[0]) if orows else []))
        L.append("  (matmuls: the four weight matmuls per layer only; attention: RoPE + KV write + flash "
                 "attention only; gelu_tanh_table: ggml_gelu's f16 table, for comparison)")
        L.append("")
    if up:
        L.append("### parity with upstream (same random weights and inputs)")
        L.extend(codec_parity_lines(WORK, types))
        L.append("")
    L.extend(conversion_lines(conv))
    L.extend(run_lines(total_s, d.commands))
    return "\n".join(L)


if __name__ == "__main__":
    raise SystemExit(main())
