"""Several streams in one decode step (issue 25), at a family's REAL dimensions with random
weights (bench/streams_families.py: Nano, Local, Local v1.5, Realtime): aggregate audio seconds
per wall second and per-stream ms per frame at 1, 2, 4, 8 streams decoded together, against (a)
one stream through today's one-stream loop and (b) the same number of streams as separate
processes, each with max(1, threads // N) threads as `batch --workers` gives them; then the
time to first audio of a request that arrives while 3 others run, against an idle one's; peak
RSS; each at --threads-list.

    python bench/streams.py [--family nano,local,local_v15,realtime] [--types f32,q8_0]
        [--streams 1,2,4,8] [--threads-list 1,2] [--frames 30] [--warmup 5] [--runs 3]
        [--repeat 1] [--source auto|frames|stream] [--no-wait]

--source frames (auto where the family has it) takes the frames alone (the one-stream loop, or
the family's BatchFamily jobs): the codec decode, per stream and unbatched, is not in those
figures, and audio seconds are frames × 80 ms. --source stream goes through the public API
(`tts.stream`, inside `tts.decoding_together(N)` for a batch): the codec is in, audio seconds
are the samples made. First audio goes through the public API where the family has a codec
(Nano); the Qwen3 families have none at real dims here, so they run frames only and report the
frame-level equivalent: a job submitted (or the one-stream loop started) → its first frame.
Every measurement runs in a fresh subprocess (`--worker ...`), after waiting for a quiet
machine unless --no-wait (then the other load seen is reported beside each row). Not a timed
test.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.common import cpu_line, table  # noqa: E402
from bench.harness import (Contention, Driver, add_no_wait, peak_rss_gb,  # noqa: E402
                           report_footer, start_line)
from bench.nano import WORK  # noqa: E402
from bench.streams_families import FAMILIES, FRAME_S, quiet_budget_warnings  # noqa: E402
from moss_tts.models.batching import PREFILL_ROWS  # noqa: E402

# issue 25's goals on this 2-core host class
GOAL_STREAMS, GOAL_SPEEDUP = 4, 3.0   # Nano f32 at 4 streams ≥ 3× one stream's aggregate
GOAL_FIRST_AUDIO = 1.5                # first audio under load ≤ 1.5× an idle server's
# frames of budget per stream for the rounds in which the others' prompts join (prompts of up
# to 512 rows, appended PREFILL_ROWS at a time): every stream is still running when timed
JOIN_ROUNDS = 512 // PREFILL_ROWS
RAM_SHARE = 0.8         # N processes "fit" when N × the weight bytes ≤ this share of MemTotal
LOAD_STREAMS = 3        # streams already running when the first-audio request arrives
ONE, BATCH, PROCS = "one-stream loop", "batch", "processes"


# --- workers (each in its own process) -----------------------------------------------------------
def _family(args):
    quiet_budget_warnings()
    return FAMILIES[args.family]


def _source(fam, args) -> str:
    if args.source == "auto":
        return "frames" if fam.frames is not None else "stream"
    return args.source


def _seconds_of(source: str, sample_rate: int):
    """Audio seconds of one pulled item: a frame, or a chunk of samples."""
    return (lambda item: FRAME_S) if source == "frames" else \
        (lambda chunk: len(chunk) / sample_rate)


def pull_rounds(streams: list, seconds_of, warmup: int, frames: int) -> dict:
    """Pull one item of each stream in turn (the server's worker loop): the first round holds
    every join (a stream's first pull runs steps until its prompt is in), then `warmup` rounds,
    then `frames` timed rounds. A round of a batch is one step: each makes one frame per stream."""
    times, audio, c = [], 0.0, None
    for r in range(1 + warmup + frames):
        if r == 1 + warmup:
            c = Contention()
        t0, made = time.perf_counter(), 0.0
        for k, stream in enumerate(streams):
            item = next(stream, None)
            if item is None:
                raise SystemExit(f"stream {k} stopped after {r} rounds (its random model should "
                                 "not stop, and its budget holds the joins): see the family entry")
            made += seconds_of(item)
        if r > warmup:
            times.append(time.perf_counter() - t0)
            audio += made
    for stream in streams:
        stream.close()
    return {"step_ms": 1e3 * statistics.median(times), "rounds": len(times), "audio_s": audio,
            "rate": audio / sum(times), "foreign": c.share(), "peak_rss_gb": peak_rss_gb()}


def _budget(args, streams: int) -> int:
    return 1 + args.warmup + args.frames + JOIN_ROUNDS * streams


def wait_for_peers(barrier: str | None, parties: int) -> None:
    """Processes of one group start decoding together: each marks itself ready (after loading)
    and waits until all are."""
    if not barrier:
        return
    Path(barrier, str(os.getpid())).touch()
    deadline = time.monotonic() + 600
    while len(list(Path(barrier).iterdir())) < parties:
        if time.monotonic() > deadline:
            raise SystemExit(f"only {len(list(Path(barrier).iterdir()))} of {parties} peers ready")
        time.sleep(0.01)


def worker_alone(args) -> dict:
    """One stream through the one-stream loop (a member of a process group too)."""
    fam = _family(args)
    source = _source(fam, args)
    tts = fam.load(args.type, args.threads, source == "stream")
    n = _budget(args, 1)
    wait_for_peers(args.barrier, args.parties)
    stream = fam.frames(tts, 0, n) if source == "frames" else \
        tts.stream(fam.text, **fam.stream_kwargs(0, n))
    out = pull_rounds([stream], _seconds_of(source, tts.sample_rate), args.warmup, args.frames)
    return out | {"source": source}


def worker_batch(args) -> dict:
    """`streams` streams (seeds 0..) decoded together, joining as the API lets them."""
    fam = _family(args)
    source = _source(fam, args)
    tts = fam.load(args.type, args.threads, source == "stream")
    streams = int(args.streams)
    n = _budget(args, streams)
    with tts.decoding_together(streams) as batch:
        if source == "frames":
            made = [batch.items(fam.job(tts, batch.family, seed, n)) for seed in range(streams)]
        else:
            made = [tts.stream(fam.text, **fam.stream_kwargs(seed, n)) for seed in range(streams)]
        out = pull_rounds(made, _seconds_of(source, tts.sample_rate), args.warmup, args.frames)
    return out | {"source": source}


def first_item(start, running: list = ()) -> float:
    """Seconds from starting a stream (`start()`) to its first item, pulling the running streams
    (one item each) and then it, in turn, as the server's worker does."""
    t0 = time.perf_counter()
    stream = start()
    try:
        while True:
            for other in running:
                if next(other, None) is None:
                    raise SystemExit("a running stream ended while the new one started: raise "
                                     "its budget or lower --runs")
            if next(stream, None) is not None:
                return time.perf_counter() - t0
    finally:
        stream.close()


def worker_first_audio(args) -> dict:
    """A request's first audio: idle (no decoding_together; then alone inside one), and while
    LOAD_STREAMS others run inside decoding_together(LOAD_STREAMS + 1). The first call of each
    case is cold (graphs built, weights paged in) and not counted; medians of --runs. A family
    without a codec here (`fam.codec` False) gets the frame-level equivalent: from submitting
    its one-stream loop, or its job to the batch, to the first frame."""
    fam = _family(args)
    source = "stream" if fam.codec else "frames"
    tts = fam.load(args.type, args.threads, fam.codec)
    c = Contention()
    budget = _budget(args, LOAD_STREAMS + 1) + (args.runs + 1) * JOIN_ROUNDS

    def start(batch, seed: int):
        """A new request: `tts.stream` (inside decoding_together it joins the batch), or
        without a codec the one-stream loop (batch None) or a job of the batch."""
        if fam.codec:
            return tts.stream(fam.text, **fam.stream_kwargs(seed, budget))
        if batch is None:
            return fam.frames(tts, seed, budget)
        return batch.items(fam.job(tts, batch.family, seed, budget))

    def timed(batch=None, running=()) -> list[float]:
        return [first_item(lambda: start(batch, 100 + i), running)
                for i in range(args.runs + 1)][1:]

    idle = timed()
    with tts.decoding_together(LOAD_STREAMS + 1) as batch:
        inside = timed(batch)
    with tts.decoding_together(LOAD_STREAMS + 1) as batch:
        running = [start(batch, seed) for seed in range(LOAD_STREAMS)]
        for _ in range(1 + args.warmup):            # all joined and decoding
            for stream in running:
                next(stream)
        # the first builds the graphs of a prompt appended in chunks: not counted either
        loaded = timed(batch, running)
        for stream in running:
            stream.close()
    ms = lambda xs: 1e3 * statistics.median(xs)    # noqa: E731
    return {"idle_ms": ms(idle), "idle_together_ms": ms(inside), "loaded_ms": ms(loaded),
            "loaded_all_ms": [1e3 * x for x in loaded], "foreign": c.share(),
            "peak_rss_gb": peak_rss_gb(), "source": source}


WORKERS = {"alone": worker_alone, "batch": worker_batch, "first_audio": worker_first_audio}


# --- driver --------------------------------------------------------------------------------------
def mem_total_bytes() -> int:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemTotal:"):
            return int(line.split()[1]) * 1024
    return 0


def fits_in_ram(weight_bytes: int, n: int) -> str | None:
    """None when n processes' weights fit, else why not (for the row)."""
    total = mem_total_bytes()
    if n * weight_bytes <= RAM_SHARE * total:
        return None
    return (f"would not fit: {n} × {weight_bytes / 1e9:.1f} GB > {100 * RAM_SHARE:.0f} % of "
            f"{total / 1e9:.1f} GB RAM")


def run_group(d: Driver, n: int, kw: dict) -> dict:
    """n `alone` workers started together (a shared barrier after loading), each with kw's
    threads: their summed rates and peak RSS. The other load is measured here, over the whole
    group (each worker's own figure counts its peers as others)."""
    with tempfile.TemporaryDirectory(prefix="streams-barrier-") as barrier:
        cmds = []
        for _ in range(n):
            cmd = [sys.executable, "bench/streams.py", "--worker", "alone", "--barrier", barrier,
                   "--parties", str(n)]
            for k, v in kw.items():
                cmd += [f"--{k}", str(v)]
            cmds.append(cmd)
        d.quiet.wait()        # never waits with --no-wait
        d.commands.append(f"{n} at once: " + " ".join(shlex.quote(c) for c in cmds[0]))
        c = Contention(children=True)
        procs = [subprocess.Popen(c, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                  text=True) for c in cmds]
        outs = [p.communicate() + (p.returncode,) for p in procs]
        foreign = c.share()
    results = []
    for stdout, stderr, rc in outs:
        if rc != 0:
            d.say(f"FAILED ({rc}): a process of {n}\n{stderr[-3000:]}")
            return {"error": stderr.strip().splitlines()[-1] if stderr.strip() else "failed"}
        results.append(json.loads(stdout.strip().splitlines()[-1]))
    return {"rate": sum(r["rate"] for r in results),
            "step_ms": statistics.median(r["step_ms"] for r in results),
            "foreign": foreign,
            "peak_rss_gb": sum(r["peak_rss_gb"] for r in results),
            "source": results[0]["source"], "each": results}


def measure(d: Driver, args, fam) -> tuple[list[tuple], dict, dict]:
    """Every row of one family: keys (type, threads, mode, streams) → result, and first audio
    per (type, threads). Rounds interleave the rows; each keeps its least disturbed result."""
    types = [t for t in (args.types or fam.types).split(",") if t]
    for t in types:
        fam.prepare(d, t)
    threads_list = [int(v) for v in args.threads_list.split(",")]
    streams = [int(v) for v in args.streams.split(",")]
    keys = [(t, th, mode, n) for t in types for th in threads_list
            for mode, n in [(ONE, 1)] + [(m, n) for n in streams
                                        for m in (BATCH, PROCS) if m == BATCH or n > 1]]
    base = {"family": fam.name, "frames": args.frames, "warmup": args.warmup,
            "source": args.source}
    best: dict = {}
    first: dict = {}
    for round_ in range(args.repeat):
        for key in keys:
            t, th, mode, n = key
            kw = base | {"type": t, "threads": th}
            if mode == ONE:
                r = d.worker("alone", **kw)
            elif mode == BATCH:
                r = d.worker("batch", streams=n, **kw)
            else:
                too_big = fits_in_ram(fam.weight_bytes(t), n)
                r = {"skipped": too_big} if too_big else \
                    run_group(d, n, kw | {"threads": max(1, th // n)})
            d.say(f"round {round_ + 1}: {key}: {json.dumps(r)}")
            old = best.get(key)
            if old is None or r.get("foreign", 1) < old.get("foreign", 1):
                best[key] = r
        for t in types:
            for th in threads_list:
                r = d.worker("first_audio", family=fam.name, type=t, threads=th,
                             warmup=args.warmup, runs=args.runs)
                d.say(f"round {round_ + 1}: first audio {t} threads {th}: {json.dumps(r)}")
                old = first.get((t, th))
                if old is None or r.get("foreign", 1) < old.get("foreign", 1):
                    first[(t, th)] = r
    return keys, best, first


# --- report --------------------------------------------------------------------------------------
def ratio(a: dict, b: dict) -> str:
    """a's aggregate audio s / wall s over b's, or '' when either did not run."""
    return f"{a['rate'] / b['rate']:.2f}" if "rate" in a and "rate" in b else ""


def throughput_rows(keys, best) -> list[dict]:
    rows = []
    for key in keys:
        t, th, mode, n = key
        r, one = best[key], best[(t, th, ONE, 1)]
        out = {"type": t, "threads": th, "mode": mode, "streams": n,
               "threads each": max(1, th // n) if mode == PROCS else th}
        if "error" in r or "skipped" in r:
            rows.append(out | {"ms/step": (r.get("error") or r["skipped"])[:80]})
            continue
        rows.append(out | {"ms/step": f"{r['step_ms']:.1f}", "audio s / wall s": f"{r['rate']:.2f}",
                           "× one stream": ratio(r, one),
                           "× batch of 1": ratio(r, best.get((t, th, BATCH, 1), {}))
                           if mode == BATCH else "",
                           "× processes": ratio(r, best.get((t, th, PROCS, n), {}))
                           if mode == BATCH else "",
                           "other load": f"{100 * r['foreign']:.0f} %",
                           "peak RSS GB": f"{r['peak_rss_gb']:.2f}"
                           + (" (sum)" if mode == PROCS else "")})
    return rows


def threads_rows(keys, best, threads_list) -> list[dict]:
    """What more cores change: each row's audio s / wall s at each --threads, and last ÷ first."""
    rows = []
    for t, _, mode, n in [k for k in keys if k[1] == threads_list[0]]:
        got = [best.get((t, th, mode, n), {}) for th in threads_list]
        row = {"type": t, "mode": mode, "streams": n}
        row |= {f"threads {th}": f"{r['rate']:.2f}" if "rate" in r else ""
                for th, r in zip(threads_list, got)}
        row[f"{threads_list[-1]} ÷ {threads_list[0]}"] = ratio(got[-1], got[0])
        rows.append(row)
    return rows


def first_audio_rows(first) -> list[dict]:
    rows = []
    for (t, th), r in first.items():
        row = {"type": t, "threads": th}
        if "error" in r:
            rows.append(row | {"idle ms": r["error"][:80]})
            continue
        rows.append(row | {"idle ms": f"{r['idle_ms']:.0f}",
                           "idle, together ms": f"{r['idle_together_ms']:.0f}",
                           f"{LOAD_STREAMS} running ms": f"{r['loaded_ms']:.0f}",
                           "÷ idle": f"{r['loaded_ms'] / r['idle_ms']:.2f}",
                           "÷ idle together": f"{r['loaded_ms'] / r['idle_together_ms']:.2f}",
                           "other load": f"{100 * r['foreign']:.0f} %"})
    return rows


def verdict(ok: bool) -> str:
    return "met" if ok else "NOT met"


def goal_lines(fam, keys, best, first) -> list[str]:
    """The goals, each with what this run measured against it."""
    lines = []
    for t, th, mode, n in keys:
        r, one = best[(t, th, mode, n)], best[(t, th, ONE, 1)]
        if mode != BATCH or "rate" not in r or "rate" not in one:
            continue
        speedup = r["rate"] / one["rate"]
        if fam.name == "nano" and t == "f32" and n == GOAL_STREAMS:
            lines.append(f"  f32, {n} streams, {th} thread(s): {speedup:.2f}× one stream (goal "
                         f"≥ {GOAL_SPEEDUP}×): {verdict(speedup >= GOAL_SPEEDUP)}")
        if speedup < 1.0:
            lines.append(f"  {t}, {n} streams, {th} thread(s): {speedup:.2f}× one stream: "
                         "BELOW it")
    what = "first audio" if fam.codec else "first frame (frame-level, no codec)"
    for (t, th), r in first.items():
        if "loaded_ms" in r:
            slower = r["loaded_ms"] / r["idle_ms"]
            lines.append(f"  {what} {t}, {th} thread(s): {slower:.2f}× idle (goal ≤ "
                         f"{GOAL_FIRST_AUDIO}×): {verdict(slower <= GOAL_FIRST_AUDIO)}")
    return lines


def report(d: Driver, args, fam, keys, best, first) -> None:
    source = next((r["source"] for r in best.values() if "source" in r), args.source)
    what = "frames alone, codec not in" if source == "frames" else \
        "tts.stream, codec decode in (per stream)"
    d.say("")
    d.say(f"{fam.name} real dims, random weights ({fam.keeps_going}); prompt: one sentence; "
          f"source: {source} ({what}); medians of {args.frames} rounds after {args.warmup} "
          f"warm-up, the least disturbed of {args.repeat} round(s). A batch step makes one "
          f"frame (80 ms of audio) per stream, so ms/step is each stream's ms per frame; "
          f"processes: N one-stream processes started together, max(1, threads // N) threads "
          f"each (batch --workers), their rates and peak RSS summed (the mmapped weights' "
          f"pages, shared, count once per process); × = aggregate audio s / wall s against "
          f"the other")
    d.say(table(throughput_rows(keys, best),
                ["type", "threads", "mode", "streams", "threads each", "ms/step",
                 "audio s / wall s", "× one stream", "× batch of 1", "× processes", "other load",
                 "peak RSS GB"]))
    threads_list = [int(v) for v in args.threads_list.split(",")]
    if len(threads_list) > 1:
        d.say("")
        d.say("what more cores change: audio s / wall s by --threads")
        rows = threads_rows(keys, best, threads_list)
        d.say(table(rows, list(rows[0])))
    d.say("")
    what = "first audio (tts.stream → its first chunk, codec in" if fam.codec else \
        ("first FRAME, the frame-level equivalent of first audio (no codec at real dims here: "
         "its one-stream loop or its job submitted → its first frame, codec not in")
    d.say(f"{what}; medians of {args.runs} warm): idle; alone inside decoding_together("
          f"{LOAD_STREAMS + 1}); arriving while {LOAD_STREAMS} others run in it, all pulled in "
          f"turn as the server's worker does")
    rows = first_audio_rows(first)
    d.say(table(rows, list(max(rows, key=len))))
    d.say("")
    d.say(f"goals (issue 25, this 2-core host class): Nano f32 at {GOAL_STREAMS} streams ≥ "
          f"{GOAL_SPEEDUP}× one stream; never below one stream; first audio under load ≤ "
          f"{GOAL_FIRST_AUDIO}× idle")
    for line in goal_lines(fam, keys, best, first):
        d.say(line)


def drive(args) -> int:
    WORK.mkdir(parents=True, exist_ok=True)
    d = Driver(args, WORK / "streams_log.txt", script=Path(__file__))
    d.say(start_line("bench/streams.py"))
    d.say(f"CPU: {cpu_line()}")
    t_start = time.perf_counter()
    for name in args.family.split(","):
        fam = FAMILIES[name]
        blocked = fam.blocked(args.source)
        if blocked:
            d.say(f"{name}: {blocked}")
            continue
        keys, best, first = measure(d, args, fam)
        report(d, args, fam, keys, best, first)
    d.say("")
    for line in report_footer(d, time.perf_counter() - t_start):
        d.say(line)
    return 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--family", default="nano",
                    help=f"comma-separated, of: {', '.join(FAMILIES)}")
    ap.add_argument("--types", default=None, help="weight types (default: the family's)")
    ap.add_argument("--streams", default="1,2,4,8")
    ap.add_argument("--threads-list", default="1,2")
    ap.add_argument("--frames", type=int, default=30)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--runs", type=int, default=3, help="first-audio requests timed per case")
    ap.add_argument("--repeat", type=int, default=1,
                    help="rounds over every row; each row keeps its least disturbed result")
    ap.add_argument("--source", choices=("auto", "frames", "stream"), default="auto",
                    help="frames alone (codec not in), or through tts.stream (codec in)")
    add_no_wait(ap)
    ap.add_argument("--worker", choices=sorted(WORKERS), help=argparse.SUPPRESS)
    ap.add_argument("--type", default="f32", help=argparse.SUPPRESS)
    ap.add_argument("--threads", type=int, default=2, help=argparse.SUPPRESS)
    ap.add_argument("--barrier", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--parties", type=int, default=1, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    unknown = [f for f in args.family.split(",") if f not in FAMILIES]
    if unknown:
        ap.error(f"unknown --family {', '.join(unknown)}; one of {', '.join(FAMILIES)}")
    if args.worker:
        print(json.dumps(WORKERS[args.worker](args)))
        return 0
    return drive(args)


if __name__ == "__main__":
    raise SystemExit(main())
