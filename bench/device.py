"""Decode steps at the releases' real dimensions on a named backend beside the CPU (issue 26):
MOSS-TTS-Nano (f32, q8_0; a frame = the global step and its 17-position depth loop), MOSS-TTS
8B Delay (q8_0; a row) and MOSS-TTS-Realtime (q4_K; a frame = the backbone step and 16 local
steps), a few steps each on seeded random weights, with each step's bandwidth floor: the bytes a
step reads ÷ the backend's read bandwidth (a device's from --device-gbs, the CPU's measured).

    python bench/device.py --backend cuda [--device-gbs 4800] [--cases nano:f32,delay:q8_0]
        [--steps 8] [--tiny] [--json FILE]

The weight files are written once under --data (default $MOSS_TTS_BENCH_DATA or
bench/results/device_data), as bench/nano.py, bench/delay.py and bench/realtime.py write theirs;
--tiny uses small dimensions to check the script runs. A step's time is its wall time on the
host (graph run, copies in and out, sampling), the median after two warm-up steps.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import table  # noqa: E402
from bench.harness import ROOT, fmt, median  # noqa: E402
from bench.matmul import ReadProbe  # noqa: E402
from moss_tts.ggml import Backend  # noqa: E402

CASES = ("nano:f32", "nano:q8_0", "delay:q8_0", "realtime:q4_K")
WARMUP = 2          # steps left out of the median (graph builds, first uploads)
PROBE_BYTES = 1 << 30


def nano_steps(backend: Backend, kind: str, args) -> tuple[list[float], int]:
    """Per-frame seconds of NanoTTS.iter_frames after a one-sentence prompt, and the bytes a
    frame reads: the global layers, (n_vq + 1) passes of the local layer and n_vq audio heads."""
    from bench.nano import DIMS, SENTENCE
    from converters.nano import convert
    from fixtures.make_nano import make_tiny_nano_tts_checkpoint
    from fixtures.make_spm import make_tiny_spm
    from moss_tts.models.nano_tts import NanoTTS

    work = Path(args.data) / f"nano-{'tiny' if args.tiny else 'real'}"
    gguf = work / f"nano-{kind}.gguf"
    if not gguf.exists():
        ckpt = work / "checkpoint"
        if not (ckpt / "model.safetensors").exists():
            dims = {"stop_bias": -50.0} if args.tiny else DIMS
            make_tiny_nano_tts_checkpoint(ckpt, tokenizer_model_bytes=make_tiny_spm(), seed=0,
                                          **dims)
        convert(str(ckpt), gguf, outtype=kind)
    n = WARMUP + args.steps + 1      # the first interval holds the prefill: not a step
    with NanoTTS.load(gguf, codec=None, backend=backend) as tts:
        t = tts.model.weights.file.tensors
        n_vq = tts.model.config.n_vq
        step_bytes = (sum(i.nbytes for k, i in t.items() if k.startswith("transformer.h."))
                      + (n_vq + 1) * sum(i.nbytes for k, i in t.items()
                                         if k.startswith("local_transformer.h."))
                      + n_vq * t["audio_embeddings.0.weight"].nbytes)
        rows = tts.plan(SENTENCE)[0][1]
        times, frames = [], tts.iter_frames(rows, seed=0, max_frames=n)
        t0 = time.perf_counter()
        for _ in frames:
            times.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
        frames.close()
    return times[1:], step_bytes


def delay_steps(backend: Backend, kind: str, args) -> tuple[list[float], int]:
    """Per-row seconds of the 8B Delay after a 100-row voice-clone prompt (bench/delay.py's
    loop: sample the next row, feed it back), and the bytes a row reads (its backbone file and
    the heads and tables as held)."""
    from bench.delay import Steps, voice_clone_prompt
    from bench.delay_weights import weight_bytes, weights_dir
    from moss_tts.models.delay import step_run
    from moss_tts.models.delay_published import load_published

    d = weights_dir(SimpleNamespace(checkpoint="tts", tiny=args.tiny, type=kind,
                                    head_type=None, data=args.data))
    model = load_published(d, backend)
    try:
        cfg = model.config
        rows = voice_clone_prompt(cfg, 100)
        steps, times = Steps(cfg, rows), []
        with model.make_session(len(rows) + WARMUP + args.steps) as session:
            text, audio = step_run(session, rows, steps.state, cfg)
            for _ in range(WARMUP + args.steps):
                t0 = time.perf_counter()
                row = steps.sample(text, audio)
                text, audio = step_run(session, row[None], steps.state, cfg)
                times.append(time.perf_counter() - t0)
    finally:
        model.close()
    return times, weight_bytes(d, False)


def realtime_steps(backend: Backend, kind: str, args) -> tuple[list[float], int]:
    """Per-frame seconds of a Realtime stream after a 120-row prompt (bench/realtime.py's), and
    the bytes a frame reads (bench/realtime.py frame_bytes)."""
    from bench.realtime import PROMPT_ROWS, config, frame_bytes, weights
    from moss_tts.ggml import Weights
    from moss_tts.models.realtime import RealtimeModel

    path = weights(SimpleNamespace(type=kind, tiny=args.tiny, data=args.data))
    n = WARMUP + args.steps
    model = RealtimeModel(Weights.load(path, backend))
    try:
        cfg, rng = model.config, np.random.default_rng(0)
        rows = np.full((PROMPT_ROWS, cfg.rvq + 1), cfg.audio_pad_token, dtype=np.int64)
        rows[:, 0] = rng.integers(1000, 150000, PROMPT_ROWS)
        rows[-1, 1] = cfg.audio_bos
        times = []
        with model.stream(PROMPT_ROWS + n + 1) as s:
            s.start(rows)
            for _ in range(n):
                t0 = time.perf_counter()
                s.step(int(rng.integers(1000, 150000)))
                times.append(time.perf_counter() - t0)
    finally:
        model.close()
    return times, frame_bytes(path, config(args.tiny), PROMPT_ROWS + n)


RUNNERS = {"nano": nano_steps, "delay": delay_steps, "realtime": realtime_steps}


def measure(case: str, backend_name: str, gbs: float, args) -> dict:
    family, kind = case.split(":")
    out = {"case": case, "backend": backend_name}
    t0 = time.perf_counter()
    try:
        with Backend(backend_name, threads=args.threads) as backend:
            times, step_bytes = RUNNERS[family](backend, kind, args)
    except Exception as e:      # one case's failure is a row of the report, not the end of it
        return out | {"error": f"{type(e).__name__}: {e}"[:200],
                      "seconds": time.perf_counter() - t0}
    warm = times[WARMUP:] or times
    ms = 1e3 * median(warm)
    floor = 1e3 * step_bytes / (gbs * 1e9)
    return out | {"step_ms": ms, "steps": len(warm), "step_mb": step_bytes / 1e6,
                  "read_gbs": gbs, "floor_ms": floor, "over_floor": ms / floor,
                  "seconds": time.perf_counter() - t0}


def report(results: list[dict]) -> str:
    rows = [{"case": r["case"], "backend": r["backend"], "ms/step": fmt(r.get("step_ms")),
             "MB/step": fmt(r.get("step_mb"), "{:.0f}"), "GB/s": fmt(r.get("read_gbs"), "{:.0f}"),
             "floor ms": fmt(r.get("floor_ms"), "{:.3f}"),
             "ms/floor": fmt(r.get("over_floor")), "steps": r.get("steps", ""),
             "s": fmt(r.get("seconds"), "{:.0f}"), "error": r.get("error", "")}
            for r in results]
    return table(rows, list(rows[0]))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--backend", default=None,
                    help="the device (cuda, vulkan, rpc://HOST:PORT); none: the CPU only")
    ap.add_argument("--device-gbs", type=float, default=4800.0,
                    help="the device's read bandwidth for its floor, GB/s (H200: 4800)")
    ap.add_argument("--no-cpu", action="store_true", help="skip the CPU figures")
    ap.add_argument("--cases", default=",".join(CASES),
                    help=f"family:type, comma-separated (default {','.join(CASES)})")
    ap.add_argument("--steps", type=int, default=8, help="measured steps per case (after 2)")
    ap.add_argument("--threads", type=int, default=None, help="CPU threads")
    ap.add_argument("--tiny", action="store_true", help="small dims: check the script runs")
    ap.add_argument("--data", default=os.environ.get(
        "MOSS_TTS_BENCH_DATA", str(ROOT / "bench" / "results" / "device_data")),
        help="where the random-weight files are written once and reused")
    ap.add_argument("--json", help="also write the results here")
    args = ap.parse_args(argv)
    cases = [c.strip() for c in args.cases.split(",") if c.strip()]
    for c in cases:
        if c.split(":")[0] not in RUNNERS or ":" not in c:
            ap.error(f"--cases: {c!r} is not family:type with a family of {', '.join(RUNNERS)}")
    sides = ([] if args.no_cpu else ["cpu"]) + ([args.backend] if args.backend else [])
    if not sides:
        ap.error("nothing to run: --no-cpu without --backend")
    cpu_gbs = None
    results = []
    for case in cases:
        for side in sides:
            if side == "cpu" and cpu_gbs is None:
                cpu_gbs = ReadProbe(PROBE_BYTES, Backend("cpu", args.threads).threads).gbps(5)
            gbs = cpu_gbs if side == "cpu" else args.device_gbs
            results.append(measure(case, side, gbs, args))
            print(f"device bench: {json.dumps(results[-1])}", flush=True)
    print(("tiny dims (a check of the script, not figures)\n" if args.tiny else "")
          + report(results))
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))
    return 1 if any("error" in r for r in results) else 0


if __name__ == "__main__":
    raise SystemExit(main())
