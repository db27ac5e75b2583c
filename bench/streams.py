"""Several MOSS-TTS-Nano streams in one decode step (issue 25), at the REAL dimensions with random
weights (bench/nano.py's checkpoint, stop_bias −50 so no stream stops): per-stream ms per frame
and aggregate audio seconds per wall second at 1, 2, 4 streams decoded together
(`BatchDecoder`), against one stream through today's one-stream loop (`NanoTTS.iter_frames`),
each with --threads 1 and 2, in one run. Audio seconds are generated frames × 80 ms (the codec
decode, per stream and unbatched, is not in these figures).

    python bench/streams.py [--types f32,q8_0] [--streams 1,2,4] [--threads-list 1,2]
                            [--frames 30] [--warmup 5] [--repeat 1] [--no-wait]

Every measurement runs in a fresh subprocess (`--worker ...`), after waiting for a quiet machine
unless --no-wait (then the other load seen is reported beside each row). Not a timed test.
"""

from __future__ import annotations

import argparse
import json
import shlex
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.common import cpu_line, table  # noqa: E402
from bench.harness import Contention, Driver, add_no_wait, peak_rss_gb, report_footer  # noqa: E402
from bench.nano import SENTENCE, WORK, gguf_path, make_checkpoint  # noqa: E402

FRAME_S = 0.080
GOAL = 3.0   # issue 25: Nano f32 at 4 streams ≥ 3× one stream's aggregate on this 2-core host


def _load(args):
    from moss_tts.models.nano_tts import NanoTTS

    return NanoTTS.load(gguf_path(args.type), threads=args.threads)


def worker_batch(args) -> dict:
    """`streams` jobs of the one-sentence prompt (seeds 0..), all joining at the first step and
    running warmup + frames frames: the wall time of each step after the warmup."""
    from moss_tts.models.batching import BatchDecoder
    from moss_tts.models.nano_decode import NanoBatch
    from moss_tts.sampling import SamplingOptions

    tts = _load(args)
    rows = tts.plan(SENTENCE)[0][1]
    n, streams = args.warmup + args.frames, int(args.streams)
    times = []
    c = None
    with BatchDecoder(NanoBatch(tts.model), max_streams=streams) as batch:
        jobs = [batch.submit(batch.family.job(rows, SamplingOptions(), seed, n))
                for seed in range(streams)]
        while batch.active or batch.queue or batch.joining:
            if batch.steps == args.warmup:
                c = Contention()
            t0 = time.perf_counter()
            batch.step()
            if batch.steps > args.warmup:
                times.append(time.perf_counter() - t0)
        if any(len(j.items) != n for j in jobs):
            raise SystemExit("a stream stopped early (stop_bias should prevent it)")
    step = statistics.median(times[:-1])       # the last step has no global step after it
    return {"step_ms": 1e3 * step, "steps": len(times), "foreign": c.share(),
            "peak_rss_gb": peak_rss_gb()}


def worker_alone(args) -> dict:
    """One stream through NanoTTS.iter_frames (today's loop): the wall time of each frame."""
    tts = _load(args)
    rows = tts.plan(SENTENCE)[0][1]
    n = args.warmup + args.frames
    times, c = [], None
    t0 = time.perf_counter()
    for i, _ in enumerate(tts.iter_frames(rows, seed=0, max_frames=n)):
        t = time.perf_counter()
        if i == args.warmup - 1:
            c = Contention()
        if i >= args.warmup:
            times.append(t - t0)
        t0 = t
    if len(times) != args.frames:
        raise SystemExit("the stream stopped early (stop_bias should prevent it)")
    return {"step_ms": 1e3 * statistics.median(times), "steps": len(times),
            "foreign": c.share(), "peak_rss_gb": peak_rss_gb()}


WORKERS = {"batch": worker_batch, "alone": worker_alone}


def row(key: tuple, r: dict, alone: dict, one: dict) -> dict:
    t, threads, mode, streams = key
    out = {"type": t, "threads": threads, "mode": mode, "streams": streams}
    if "error" in r:
        return out | {"ms/step": r["error"][:60]}
    agg = streams * FRAME_S / (r["step_ms"] / 1e3)
    rate = lambda base: f"{agg / (FRAME_S / (base['step_ms'] / 1e3)):.2f}" \
        if "step_ms" in base else ""  # noqa: E731
    return out | {"ms/step": f"{r['step_ms']:.1f}", "audio s / wall s": f"{agg:.2f}",
                  "× one-stream loop": rate(alone), "× batch of 1": rate(one),
                  "other load": f"{100 * r['foreign']:.0f} %",
                  "peak RSS GB": f"{r['peak_rss_gb']:.2f}"}


def drive(args) -> int:
    WORK.mkdir(parents=True, exist_ok=True)
    d = Driver(args, WORK / "streams_log.txt", script=Path(__file__))
    d.say(f"=== bench/streams.py {time.strftime('%Y-%m-%d %H:%M:%S')}: "
          f"{' '.join(shlex.quote(a) for a in sys.argv)}")
    d.say(f"CPU: {cpu_line()}")
    t_start = time.perf_counter()
    make_checkpoint(log=d.say)
    types = [t for t in args.types.split(",") if t]
    for t in types:
        if not gguf_path(t).exists():
            got = d.run([sys.executable, "bench/nano.py", "--worker", "convert", "--type", t],
                        timing=False)
            d.say(f"converted {t}: {json.dumps(got)}")
    keys = [(t, threads, mode, n) for t in types
            for threads in [int(x) for x in args.threads_list.split(",")]
            for mode, n in [("one-stream loop", 1)]
            + [("batch", int(x)) for x in args.streams.split(",")]]
    best: dict[tuple, dict] = {}
    for round_ in range(args.repeat):     # rounds interleave the rows; keep the least disturbed
        for key in keys:
            t, threads, mode, n = key
            kw = {"type": t, "threads": threads, "frames": args.frames, "warmup": args.warmup}
            r = d.worker("alone", **kw) if mode != "batch" else d.worker("batch", streams=n, **kw)
            d.say(f"round {round_ + 1}: {key}: {json.dumps(r)}")
            old = best.get(key)
            if old is None or r.get("foreign", 1) < old.get("foreign", 1):
                best[key] = r
    rows = [row(key, best[key], best[(key[0], key[1], "one-stream loop", 1)],
                best.get((key[0], key[1], "batch", 1), {})) for key in keys]
    d.say("")
    d.say(f"Nano real dims, random weights, prompt: one sentence; medians of {args.frames} steps "
          f"after {args.warmup} warm-up, the least disturbed of {args.repeat} round(s); a batch "
          f"step makes one frame (80 ms of audio) for each stream, so ms/step is each stream's "
          f"ms per frame; × = aggregate audio s / wall s against one stream (goal, f32 at 4 "
          f"streams: ≥ {GOAL}×)")
    d.say(table(rows, ["type", "threads", "mode", "streams", "ms/step", "audio s / wall s",
                       "× one-stream loop", "× batch of 1", "other load", "peak RSS GB"]))
    for line in report_footer(d, time.perf_counter() - t_start):
        d.say(line)
    return 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--types", default="f32,q8_0")
    ap.add_argument("--streams", default="1,2,4")
    ap.add_argument("--threads-list", default="1,2")
    ap.add_argument("--frames", type=int, default=30)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--repeat", type=int, default=1,
                    help="rounds over every row; each row keeps its least disturbed result")
    add_no_wait(ap)
    ap.add_argument("--worker", choices=sorted(WORKERS), help=argparse.SUPPRESS)
    ap.add_argument("--type", default="f32", help=argparse.SUPPRESS)
    ap.add_argument("--threads", type=int, default=2, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:
        print(json.dumps(WORKERS[args.worker](args)))
        return 0
    return drive(args)


if __name__ == "__main__":
    raise SystemExit(main())
