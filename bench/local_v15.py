"""MOSS-TTS-Local-Transformer-v1.5 generation at the real dimensions (Qwen3-4B: 36 × 2560, GQA
32/8, head_dim 128, SwiGLU 9728, vocab 151936; the local GPT-2 block 2560 wide, 32 heads of
80, silu MLP 9728; 12 audio tables of 1024, also the heads) on seeded random weights written
directly in the target types: ours (models/local_v15.py) beside the bandwidth floor and, with
--peer, upstream's PyTorch f32 (`moss_tts_local_v1.5/modeling_moss_tts.py`).

    python bench/local_v15.py [--types q4_K,q8_0,f16] [--frames 24] [--prompt 200] [--peer]
        [--upstream-src DIR] [--threads N] [--tiny]

Per type: a frame split into backbone step / local block (12 positions) / heads / sampling /
Python, the prefill of a voice-clone prompt, the first audio chunk (prefill + the 4 frames of
upstream's first chunk; codec decode not included: bench/codec48k.py), peak RSS; the floor =
bytes a frame must read ÷ read bandwidth measured just before. Each side runs in its own
process after waiting for a quiet machine (--no-wait skips that). Both sides force "continue"
at the 2-way head (after computing it) so every run makes --frames frames. The peer needs
`pip install torch transformers` (not package dependencies) and upstream's source: --upstream-src
or $MOSS_TTS_UPSTREAM (a checkout or bare git mirror of OpenMOSS/MOSS-TTS); it runs on its own
random f32 weights (speed does not depend on the values). fixtures/upstream_local_v15.py checks
the same upstream model against ours, frame for frame, on the tiny checkpoint.
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
from bench.delay_weights import PooledRows  # noqa: E402
from bench.harness import (ROOT, Driver, add_no_wait, end_report, fmt, measure_types,  # noqa: E402
                           median, peak_rss_gb, prefill_times, PREFILL_RATE)
from bench.matmul import ReadProbe  # noqa: E402
from converters.gguf_io import write_gguf  # noqa: E402
from converters.local_v15 import tensor_types  # noqa: E402
from fixtures.make_delay import make_tokenizer_json  # noqa: E402
from fixtures.upstream_local_v15 import (  # noqa: E402
    UPSTREAM_ENV, backbone_hidden, upstream_model, upstream_modules)
from moss_tts.ggml import Graph, Weights, get_backend, ops  # noqa: E402
from moss_tts.models import gpt2, local_v15 as lv  # noqa: E402
from moss_tts.models.chunk_ladder import FIRST_CHUNK_FRAMES as FIRST_CHUNK  # noqa: E402
from moss_tts.models.qwen3 import Qwen3Config  # noqa: E402
from moss_tts.sampling import LocalV15SamplingOptions  # noqa: E402

REAL = (Qwen3Config(2560, 36, 32, 8, 128, 9728, 1e6),
        gpt2.GPT2Config(2560, 32, 1, 9728, 1e-6, 1e6, "silu"), 151936)
TINY = (Qwen3Config(64, 2, 4, 2, 16, 96, 1e6), gpt2.GPT2Config(64, 4, 1, 96, 1e-6, 1e6, "silu"),
        151680)
KV_BYTES = 2                 # f16 K and V (LocalV15Model's default)


def config(tiny: bool) -> lv.LocalV15Config:
    backbone, local, vocab = TINY if tiny else REAL
    return lv.LocalV15Config(backbone, local, vocab_size=vocab)


# -- the weights ------------------------------------------------------------------------------
def model_path(args, outtype: str) -> Path:
    """The random-weight GGUF of one type, written once under --data."""
    cfg = config(args.tiny)
    path = Path(args.data) / f"local_v15{'-tiny' if args.tiny else ''}-{outtype}.gguf"
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        tensors = {n: PooledRows(n, s) if len(s) == 2 else np.ones(s, np.float32)
                   for n, s in cfg.tensor_shapes().items()}
        t0 = time.perf_counter()
        meta = cfg.to_metadata() | {lv.TOKENIZER_KEY: make_tokenizer_json()}   # streams.py plans
        write_gguf(path, tensors, meta, kind=lv.KIND,
                   version=lv.FORMAT_VERSION, type_for=tensor_types(outtype, embed=args.embed_type))
        print(f"{path}: written in {time.perf_counter() - t0:.0f} s", file=sys.stderr)
    return path


def voice_clone_prompt(cfg: lv.LocalV15Config, n: int) -> np.ndarray:
    """n rows shaped like a voice clone: text rows around a reference block of n/2 frames."""
    rng = np.random.default_rng(0)
    rows = np.full((n, cfg.n_vq + 1), cfg.audio_pad_token_id, dtype=np.int64)
    rows[:, 0] = rng.integers(300, 20000, n)
    ref = slice(n // 4, n // 4 + n // 2)
    rows[ref, 0] = cfg.audio_user_slot_token_id
    rows[ref, 1:] = rng.integers(0, cfg.audio_vocab_size, (n // 2, cfg.n_vq))
    rows[-1, 0] = cfg.audio_start_token_id
    return rows


# -- ours ---------------------------------------------------------------------------------------
class Timers:
    """Graph time of every backend compute, and the time spent in the sampling functions, each
    appended in order (the model's own loop runs unchanged; only these two are wrapped)."""

    def __init__(self, model):
        self.graphs, self.sampling = [], []
        plain = model.backend.compute

        def compute(cgraph):
            t0 = time.perf_counter()
            plain(cgraph)
            self.graphs.append(time.perf_counter() - t0)

        model.backend.compute = compute
        self._wrap("sample_audio_code", lambda out: out)
        # every run must make --frames frames: the 2-way head is computed and sampled, then
        # "continue" is taken whatever it said
        self._wrap("decide", lambda out: lv.CONTINUE)

    def _wrap(self, name: str, result):
        plain = getattr(lv, name)

        def timed(*a, **k):
            t0 = time.perf_counter()
            out = plain(*a, **k)
            self.sampling.append(time.perf_counter() - t0)
            return result(out)

        setattr(lv, name, timed)


class HeadsProbe:
    """The n_vq audio heads and the 2-way head of one frame alone (each runs inside a local
    position's graph), timed after every frame so the local block's share is its graphs'
    time minus this."""

    def __init__(self, model):
        w, d = model.w, model.config.local.n_embd
        self.graph = Graph(model.backend, name="heads")
        h = self.graph.input("h", (d,))
        self.graph.output(ops.mul_mat(w.decision_head, h), "decision")
        for k, table_k in enumerate(w.audio_embeddings):
            self.graph.output(ops.mul_mat(table_k, h), f"audio.{k}")
        self.graph.build()
        self.graph.allocate()
        self.h = np.random.default_rng(0).standard_normal(d).astype(np.float32)

    def seconds(self) -> float:
        self.graph.set_input("h", self.h)
        t0 = time.perf_counter()
        self.graph.compute()
        return time.perf_counter() - t0


def run_ours(args) -> dict:
    model = lv.LocalV15Model(Weights.load(model_path(args, args.type),
                                          get_backend(None, args.threads)))
    rows = voice_clone_prompt(model.config, args.prompt)
    probe = HeadsProbe(model)

    def prefill_once():
        with model.make_state(len(rows) + 1) as fresh:
            model.prefill(fresh, rows)

    prefills = prefill_times(prefill_once)
    timers = Timers(model)
    parts, first_chunk, probe_s, prev = [], 0.0, 0.0, None
    t_start = time.perf_counter()
    frames = model.iter_frames(rows, options=LocalV15SamplingOptions(), seed=0,
                               max_frames=args.frames)
    for i, _ in enumerate(frames):
        t, g, s = time.perf_counter(), len(timers.graphs), len(timers.sampling)
        if i == FIRST_CHUNK - 1:
            first_chunk = t - t_start - probe_s
        if prev is not None:       # frame i: the backbone step, then n_vq local positions
            t0, g0, s0, heads = prev
            graphs, sampling = timers.graphs[g0:g], sum(timers.sampling[s0:s])
            parts.append({"backbone": graphs[0], "local": sum(graphs[1:]) - heads,
                          "heads": heads, "sampling": sampling,
                          "python": (t - t0) - sum(graphs) - sampling})
        p0 = time.perf_counter()
        heads = probe.seconds()    # between frames: not part of any frame's time
        probe_s += time.perf_counter() - p0
        prev = (time.perf_counter(), len(timers.graphs), len(timers.sampling), heads)
    probe.graph.close()
    model.close()
    warm = parts[2:] or parts
    out = {f"{k}_ms": 1e3 * median([p[k] for p in warm]) for k in parts[0]}
    return out | {"frame_ms": 1e3 * median([sum(p.values()) for p in warm]),
                  **prefills, "first_chunk_ms": 1e3 * first_chunk,
                  "threads": get_backend(None, args.threads).threads}


# -- upstream PyTorch f32 -----------------------------------------------------------------------
def run_peer(args) -> dict:
    import torch

    cfg = config(args.tiny)
    lc, loc = cfg.language_config, cfg.local
    torch.manual_seed(0)
    torch.set_num_threads(args.threads or os.cpu_count())
    qwen3 = dict(hidden_size=lc.hidden_size, num_hidden_layers=lc.num_hidden_layers,
                 num_attention_heads=lc.num_attention_heads, head_dim=lc.head_dim,
                 num_key_value_heads=lc.num_key_value_heads,
                 intermediate_size=lc.intermediate_size, rope_theta=lc.rope_theta,
                 vocab_size=cfg.vocab_size, rms_norm_eps=lc.rms_norm_eps)
    gpt2_cfg = dict(n_embd=loc.n_embd, n_head=loc.n_head, n_layer=1, n_inner=loc.n_inner,
                    activation_function="silu", layer_norm_epsilon=1e-6,
                    position_embedding_type="rope", rope_base=loc.rope_base,
                    vocab_size=cfg.vocab_size, n_positions=cfg.n_vq + 1)
    model = upstream_model(upstream_modules(args.upstream_src),
                           {"qwen3_config": qwen3, "gpt2_config": gpt2_cfg, "n_vq": cfg.n_vq})
    plain = model._sample_next_assistant_text_token
    slot = torch.tensor([cfg.audio_assistant_slot_token_id])
    model._sample_next_assistant_text_token = lambda **kw: (plain(**kw), slot)[1]
    ids = torch.from_numpy(voice_clone_prompt(cfg, args.prompt))[None]
    opts = dict(do_sample=True, audio_temperature=1.7, audio_top_p=0.8, audio_top_k=25,
                audio_repetition_penalty=1.0)

    def seconds(n: int) -> float:
        """The fastest of 3 generations of n frames (the 2-way head forced to continue)."""
        best = float("inf")
        for _ in range(3):
            t0 = time.perf_counter()
            (start, rows), = model.generate(ids, max_new_frames=n, **opts)
            best = min(best, time.perf_counter() - t0)
            if len(rows) - 1 - start != n:
                raise SystemExit(f"upstream made {len(rows) - 1 - start} frames, not {n}")
        return best

    seconds(2)                                  # warm-up
    one, many = seconds(1), seconds(args.frames)
    frame = (many - one) / (args.frames - 1)
    return {"frame_ms": 1e3 * frame, **prefill_times(lambda: backbone_hidden(model, ids)),
            "first_chunk_ms": 1e3 * (one + (FIRST_CHUNK - 1) * frame),
            "threads": torch.get_num_threads(), "torch": torch.__version__}


# -- the driver ---------------------------------------------------------------------------------
def frame_bytes(path: Path, cfg: lv.LocalV15Config, n_past: int) -> dict[str, int]:
    """Bytes one frame must read, by part: the backbone step (every block matrix, one row of
    each table, the KV prefix), the local block once per position, the heads (each audio table
    once, as a head, and the 2-way head)."""
    from moss_tts.ggml import GGUFFile

    with GGUFFile(path) as f:
        infos = f.tensors
        blocks = sum(i.nbytes for n, i in infos.items() if n.startswith(("blk.", "output_norm")))
        local = sum(i.nbytes for n, i in infos.items() if n.startswith(lv.LOCAL))
        tables = sum(i.nbytes for n, i in infos.items() if n.startswith("audio_embeddings"))
        embd = infos["token_embd.weight"]
        heads = tables + infos[lv.DECISION_HEAD].nbytes
    lc = cfg.language_config
    kv = 2 * lc.num_hidden_layers * lc.num_key_value_heads * lc.head_dim * KV_BYTES * n_past
    rows = embd.nbytes // embd.shape[0] + tables // cfg.audio_vocab_size
    return {"backbone": blocks + rows + kv, "local": cfg.n_vq * local, "heads": heads}


def measure_type(driver: Driver, args, outtype: str, probe: ReadProbe) -> list[dict]:
    path = model_path(args, outtype)             # written here, before any timing
    gbps = probe.gbps(5)
    parts = frame_bytes(path, config(args.tiny), args.prompt + args.frames // 2)
    flags = dict(type=outtype, frames=args.frames, prompt=args.prompt, threads=args.threads,
                 data=args.data, tiny=args.tiny, embed_type=args.embed_type,
                 upstream_src=args.upstream_src)
    out = []
    for side in ("ours", "peer") if args.peer else ("ours",):
        if side == "peer" and outtype != args.types.split(",")[0]:
            continue                              # one f32 peer run serves every type
        r = driver.worker(side, **{k.replace("_", "-"): v for k, v in flags.items()})
        rates = {f"{k}_gbs": parts[k] / r[f"{k}_ms"] / 1e6 for k in parts if f"{k}_ms" in r}
        out.append({"type": outtype if side == "ours" else "f32", "side": side,
                    "read_gbs": gbps, "floor_ms": 1e3 * sum(parts.values()) / (gbps * 1e9)}
                   | rates | r)
    return out


def report(results: list[dict]) -> str:
    peer = next((r for r in results if r["side"] == "peer"), {})
    lines = [{"type": r["type"], "side": r["side"], "ms/frame": fmt(r.get("frame_ms")),
              "floor ms": fmt(r["floor_ms"]) if r["side"] == "ours" else "",
              "ms/floor": fmt(r.get("frame_ms", float("nan")) / r["floor_ms"])
              if r["side"] == "ours" else "",
              "peer/ours": fmt(peer.get("frame_ms", float("nan")) / r["frame_ms"])
              if r["side"] == "ours" and "frame_ms" in r else "",
              **{c: fmt(r.get(f"{c}_ms")) for c in ("backbone", "local", "heads", "sampling",
                                                     "python", "prefill", "prefill_cold",
                                                     "first_chunk")},
              PREFILL_RATE: r.get(PREFILL_RATE, ""),
              "backbone GB/s": fmt(r.get("backbone_gbs"), "{:.1f}"),
              "local GB/s": fmt(r.get("local_gbs"), "{:.1f}"),
              "read GB/s": fmt(r["read_gbs"], "{:.1f}"),
              "peak RSS GB": fmt(r.get("peak_rss_gb")), "threads": r.get("threads", ""),
              "error": r.get("error", "")[:60]} for r in results]
    return table(lines, list(lines[0]))


def add_arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--types", default="q4_K,q8_0,f16", help="block linear types, comma-separated")
    ap.add_argument("--embed-type", default="f32", help="type of the tables (and audio heads)")
    ap.add_argument("--frames", type=int, default=24, help="frames per run (≥ 8)")
    ap.add_argument("--prompt", type=int, default=200, help="prompt rows (a voice clone)")
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--data", default=os.environ.get("MOSS_TTS_BENCH_DATA", str(
        ROOT / "bench" / "results" / "local_v15_data")), help="where the weights are written once")
    ap.add_argument("--peer", action="store_true", help="also time upstream's PyTorch f32")
    ap.add_argument("--upstream-src", default=None,
                    help=f"OpenMOSS/MOSS-TTS checkout or mirror (default ${UPSTREAM_ENV})")
    add_no_wait(ap)
    ap.add_argument("--tiny", action="store_true", help="small dims: check the script runs")
    ap.add_argument("--worker", choices=["ours", "peer"], help=argparse.SUPPRESS)
    ap.add_argument("--type", help=argparse.SUPPRESS)


def run(args) -> list[dict]:
    if args.frames < 2 * FIRST_CHUNK:
        raise SystemExit(f"--frames must be at least {2 * FIRST_CHUNK}")
    if args.worker:
        out = {"ours": run_ours, "peer": run_peer}[args.worker](args)
        print(json.dumps(out | {"peak_rss_gb": peak_rss_gb()}))
        return [out]
    driver, results = measure_types(args, __file__, "local-v15-bench.log", measure_type,
                                    probe_bytes=1 << 28 if args.tiny else 1 << 30)
    driver.say(report(results))
    end_report(driver)
    return results


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_arguments(ap)
    args = ap.parse_args(argv)
    results = run(args)
    if not args.worker:
        print(json.dumps(results))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
