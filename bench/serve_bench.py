"""The speech server as its users measure it (issue 35, part 2): `python -m moss_tts serve` in a
child process, N concurrent clients of the stock `openai` package, streamed and whole, over a
fixed set of texts; per concurrency level: requests per second, audio seconds per second, TTFP
p50/p95, RTF mean/p95, underrun seconds per streamed request, the server's peak RSS, errors.

    python bench/serve_bench.py (--tiny | --model M.gguf --codec C.gguf) [--concurrency 1,2,4,8]
        [--requests 3] [--modes stream,whole] [--frames 40] [--max-streams auto] [--threads 2]
        [--repeat 1] [--warmup 1] [--json bench/results/serve_bench.json] [--no-wait]
        [--keep-speaking realtime|local_v15|delay|local] [--budget-field max_new_rows]

A random model at real dimensions other than Nano's would stop early (or, Delay, never start):
--keep-speaking patches the server process as bench/streams.py's workers are patched, so every
request runs to its --frames budget, sent as --budget-field (Delay's counts rows).

Each level runs `concurrency` clients at once (a closed loop: a client sends its next request
when its last one ended), `--requests` requests each, after `--warmup` unmeasured rounds. The
metrics are those of `vllm bench serve --omni` (vllm_omni/metrics/definitions.py, its bench
metrics), with their names in the JSON, so figures compare:
- audio_ttfp (time to first packet): request sent → its first audio bytes received. Streamed:
  `stream_format: "audio"`, raw pcm; whole: the body's first bytes (about its latency).
- audio_rtf: the request's wall time (sent → last byte) ÷ the seconds of audio it returned
  (s16le bytes at the rate and channels of its X-Audio-* headers); below 1 streams in time.
- audio_throughput: all audio seconds returned ÷ the level's wall time (first send → last end);
  request_throughput: completed requests ÷ that wall time.
- underrun (streamed only): a client that starts playing at its first packet, in real time,
  and waits whenever it has nothing left: the seconds it waited in all. That is the most its
  play clock ran past the audio it had, max_j(t_j − t_1 − audio before chunk j); vLLM-Omni's
  max_underrun_ms is the same but counts chunk j as had on arrival (never more than ours).
- peak RSS: the serve process's VmHWM over the level (reset before it through clear_refs).
- errors: failed requests (any exception, or an answer without audio), with the first message.
The JSON keeps every request's figures too (each level's "records", all repeats); it is written
again as each level ends ("finished": false until the last), so a run stopped early keeps its
levels.
The machine may be shared: each level waits (at most --max-wait s, unless --no-wait) until other
processes use at most 15 % of the CPUs, and reports the share they took while it ran; the
other benches (harness.Quiet) wait while this one runs; --repeat gives medians.
"""

from __future__ import annotations

import argparse
import json
import math
import signal
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.common import cpu_line, table  # noqa: E402
from bench.harness import Contention, add_no_wait, foreign_share, the_command  # noqa: E402
from bench.serve_attacks import serve_on  # noqa: E402
from bench.streams_families import KEEPS_SPEAKING  # noqa: E402

TEXTS = ("The quick brown fox reads a short sentence in the morning, with a calm voice.",
         "Please hold the line while we connect your call to the next available person.",
         "Rain is expected this afternoon, so bring an umbrella if you are going out.",
         "Our train will arrive at the central station in about fifteen minutes.",
         "She opened the old wooden box and found a letter written long ago.",
         "Thank you for listening; the next chapter begins after a short pause.",
         "Turn left at the second light, then keep going until you see the bridge.",
         "A cup of tea and a good book make a quiet evening feel complete.")
MODES = ("stream", "whole")
CONTINUITY_S = 0.1       # vLLM-Omni's audible-gap threshold (AUDIO_CONTINUITY_DEFAULT_THRESHOLD_S)
ZERO_S = 0.001           # underrun counted as none below the timer's resolution
GOAL_CLIENTS, GOAL_TTFP, GOAL_THROUGHPUT = 4, 1.5, 3.0   # issue 35, part 2, Nano on 2 cores
RESULTS = ROOT / "bench" / "results"


# --- one request -------------------------------------------------------------------------------
def underrun_s(arrivals: list[tuple[float, int]], bytes_per_s: float) -> float:
    """Seconds a real-time player starting at the first chunk waited, from (arrival s, bytes)."""
    start, had, waited = arrivals[0][0], 0.0, 0.0
    for t, n in arrivals:
        waited = max(waited, t - start - had)   # its clock ran past the audio it had
        had += n / bytes_per_s
    return waited


def speak(client, mode: str, text: str, body: dict) -> dict:
    """One request through the stock client: its TTFP, wall time, audio seconds and (streamed)
    underrun; or its error."""
    extra = body | ({"stream_format": "audio"} if mode == "stream" else {})
    t0 = time.perf_counter()
    try:
        with client.audio.speech.with_streaming_response.create(
                model="tts-1", voice="alloy", input=text, response_format="pcm",
                extra_body=extra) as r:
            bytes_per_s = 2 * int(r.headers.get("x-audio-sample-rate", 24000)) * \
                int(r.headers.get("x-audio-channels", 1))
            arrivals = [(time.perf_counter() - t0, len(b)) for b in r.iter_bytes() if b]
            e2e = time.perf_counter() - t0
    except Exception as e:  # noqa: BLE001  (a failed request is a counted error, not the end)
        return {"error": f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"}
    audio = sum(n for _, n in arrivals) / bytes_per_s
    if not audio:
        return {"error": "no audio in the answer"}
    out = {"ttfp_s": arrivals[0][0], "e2e_s": e2e, "audio_s": audio, "rtf": e2e / audio}
    if mode == "stream":
        out["underrun_s"] = underrun_s(arrivals, bytes_per_s)
    return out


# --- the server --------------------------------------------------------------------------------
def reset_peak(pid: int) -> bool:
    """Reset the process's VmHWM to its RSS now (Linux clear_refs 5); False where refused."""
    try:
        Path(f"/proc/{pid}/clear_refs").write_text("5")
        return True
    except OSError:
        return False


def peak_rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return math.nan


# --- a level -----------------------------------------------------------------------------------
def clients_run(url: str, mode: str, clients: int, per_client: int, body: dict,
                first_seed: int) -> tuple[list[dict], float]:
    """`clients` threads × `per_client` requests with the fields of `body` and their own seed:
    every request's record (with `sent_s`, when it was sent in the level, and `round`, the
    client's how-many-th), and the wall time."""
    import openai

    records, lock = [], threading.Lock()

    def client(c):
        api = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=600)
        for i in range(per_client):
            n = first_seed + c + i * clients
            sent = time.perf_counter() - t0
            rec = speak(api, mode, TEXTS[n % len(TEXTS)], body | {"seed": n})
            with lock:
                records.append(rec | {"sent_s": sent, "round": i})
        api.close()
    threads = [threading.Thread(target=client, args=(c,)) for c in range(clients)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return records, time.perf_counter() - t0


def pct(xs, q) -> float:
    return float(np.percentile(xs, q)) if xs else math.nan


def summary(mode: str, clients: int, records: list[dict], wall: float) -> dict:
    """A level's row, named as vLLM-Omni's bench names its metrics."""
    ok = [r for r in records if "error" not in r]
    errors = [r["error"] for r in records if "error" in r]
    ttfp = [1e3 * r["ttfp_s"] for r in ok]
    rtf = [r["rtf"] for r in ok]
    row = {"mode": mode, "concurrency": clients, "completed": len(ok), "errors": len(errors),
           "first_error": errors[0] if errors else None, "duration_s": wall,
           "request_throughput": len(ok) / wall,
           "audio_throughput": sum(r["audio_s"] for r in ok) / wall,
           "mean_audio_duration_s": statistics.fmean(r["audio_s"] for r in ok) if ok else math.nan,
           "median_audio_ttfp_ms": pct(ttfp, 50), "p95_audio_ttfp_ms": pct(ttfp, 95),
           "mean_audio_rtf": statistics.fmean(rtf) if rtf else math.nan,
           "p95_audio_rtf": pct(rtf, 95)}
    if mode == "stream":
        under = [r["underrun_s"] for r in ok]
        row |= {"mean_underrun_s": statistics.fmean(under) if under else math.nan,
                "max_underrun_s": max(under, default=math.nan),
                "underrun_rate": sum(u >= ZERO_S for u in under) / len(under) if under
                else math.nan,
                "continuity_ok_rate": sum(u < CONTINUITY_S for u in under) / len(under) if under
                else math.nan}
    return row


class CpuQuiet:
    """Waits until other processes use at most `max_share` of the CPUs, for `max_wait_s` at
    most: harness.Quiet also waits for any other bench/ process, which waits for this one
    (a bench that serves for many minutes would wait for itself), so this waits on the CPUs
    alone; what it saw is kept for the report."""

    def __init__(self, say, max_wait_s: float, *, enabled: bool, max_share: float = 0.15):
        self.say, self.max_wait_s, self.enabled, self.max_share = say, max_wait_s, enabled, \
            max_share
        self.waited_s, self.seen = 0.0, []

    def wait(self) -> None:
        t0 = time.perf_counter()
        while self.enabled and time.perf_counter() - t0 < self.max_wait_s:
            share = foreign_share(1.0)
            if share <= self.max_share:
                break
            self.seen.append(share)
            time.sleep(5)
        self.waited_s += time.perf_counter() - t0


def run_level(proc, url, args, mode: str, clients: int, quiet: CpuQuiet, repeat: int) -> dict:
    """One measured level, after a quiet machine and its warm-up rounds: its row, the load
    beside it, the server's peak RSS."""
    waited = quiet.waited_s
    quiet.wait()
    body = {args.budget_field: args.frames}
    clients_run(url, mode, clients, args.warmup, body, 10**6 * (repeat + 1))
    peak_reset = reset_peak(proc.pid)
    load = Contention(pids=(proc.pid,))   # the server's CPU time is ours
    records, wall = clients_run(url, mode, clients, args.requests, body, 0)
    row = summary(mode, clients, records, wall)
    row |= {"peak_rss_mb": peak_rss_mb(proc.pid), "peak_rss_since": "level" if peak_reset
            else "start", "other_load": load.share(), "waited_s": quiet.waited_s - waited,
            "repeat": repeat, "records": records}
    return row


def median_row(rows: list[dict]) -> dict:
    """The repeats of one level: each figure's median (counts: summed)."""
    out = dict(rows[0])
    for key, value in rows[0].items():
        if key in ("completed", "errors"):
            out[key] = sum(r[key] for r in rows)
        elif isinstance(value, float):
            out[key] = statistics.median(r[key] for r in rows)
    out["first_error"] = next((r["first_error"] for r in rows if r["first_error"]), None)
    out["records"] = [rec for r in rows for rec in r["records"]]
    out["repeats"] = len(rows)
    return out


def measure(args, model: str, codec: str, tmp: Path, say, keep=lambda rows: None) -> list[dict]:
    """Serve the model, run every (mode, level) --repeat times: the median rows, each kept
    (`keep(rows so far)`) as its level ends, so a run stopped early keeps what it measured."""
    quiet = CpuQuiet(say, args.max_wait, enabled=not args.no_wait)
    extra = ["--queue", str(args.queue or max(args.concurrency))]
    with open(tmp / "serve.log", "w+") as log:
        proc, url = serve_on((model, codec), "cpu", args, tmp, log, extra,
                             launcher=launcher(args.keep_speaking))
        try:
            rows = []
            for mode in args.modes:
                for clients in args.concurrency:
                    runs = [run_level(proc, url, args, mode, clients, quiet, k)
                            for k in range(args.repeat)]
                    rows.append(median_row(runs))
                    keep(rows)
                    say(f"  {mode} x{clients}: {rows[-1]['audio_throughput']:.2f} audio s/s, "
                        f"TTFP p95 {rows[-1]['p95_audio_ttfp_ms']:.0f} ms, "
                        f"{rows[-1]['errors']} errors, waited {quiet.waited_s:.0f} s so far")
        finally:
            proc.terminate()
            proc.wait(30)
    return rows


def launcher(family: str | None) -> tuple[str, ...]:
    """How the server starts: `-m moss_tts`, or for a random model that would stop early (all
    but Nano's), a program that first patches the process as bench/streams.py's workers are
    (streams_families.keep_speaking; the CPU server loads its model in this process)."""
    if family is None:
        return ("-m", "moss_tts")
    program = (f"import runpy, sys; sys.path.insert(0, {str(ROOT)!r}); "
               "from bench.streams_families import keep_speaking; keep_speaking(sys.argv.pop(1)); "
               "runpy.run_module('moss_tts', run_name='__main__', alter_sys=True)")
    return ("-c", program, family)


# --- the report --------------------------------------------------------------------------------
def fmt(x, spec="{:.2f}") -> str:
    return "-" if x is None or (isinstance(x, float) and math.isnan(x)) else spec.format(x)


def table_rows(rows: list[dict]) -> list[dict]:
    return [{"mode": r["mode"], "clients": r["concurrency"], "done": r["completed"],
             "req/s": fmt(r["request_throughput"]),
             "audio s/s": fmt(r["audio_throughput"]),
             "TTFP p50 ms": fmt(r["median_audio_ttfp_ms"], "{:.0f}"),
             "TTFP p95 ms": fmt(r["p95_audio_ttfp_ms"], "{:.0f}"),
             "RTF mean": fmt(r["mean_audio_rtf"], "{:.3f}"),
             "RTF p95": fmt(r["p95_audio_rtf"], "{:.3f}"),
             "underrun s/req": fmt(r.get("mean_underrun_s"), "{:.3f}"),
             "underrun max s": fmt(r.get("max_underrun_s"), "{:.3f}"),
             "peak RSS MB": fmt(r["peak_rss_mb"], "{:.0f}"), "errors": r["errors"],
             "other load": fmt(100 * r["other_load"], "{:.0f} %")} for r in rows]


COLUMNS = ["mode", "clients", "done", "req/s", "audio s/s", "TTFP p50 ms", "TTFP p95 ms",
           "RTF mean", "RTF p95", "underrun s/req", "underrun max s", "peak RSS MB", "errors",
           "other load"]


def goal_lines(rows: list[dict]) -> list[str]:
    """Issue 35 part 2's goals, where the streamed levels 1 and GOAL_CLIENTS ran."""
    by = {r["concurrency"]: r for r in rows if r["mode"] == "stream"}
    if 1 not in by or GOAL_CLIENTS not in by:
        return []
    one, busy = by[1], by[GOAL_CLIENTS]
    ttfp = busy["p95_audio_ttfp_ms"] / one["median_audio_ttfp_ms"]
    gain = busy["audio_throughput"] / one["audio_throughput"]
    met = lambda ok: "met" if ok else "NOT met"  # noqa: E731
    return [f"goals at {GOAL_CLIENTS} streaming clients (issue 35, part 2):",
            f"  underrun: max {busy['max_underrun_s']:.3f} s per request (goal 0): "
            f"{met(busy['max_underrun_s'] < ZERO_S)}",
            f"  TTFP p95 {busy['p95_audio_ttfp_ms']:.0f} ms = {ttfp:.2f}x idle p50 "
            f"{one['median_audio_ttfp_ms']:.0f} ms (goal <= {GOAL_TTFP}x): "
            f"{met(ttfp <= GOAL_TTFP)}",
            f"  audio s/s {busy['audio_throughput']:.2f} = {gain:.2f}x one client's "
            f"{one['audio_throughput']:.2f} (goal >= {GOAL_THROUGHPUT}x): "
            f"{met(gain >= GOAL_THROUGHPUT)}"]


def report(args, rows: list[dict], model: str, started: str) -> str:
    return "\n".join([
        f"serve_bench {started}: {model}, --max-streams {args.max_streams}, --threads "
        f"{args.threads or 'default'}, {args.budget_field} {args.frames}"
        f"{f', kept speaking as {args.keep_speaking}' if args.keep_speaking else ''}, "
        f"{args.requests} request(s) "
        f"per client per level, medians of {args.repeat} repeat(s)",
        table(table_rows(rows), COLUMNS), *goal_lines(rows), f"CPU: {cpu_line()}",
        f"command: {the_command()}"])


# --- the command -------------------------------------------------------------------------------
def int_list(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip()]


def mode_list(text: str) -> list[str]:
    modes = [m.strip() for m in text.split(",") if m.strip()]
    bad = sorted(set(modes) - set(MODES))
    if bad or not modes:
        raise argparse.ArgumentTypeError(f"modes are {' and '.join(MODES)}, got {text!r}")
    return modes


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", help="model GGUF of any family (with --codec)")
    ap.add_argument("--codec", help="its codec GGUF")
    ap.add_argument("--tiny", action="store_true",
                    help="the tiny fixture Nano pair, built in a temporary folder")
    ap.add_argument("--concurrency", type=int_list, default=[1, 2, 4, 8])
    ap.add_argument("--requests", type=int, default=3, help="requests per client per level")
    ap.add_argument("--modes", type=mode_list, default=list(MODES))
    ap.add_argument("--frames", type=int, default=40, help="max_new_frames per request")
    ap.add_argument("--max-streams", default="auto", help="serve --max-streams")
    ap.add_argument("--queue", type=int, default=None,
                    help="serve --queue (default: the highest concurrency)")
    ap.add_argument("--threads", type=int, default=None, help="serve --threads")
    ap.add_argument("--budget-field", default="max_new_frames",
                    help="the request field --frames goes in: max_new_rows for Delay, whose "
                         "budget counts rows (frames plus its n_vq - 1 staircase rows)")
    ap.add_argument("--keep-speaking", choices=sorted(KEEPS_SPEAKING),
                    help="patch the server so this family's random model never stops early "
                         "(bench/streams_families.py); Nano's checkpoint needs none")
    ap.add_argument("--warmup", type=int, default=1, help="unmeasured rounds before a level")
    ap.add_argument("--repeat", type=int, default=1, help="runs of each level (medians)")
    ap.add_argument("--max-wait", type=float, default=600.0,
                    help="seconds a level waits at most for a quiet machine")
    ap.add_argument("--json", type=Path, default=RESULTS / "serve_bench.json")
    add_no_wait(ap)
    args = ap.parse_args(argv)
    if args.tiny == bool(args.model) or bool(args.model) != bool(args.codec):
        ap.error("give --tiny, or --model with --codec")
    return args


def run(args, say=print) -> list[dict]:
    """Every level's row; the report said and the JSON written."""
    started = time.strftime("%Y-%m-%d %H:%M:%S")
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        if args.tiny:
            from tests.server.helpers import tiny_model_files
            model, codec = map(str, tiny_model_files(tmp))
        else:
            model, codec = args.model, args.codec
        args.json.parent.mkdir(parents=True, exist_ok=True)

        def keep(levels, finished=False):
            args.json.write_text(json.dumps({
                "started": started, "model": model, "codec": codec, "cpu": cpu_line(),
                "command": the_command(), "args": {k: str(v) for k, v in vars(args).items()},
                "finished": finished, "levels": levels}, indent=1))
        rows = measure(args, model, codec, tmp, say, keep)
    say(report(args, rows, "tiny Nano" if args.tiny else model, started))
    keep(rows, finished=True)
    return rows


def main(argv=None) -> int:
    # a plain kill ends the serve child too (measure's finally)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    rows = run(parse_args(argv))
    return 0 if not any(r["errors"] for r in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
