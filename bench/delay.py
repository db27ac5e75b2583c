"""MossTTSDelay generation at a release's real dimensions (--checkpoint: tts = MOSS-TTS 8B, 36 ×
4096, GQA 32/8, head_dim 128, SwiGLU 12288, 32 × 1025 audio heads; ttsd = the same 8B with
n_vq 16; voicegen = MOSS-VoiceGenerator 1.7B, 28 × 2048, GQA 16/8, SwiGLU 6144, 16 × 1025
audio heads; all with vocab 155648; bench/delay_weights.py says where each dimension comes
from) on seeded random weights: ours (models/delay.py) beside the bandwidth floor and
upstream's CPU route, llama.cpp's Qwen3 through llama-cpp-python plus numpy embeddings and
audio heads (`moss_tts_delay/llama_cpp/pipeline.py`), on one file.

    python bench/delay.py [--checkpoint tts|ttsd|voicegen] [--types q4_K,q8_0] [--steps 40]
        [--prompt 300] [--threads N]

Per type: a step split into backbone / heads / sampling / Python, the prefill of a voice-clone
prompt (the median of 3 on fresh caches after a cold first one that pages the weights in:
prefill_cold; both sides alike), the first audio frame (warm prefill + n_vq steps; codec decode
not included), peak RSS
against weight bytes + KV + 1 GB; the floor = bytes a step must read ÷ read bandwidth measured
just before. Each side runs in its own process, after waiting for a quiet machine (--no-wait
skips that; --profile adds a `perf` profile of one of our workers). The peer needs
`pip install llama-cpp-python` (not a package dependency), built without AMX on a CPU that has
it (NO_AMX_CMAKE_ARGS: ggml's AMX kernels fault on this bench's Xeon hosts).

The weights are written once per checkpoint and type in upstream's published llama.cpp layout
(bench/delay_weights.py), so both sides read the same backbone file; under --data (default
$MOSS_TTS_BENCH_DATA or bench/results/delay_data).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import table  # noqa: E402
from bench.delay_weights import (CHECKPOINTS, TEXT_TABLE, config, weight_bytes,  # noqa: E402
                                 weights_dir)
from bench.harness import (ROOT, Contention, Driver, add_no_wait, end_report, fmt,  # noqa: E402
                           measure_types, median, other_load, peak_rss_gb, perf_top,
                           prefill_times, PREFILL_RATE)
from bench.matmul import ReadProbe  # noqa: E402
from moss_tts.ggml import I32, Graph, get_backend, ops  # noqa: E402
from moss_tts.models.delay import TEXT_HEAD as TEXT  # noqa: E402
from moss_tts.models.delay import (FEW_TEXT_IDS, DelayConfig, audio_seen,  # noqa: E402
                                   few_text_ids, next_row, row_feed, step_run)
from moss_tts.models.delay_published import HEAD, TABLE, load_published  # noqa: E402
from moss_tts.models.delay_state import DelayState  # noqa: E402
from moss_tts.sampling import DelaySamplingOptions  # noqa: E402
from moss_tts.text.delay_prompts import delay  # noqa: E402

KV_BYTES = 2                                      # f16 K and V on both sides (upstream default)
# llama.cpp's x86 kernels as -march=native picks them, less AMX (see LlamaBackbone)
NO_AMX_CMAKE_ARGS = ("-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON "
                     "-DGGML_BMI2=ON -DGGML_AVX_VNNI=ON -DGGML_AVX512=ON -DGGML_AVX512_VBMI=ON "
                     "-DGGML_AVX512_VNNI=ON -DGGML_AVX512_BF16=ON")


# -- the prompt ---------------------------------------------------------------------------------
def voice_clone_prompt(cfg: DelayConfig, n: int) -> np.ndarray:
    """n rows shaped like a voice-clone prompt: text, a reference block (AUDIO_START, user slots
    carrying the delayed codes of random frames, AUDIO_END), text, AUDIO_START last (the row
    the model samples first, so the timed steps are audio rows from the start)."""
    rng = np.random.default_rng(0)
    pad = cfg.audio_pad_code
    frames = max(1, n - 24 - cfg.n_vq)
    codes = rng.integers(0, cfg.audio_vocab_size, (frames, cfg.n_vq))
    block = np.full((frames + cfg.n_vq + 1, cfg.n_vq + 1), pad)
    block[:, 0] = [cfg.audio_start_token_id] + [cfg.audio_user_slot_token_id] * \
        (frames + cfg.n_vq - 1) + [cfg.audio_end_token_id]
    block[1:-1, 1:] = delay(codes, pad)
    text = rng.integers(1000, 150000, n - len(block))
    rows = np.full((n, cfg.n_vq + 1), pad)
    rows[:, 0][: len(text) - 1] = text[:-1]
    rows[len(text) - 1: len(text) - 1 + len(block)] = block
    rows[-1, 0] = cfg.audio_start_token_id
    return rows.astype(np.int64)


# -- the two sides, each in its own process -----------------------------------------------------
class Steps:
    """Per-step times by part, and the loop both sides share: sample the next row from the
    logits, then feed it back (upstream's `_autoregressive_loop`)."""

    def __init__(self, cfg: DelayConfig, rows: np.ndarray):
        self.cfg, self.parts = cfg, []
        self.state = DelayState.from_prompt(rows[:, 0], cfg.ids)
        self.seen = audio_seen(rows[:, 1:], cfg)
        self.rng, self.opts = np.random.default_rng(0), DelaySamplingOptions()

    def sample(self, text_logits, audio_logits) -> np.ndarray:
        row, self.state = next_row(self.state, text_logits, audio_logits, self.seen, self.cfg,
                                   self.opts, self.rng)
        self.seen |= audio_seen(row[None, 1:], self.cfg)
        return row

    def summary(self, prefill_s: float, skip: int = 2) -> dict:
        warm = self.parts[skip:] or self.parts
        out = {f"{k}_ms": 1e3 * median([p[k] for p in warm]) for k in self.parts[0]}
        out["step_ms"] = 1e3 * median([sum(p.values()) for p in warm])
        out["prefill_ms"] = 1e3 * prefill_s
        # the first frame is whole after n_vq rows (the staircase); codec decode not included
        out["first_audio_ms"] = 1e3 * (prefill_s + sum(sum(p.values())
                                                       for p in self.parts[: self.cfg.n_vq]))
        return out


class HeadsProbe:
    """The heads of one row alone, as a step ran them (the text head whole, or only the rows of
    the few ids the next row may take: models/delay.py `step_run`): they run inside our step
    graph, so each step is followed by one run of this, and the step's backbone share is its
    graph time minus that (interleaved, so a busy machine slows both alike)."""

    def __init__(self, model):
        self.graphs = {few: self._graph(model, few) for few in (False, True)}
        h = np.random.default_rng(0).standard_normal(model.config.language_config.hidden_size)
        self.feeds = {False: {"h": h.astype(np.float32)},
                      True: {"h": h.astype(np.float32),
                             "text_ids": np.arange(FEW_TEXT_IDS, dtype=np.int32)}}

    @staticmethod
    def _graph(model, few: bool) -> Graph:
        g = Graph(model.backend, name="heads")
        h = g.input("h", (model.config.language_config.hidden_size,))
        head = model.w.text_head
        if few:
            head = ops.get_rows(head, g.input("text_ids", (FEW_TEXT_IDS,), I32))
        g.output(ops.mul_mat(head, h), "text")
        g.output(ops.mul_mat(model.w.audio_heads, h), "audio")
        g.build()
        g.allocate()
        return g

    def seconds(self, few: bool) -> float:
        """One run, inputs written each time (the allocator may reuse their memory)."""
        g = self.graphs[few]
        for name, value in self.feeds[few].items():
            g.set_input(name, value)
        t0 = time.perf_counter()
        g.compute()
        return time.perf_counter() - t0

    def close(self) -> None:
        for g in self.graphs.values():
            g.close()


def generate_timed(model, session, steps: "Steps", rows: np.ndarray, n: int, heads,
                   compute: list, *, few: bool = True) -> float:
    """Prefill `rows`, then n steps, each split into parts in `steps.parts` (graph time from
    `compute`); `few` False computes the whole text head on every step (the A/B). Returns the
    prefill's seconds."""
    cfg = model.config

    def run(feed):
        return step_run(session, feed, steps.state, cfg) if few else full_step(session, feed)

    t0 = time.perf_counter()
    text, audio = run(rows)
    prefill = time.perf_counter() - t0
    for _ in range(n):
        t0 = time.perf_counter()
        row = steps.sample(text, audio)
        t1 = time.perf_counter()
        k = len(compute)
        used_few = few and few_text_ids(steps.state, cfg) is not None
        text, audio = run(row[None])
        t2 = time.perf_counter()
        graph = sum(compute[k:])
        heads_s = heads.seconds(used_few)
        steps.parts.append({"backbone": graph - heads_s, "heads": heads_s,
                            "sampling": t1 - t0, "python": t2 - t1 - graph})
    return prefill


def full_step(session, rows):
    out = session.run(row_feed(rows), len(rows), variant=True)
    return out["text_logits"][0], out["audio_logits"][0]


def run_ours(args) -> dict:
    model = load_published(weights_dir(args), get_backend(None, args.threads),
                           repack=args.repack != "off")
    cfg, rows = model.config, voice_clone_prompt(model.config, args.prompt)
    heads = HeadsProbe(model)
    compute, plain = [], model.backend.compute

    def timed_compute(cgraph):   # ggml time of every graph run
        t0 = time.perf_counter()
        plain(cgraph)
        compute.append(time.perf_counter() - t0)

    model.backend.compute = timed_compute
    steps = Steps(cfg, rows)

    def prefill_once():
        with model.make_session(len(rows) + 1) as fresh:
            step_run(fresh, rows, steps.state, cfg)   # DelayState is frozen: left as it was

    prefills = prefill_times(prefill_once)
    with model.make_session(len(rows) + args.steps) as session:
        prefill = generate_timed(model, session, steps, rows, args.steps, heads, compute)
    out = steps.summary(prefill) | prefills
    if args.ab_text_head:    # the same again with the whole text head on every step
        full = Steps(cfg, rows)
        with model.make_session(len(rows) + args.steps) as session:
            generate_timed(model, session, full, rows, args.steps, heads, compute, few=False)
        out |= {f"full_head_{k}": v for k, v in full.summary(0.0).items()
                if k in ("step_ms", "heads_ms", "backbone_ms")}
    model.backend.compute = plain
    heads.close()
    model.close()
    return out | {"threads": get_backend(None, args.threads).threads}


class LlamaBackbone:
    """llama.cpp fed embeddings, returning the hidden state (after the final norm) and the text
    logits of the last row: upstream's `backbone_bridge.c` through llama-cpp-python."""

    def __init__(self, path: Path, n_ctx: int, threads: int):
        import llama_cpp as L

        self.L = L
        L.llama_backend_init()
        if b"AMX_INT8 = 1" in L.llama_print_system_info():
            # ggml's AMX buffer type faults (SIGSEGV / SIGILL) on the Xeon hosts this bench
            # runs on (shared/perf-notes.md), and ours never uses it: same kernel families
            raise RuntimeError("llama-cpp-python was built with AMX; rebuild it without: "
                               f"CMAKE_ARGS='{NO_AMX_CMAKE_ARGS}' pip install --force-reinstall "
                               "--no-cache-dir llama-cpp-python")
        mp = L.llama_model_default_params()
        mp.n_gpu_layers = 0
        self.model = L.llama_model_load_from_file(str(path).encode(), mp)
        if not self.model:
            raise RuntimeError(f"llama.cpp could not load {path}")
        cp = L.llama_context_default_params()
        cp.n_ctx, cp.n_batch, cp.n_ubatch = n_ctx, 512, 512
        cp.n_threads = cp.n_threads_batch = threads
        cp.embeddings = True
        cp.flash_attn_type = -1                # auto, as upstream's default config
        self.ctx = L.llama_init_from_model(self.model, cp)
        self.n_embd = L.llama_model_n_embd(self.model)
        self.n_vocab = L.llama_vocab_n_tokens(L.llama_model_get_vocab(self.model))

    def decode(self, embeds: np.ndarray, pos: int) -> None:
        """Rows [n, n_embd] at positions pos…; output for the last row only."""
        L, n = self.L, len(embeds)
        batch = L.llama_batch_init(n, self.n_embd, 1)
        try:
            np.ctypeslib.as_array(batch.embd, shape=(n * self.n_embd,))[:] = embeds.ravel()
            for i in range(n):
                batch.pos[i], batch.n_seq_id[i], batch.logits[i] = pos + i, 1, i == n - 1
                batch.seq_id[i][0] = 0
            batch.n_tokens = n
            if L.llama_decode(self.ctx, batch) != 0:
                raise RuntimeError("llama_decode failed")
        finally:
            L.llama_batch_free(batch)

    def clear(self) -> None:
        """Forget every cached position (to prefill the same prompt again)."""
        self.L.llama_memory_clear(self.L.llama_get_memory(self.ctx), True)

    def outputs(self) -> tuple[np.ndarray, np.ndarray]:
        L = self.L
        text = np.ctypeslib.as_array(L.llama_get_logits_ith(self.ctx, -1), shape=(self.n_vocab,))
        hidden = np.ctypeslib.as_array(L.llama_get_embeddings_ith(self.ctx, -1),
                                       shape=(self.n_embd,))
        return text.copy(), hidden.copy()

    def close(self) -> None:
        self.L.llama_free(self.ctx)
        self.L.llama_model_free(self.model)


def run_peer(args) -> dict:
    """Upstream's CPU loop: numpy embedding lookup (f32 audio tables; the text table mapped and
    read by row), llama.cpp backbone + text head, one stacked f32 numpy audio-head matmul."""
    d = weights_dir(args)
    cfg = config(args.checkpoint, args.tiny)
    rows = voice_clone_prompt(cfg, args.prompt)
    text_table = np.load(d / TEXT_TABLE, mmap_mode="r")
    tables = [np.load(d / TABLE.format(k)).astype(np.float32) for k in range(cfg.n_vq)]
    heads = np.concatenate([np.load(d / HEAD.format(k)).astype(np.float32)
                            for k in range(cfg.n_vq)])

    def embed(r):
        x = text_table[r[:, 0]].astype(np.float32)
        for k in range(cfg.n_vq):
            x = x + tables[k][r[:, k + 1]]
        return x

    threads = args.threads or os.cpu_count()
    backbone = LlamaBackbone(next(d.glob("*.gguf")), len(rows) + args.steps + 64, threads)
    steps = Steps(cfg, rows)

    def prefill_once():
        backbone.clear()
        backbone.decode(embed(rows), 0)

    prefills = prefill_times(prefill_once)   # the last run leaves the prompt cached
    prefill = prefills["prefill_ms"] / 1e3
    for pos in range(len(rows), len(rows) + args.steps):
        t0 = time.perf_counter()
        text, hidden = backbone.outputs()
        t1 = time.perf_counter()
        audio = (hidden @ heads.T).reshape(cfg.n_vq, cfg.audio_rows)
        audio[:, cfg.audio_pad_code] = -np.inf
        t2 = time.perf_counter()
        row = steps.sample(text, audio)
        t3 = time.perf_counter()
        x = embed(row[None])
        t4 = time.perf_counter()
        backbone.decode(x, pos)
        t5 = time.perf_counter()
        steps.parts.append({"backbone": (t1 - t0) + (t5 - t4), "heads": t2 - t1,
                            "sampling": t3 - t2, "python": t4 - t3})
    backbone.close()
    return steps.summary(prefill) | prefills | {"threads": threads}


def worker(args) -> None:
    run = {"ours": run_ours, "peer": run_peer}[args.worker]
    busy = Contention()      # the driver measures again when other processes took the cores
    out = run(args) | {"peak_rss_gb": peak_rss_gb(), "foreign": busy.share()}
    print(json.dumps(out))


# -- the driver ---------------------------------------------------------------------------------
def step_bytes(d: Path, cfg: DelayConfig, n_past: int, side: str) -> dict[str, int]:
    """Bytes one step reads, by part: the backbone (every block matrix, one row of each
    embedding table, the KV prefix) and the heads: the audio heads (f16 in ours, f32 in
    upstream's numpy) and the text head — whole in the peer (inside llama.cpp's backbone),
    FEW_TEXT_IDS rows of it in ours, as a step in audio takes no other text token (P3)."""
    from moss_tts.ggml import GGUFFile

    with GGUFFile(next(d.glob("*.gguf"))) as f:
        infos = f.tensors
        embd = infos["token_embd.weight"]
        blocks = sum(i.nbytes for n, i in infos.items() if n not in ("token_embd.weight", TEXT))
        text_head = infos[TEXT].nbytes
    h = cfg.language_config.hidden_size
    tables = embd.nbytes // embd.shape[0] + cfg.n_vq * h * (4 if side == "peer" else 2)
    backbone = blocks + tables + kv_bytes(cfg, n_past)
    audio = cfg.n_vq * cfg.audio_rows * h * (4 if side == "peer" else 2)
    if side == "peer":
        return {"backbone": backbone + text_head, "heads": audio}
    return {"backbone": backbone, "heads": text_head * FEW_TEXT_IDS // cfg.vocab_size + audio}


def kv_bytes(cfg: DelayConfig, rows: int) -> int:
    lc = cfg.language_config
    return 2 * lc.num_hidden_layers * lc.num_key_value_heads * lc.head_dim * KV_BYTES * rows


def measure_type(driver: Driver, args, outtype: str, probe: ReadProbe) -> list[dict]:
    cfg = config(args.checkpoint, args.tiny)
    kw = dict(checkpoint=args.checkpoint, type=outtype, head_type=args.head_type,
              steps=args.steps, prompt=args.prompt, threads=args.threads, data=args.data,
              tiny=args.tiny, ab_text_head=args.ab_text_head)
    d = weights_dir(argparse.Namespace(**kw))       # written here, before any timing
    flags = {k.replace("_", "-"): v for k, v in kw.items()}
    gbps = probe.gbps(5)
    kv = kv_bytes(cfg, args.prompt + args.steps)
    out = []
    sides = {"ours": "off" if args.repack == "off" else "on"} | \
        ({"ours-plain": "off"} if args.repack == "both" else {}) | \
        ({} if args.no_peer else {"peer": None})
    for side, repack in sides.items():
        r = driver.worker("peer" if side == "peer" else "ours", **flags, repack=repack)
        parts = step_bytes(d, cfg, args.prompt + args.steps // 2, side)
        # where the time goes: each part's bytes over its time, beside the read bandwidth
        rates = {f"{k}_gbs": parts[k] / r[f"{k}_ms"] / 1e6 for k in parts if f"{k}_ms" in r}
        out.append({"checkpoint": args.checkpoint, "type": outtype, "side": side, "read_gbs": gbps,
                    "floor_ms": 1e3 * sum(parts.values()) / (gbps * 1e9),
                    "budget_gb": (weight_bytes(d, fp32_tables=side == "peer") + kv + 1e9) / 1e9}
                   | rates | r)
    return out


def report(results: list[dict]) -> str:
    lines = []
    for t in dict.fromkeys(r["type"] for r in results):
        ours = next(r for r in results if r["type"] == t and r["side"] == "ours")
        peer = next((r for r in results if r["type"] == t and r["side"] == "peer"), {})
        lines.append({
            "type": t, "ours ms/step": fmt(ours.get("step_ms")), "floor ms": fmt(ours["floor_ms"]),
            "peer floor ms": fmt(peer.get("floor_ms")),
            "ours/floor": fmt(ours.get("step_ms", float("nan")) / ours["floor_ms"]),
            "peer ms/step": fmt(peer.get("step_ms")) or peer.get("error", "not run")[:40],
            "peer/ours": fmt(peer.get("step_ms", float("nan")) / ours.get("step_ms", float("nan"))),
            "read GB/s": fmt(ours["read_gbs"], "{:.1f}")})
    cols = ["type", "ours ms/step", "floor ms", "ours/floor", "peer ms/step", "peer/ours",
            "peer floor ms", "read GB/s"]
    split = [{"type": r["type"], "side": r["side"],
              **{c: fmt(r.get(f"{c}_ms")) for c in ("backbone", "heads", "sampling", "python",
                                                     "step", "prefill", "prefill_cold",
                                                     "first_audio")},
              "backbone GB/s": fmt(r.get("backbone_gbs"), "{:.1f}"),
              "heads GB/s": fmt(r.get("heads_gbs"), "{:.1f}"),
              "peak RSS GB": fmt(r.get("peak_rss_gb")), "budget GB": fmt(r["budget_gb"]),
              "others' CPU %": other_load(r),
              PREFILL_RATE: r.get(PREFILL_RATE, ""),
              "threads": r.get("threads", "")} for r in results if "error" not in r]
    split_cols = ["type", "side", "backbone", "heads", "sampling", "python", "step", "prefill",
                  "prefill_cold", PREFILL_RATE, "first_audio", "backbone GB/s", "heads GB/s", "peak RSS GB",
                  "budget GB", "others' CPU %", "threads"]
    ab = [{"type": r["type"], "few text ids": fmt(r["step_ms"]),
           "whole text head": fmt(r["full_head_step_ms"]),
           "heads few / whole": f"{fmt(r['heads_ms'])} / {fmt(r['full_head_heads_ms'])}"}
          for r in results if "full_head_step_ms" in r]
    plain = [{"type": r["type"], "repacked step ms": fmt(o.get("step_ms")),
              "plain step ms": fmt(r.get("step_ms")), "prefill ms repacked / plain":
              f"{fmt(o.get('prefill_ms'))} / {fmt(r.get('prefill_ms'))}",
              "plain / repacked step": fmt(r.get("step_ms", float("nan")) /
                                           o.get("step_ms", float("nan")))}
             for r in results if r["side"] == "ours-plain"
             for o in results if o["type"] == r["type"] and o["side"] == "ours"]
    parts = [table(lines, cols), "per step (ms), prefill and first audio (ms):",
             table(split, split_cols) if split else "(no side ran)"]
    if plain:
        parts += ["ours with and without ggml's repacked weights (--repack both):",
                  table(plain, list(plain[0]))]
    if ab:
        parts += ["ours, step ms in one process (--ab-text-head):",
                  table(ab, list(ab[0]))]
    return "\n\n".join(parts)


def dims_line(args) -> str:
    c, cfg = CHECKPOINTS[args.checkpoint], config(args.checkpoint, args.tiny)
    lc = cfg.language_config
    return (f"{c.title}{' at tiny dims' if args.tiny else ''}: {lc.num_hidden_layers} × "
            f"{lc.hidden_size}, heads {lc.num_attention_heads}/{lc.num_key_value_heads} of "
            f"{lc.head_dim}, SwiGLU {lc.intermediate_size}, vocab {cfg.vocab_size}, "
            f"n_vq {cfg.n_vq} × {cfg.audio_rows}")


def profile(args) -> str:
    """Where a step's cycles go (all threads, self time): one of our workers under `perf`, with
    a 40-row prompt so that the steps dominate."""
    outtype = args.types.split(",")[0]
    cmd = [sys.executable, str(Path(__file__).relative_to(ROOT)), "--worker", "ours",
           "--checkpoint", args.checkpoint, "--type", outtype, "--steps", str(args.steps),
           "--prompt", "40", "--data", args.data]
    cmd += ["--threads", str(args.threads)] if args.threads else []
    cmd += ["--tiny"] if args.tiny else []
    top = perf_top(cmd, Path(args.data) / "delay-perf.data", n=16)
    return "\n".join([f"perf, ours {outtype} (prefill of 40 rows + {args.steps} steps):", *top])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--checkpoint", choices=sorted(CHECKPOINTS), default="tts",
                    help="whose dimensions: " + "; ".join(f"{k}: {c.title}, n_vq {c.n_vq}"
                                                        for k, c in CHECKPOINTS.items()))
    ap.add_argument("--types", default="q4_K,q8_0", help="backbone types, comma-separated")
    ap.add_argument("--head-type", default=None,
                    help="text head type (default: converters.delay's, q8_0 below q8_0)")
    ap.add_argument("--steps", type=int, default=40, help="> n_vq, for the first audio frame")
    ap.add_argument("--prompt", type=int, default=300, help="prompt rows (a voice clone)")
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--data", default=os.environ.get("MOSS_TTS_BENCH_DATA",
                                                     str(ROOT / "bench" / "results" / "delay_data")),
                    help="where the random-weight files are written once and reused")
    ap.add_argument("--no-peer", action="store_true", help="skip llama-cpp-python")
    add_no_wait(ap)
    ap.add_argument("--repack", choices=["on", "off", "both"], default="both",
                    help="ours with ggml's repacked CPU weight layouts (the package default), "
                    "without, or both (side ours-plain: repack off)")
    ap.add_argument("--ab-text-head", action="store_true",
                    help="ours again with the whole text head on every step (A/B, one process)")
    ap.add_argument("--profile", action="store_true",
                    help="also `perf record` one of our workers (first type, a short prompt)")
    ap.add_argument("--tiny", action="store_true", help="small dims: check the script runs")
    ap.add_argument("--worker", choices=["ours", "peer"], help=argparse.SUPPRESS)
    ap.add_argument("--type", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    n_vq = config(args.checkpoint, args.tiny).n_vq
    if args.steps <= n_vq:
        ap.error(f"--steps must exceed {args.checkpoint}'s n_vq ({n_vq}) for the first audio "
                 "frame")
    if args.worker:
        worker(args)
        return 0
    driver, results = measure_types(args, __file__, "delay-bench.log", measure_type)
    driver.say(f"{dims_line(args)}\n\n{report(results)}")
    if args.profile:
        driver.say(profile(args))
    end_report(driver, results)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
