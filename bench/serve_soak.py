"""Soak the speech server on loopback: N short requests (p50/p95 latency, RSS growth), 8
concurrent clients, a full queue, a client that stops reading, a cross-origin text/plain POST,
first-audio latency over SSE, held connections (past --max-connections, idle until the header
deadline), idle live sockets (the tiny Realtime model, --live-idle) and voice listings while
/health and speech are timed; with --max-streams N the Nano server decodes N requests together
(issue 25), and every concurrent request must still equal its solo run. Beside that load it
runs the attacks of issue 31 (bench/serve_attacks.py: stalled bodies, a decompression bomb, a
live flood, re-asks on a full server, every capped field, a lost RPC backend) and ends with the
bounds they held.

    python bench/serve_soak.py [--requests 1000] [--model nano.gguf --codec codec.gguf]
                               [--max-streams 4] [--attacks stall,bomb,...|all|none]

Without --model it uses the tiny fixture model (fast: it measures the server, not the model).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import socket
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import cpu_line, table  # noqa: E402
from bench.serve_attacks import add_arguments, run_attacks  # noqa: E402
from moss_tts.server.settings import ServerSettings  # noqa: E402
from tests.server.helpers import (Served, call, settings, tiny_model_files,  # noqa: E402
                                  tiny_realtime_files)

BODY = {"model": "tts-1", "input": "Hello there, this is a short request.",
        "response_format": "pcm"}


def rss_mb() -> float:
    for line in open("/proc/self/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def timed(url: str, body: dict, **kw) -> tuple[float, int, bytes]:
    t0 = time.perf_counter()
    st, _, raw = call(url, "/v1/audio/speech", body, timeout=300, **kw)
    return time.perf_counter() - t0, st, raw


def ms(values) -> str:
    q = statistics.quantiles(values, n=20) if len(values) > 1 else values * 19
    return f"p50 {1e3 * statistics.median(values):.1f}  p95 {1e3 * q[18]:.1f}  " \
           f"max {1e3 * max(values):.1f}"


def sequential(url, body, n):
    """n requests one after another: latencies and RSS along the way."""
    lat, marks, rss0 = [], [], rss_mb()
    for i in range(n):
        dt, st, _ = timed(url, body | {"seed": i})
        if st != 200:
            raise RuntimeError(f"request {i}: status {st}")
        lat.append(dt)
        if (i + 1) % max(1, n // 4) == 0:
            marks.append(f"{i + 1}: {rss_mb():.0f}")
    return lat, rss0, rss_mb(), marks


def concurrent(url, body, clients, per_client):
    """`clients` threads × `per_client` requests; 200s must equal the same seed's solo run."""
    solo = {c: timed(url, body | {"seed": c})[2] for c in range(clients)}
    lat, statuses, mismatches = [], [], []

    def client(c):
        for _ in range(per_client):
            dt, st, raw = timed(url, body | {"seed": c})
            statuses.append(st)
            if st == 200:
                lat.append(dt)
                if raw != solo[c]:
                    mismatches.append(c)
    threads = [threading.Thread(target=client, args=(c,)) for c in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return lat, statuses, mismatches


def full_queue(url, depth, running, long_body):
    """depth + `running` long requests in flight, then one more and /health: how fast each
    answers."""
    threads = [threading.Thread(target=timed, args=(url, long_body | {"seed": i}))
               for i in range(depth + running)]
    for t in threads:
        t.start()
    time.sleep(0.5)
    refused = timed(url, BODY)
    t0 = time.perf_counter()
    health = call(url, "/health")[0]
    health_dt = time.perf_counter() - t0
    for t in threads:
        t.join()
    return refused[1], refused[0], health, health_dt


def non_reading_client(server, long_body):
    """An SSE client that never reads, then a normal request: its latency. The server's send
    buffer is cut to 64 KiB first (accepted sockets inherit it), so that the tiny model's
    stream fills the socket buffers as a real model's 48 kHz stereo would."""
    url, port = server.url, server.port
    server.sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 1 << 16)
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.connect(("127.0.0.1", port))
    data = json.dumps(long_body | {"stream_format": "sse", "response_format": "pcm"}).encode()
    sock.sendall(b"POST /v1/audio/speech HTTP/1.1\r\nHost: 127.0.0.1:%d\r\nContent-Type: "
                 b"application/json\r\nContent-Length: %d\r\n\r\n%s" % (port, len(data), data))
    dropped = Counted()
    logging.getLogger("moss_tts.server").addHandler(dropped)
    time.sleep(0.5)
    dt, st, _ = timed(url, BODY)
    sock.close()
    logging.getLogger("moss_tts.server").removeHandler(dropped)
    return st, dt, dropped.count


class Counted(logging.Handler):
    """Counts the server's 'stopped reading' warnings (the drop of a stalled client), and the
    records of any logger that carry a traceback or are errors."""

    def __init__(self):
        super().__init__(logging.DEBUG)
        self.count = self.tracebacks = self.records = 0

    def emit(self, record):
        self.count += "stopped reading" in record.getMessage()
        self.tracebacks += bool(record.exc_info) or record.levelno >= logging.ERROR
        self.records += 1


class Logged:
    """Every record of the server's loggers (uvicorn's do not propagate) into one Counted."""

    NAMES = ("", "uvicorn", "uvicorn.access")

    def __enter__(self) -> Counted:
        self.counted = Counted()
        for name in self.NAMES:
            logging.getLogger(name).addHandler(self.counted)
        return self.counted

    def __exit__(self, *exc):
        for name in self.NAMES:
            logging.getLogger(name).removeHandler(self.counted)


def cross_origin_plain_post(url, voices: Path):
    """What any web page may send without a preflight: it must plant nothing."""
    before = sorted(voices.glob("*")) if voices.is_dir() else []
    st, _, _ = call(url, "/v1/audio/voices", data=json.dumps({"name": "planted", "audio": "AAAA"})
                    .encode(), headers={"Content-Type": "text/plain",
                                        "Origin": "http://evil.example"})
    after = sorted(voices.glob("*")) if voices.is_dir() else []
    return st, after == before


def first_audio(url, n, body):
    import urllib.request
    out = []
    for i in range(n):
        req = urllib.request.Request(url + "/v1/audio/speech", method="POST",
                                     data=json.dumps(body | {"seed": i, "stream_format": "sse",
                                                             "response_format": "pcm"}).encode(),
                                     headers={"Content-Type": "application/json"})
        t0 = time.perf_counter()
        with urllib.request.urlopen(req, timeout=120) as r:
            r.readline()
            out.append(time.perf_counter() - t0)
            r.read()
    return out


def held_connections(app, n, limit, header_timeout):
    """`n` sockets that send half a request's headers, on a server capped at `limit`: how many
    got a 503 at once, /health while they are held, how long until the server closed the
    rest, and the log records (and tracebacks) it all made."""
    server = Served(app, ServerSettings(max_connections=limit, header_timeout=header_timeout))
    with Logged() as log:
        held = []
        for _ in range(n):
            sock = socket.create_connection(("127.0.0.1", server.port))
            sock.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n")
            held.append(sock)
        t0 = time.perf_counter()
        health = call(server.url, "/health", timeout=60)[0]
        health_dt = time.perf_counter() - t0
        refused = 0
        for sock in held:
            sock.settimeout(60)
            try:
                refused += sock.recv(64).startswith(b"HTTP/1.1 503")   # b"": closed unanswered
            except OSError:
                pass
            sock.close()
        closed_dt = time.perf_counter() - t0
        after = call(server.url, "/health", timeout=60)[0]
    server.stop()
    return refused, health, health_dt, closed_dt, after, log


def idle_live_sockets(app, places, idle):
    """`places` live clients that send their config and then nothing, filling the line: the
    free places while they wait, and how long until the server closed them all."""
    from websockets.exceptions import ConnectionClosed
    from websockets.sync.client import connect

    server = Served(app)
    url = server.url.replace("http://", "ws://") + "/v1/audio/live"
    reasons = []
    with contextlib.ExitStack() as stack:
        sockets = [stack.enter_context(connect(url)) for _ in range(places)]
        for ws in sockets:
            ws.send(json.dumps({}))
            ws.recv(timeout=60)                  # started
        free_while = json.loads(call(server.url, "/v1/models")[2])["data"][0]["free_places"]
        t0 = time.perf_counter()
        for ws in sockets:
            try:
                while True:
                    ws.recv(timeout=120)         # the error event, then the close
            except ConnectionClosed as e:
                reasons.append(e.rcvd.reason if e.rcvd else "")
    closed_dt = time.perf_counter() - t0
    free_after = json.loads(call(server.url, "/v1/models")[2])["data"][0]["free_places"]
    server.stop()
    return free_while, closed_dt, free_after, reasons


def voice_listings(url, voices: Path, n_voices, listers, seconds):
    """`n_voices` stored voices, `listers` clients listing them in a loop for `seconds`:
    listing, /health and tiny-speech latencies meanwhile."""
    from moss_tts.voices import add_voice

    for i in range(n_voices):
        add_voice(f"soak-{i}", np.zeros((50, 16), np.int32), {"source": "soak"}, root=voices)
    stop, listing = threading.Event(), []

    def lister():
        while not stop.is_set():
            t0 = time.perf_counter()
            call(url, "/v1/audio/voices", timeout=120)
            listing.append(time.perf_counter() - t0)
    threads = [threading.Thread(target=lister) for _ in range(listers)]
    for t in threads:
        t.start()
    health, speech, end = [], [], time.perf_counter() + seconds
    while time.perf_counter() < end:
        t0 = time.perf_counter()
        call(url, "/health", timeout=120)
        health.append(time.perf_counter() - t0)
        speech.append(timed(url, BODY | {"max_new_frames": 4})[0])
    stop.set()
    for t in threads:
        t.join()
    return listing, health, speech


def main(argv=None) -> int:
    args = parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        r = run_cases(args, Path(tmp))
    report(args, r)
    return 0 if all(held.ok for held in r["attacks"]) else 1


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=1000)
    ap.add_argument("--model")
    ap.add_argument("--codec")
    ap.add_argument("--frames", type=int, default=12, help="max_new_frames per short request")
    ap.add_argument("--long-frames", type=int, default=1000,
                    help="max_new_frames of the long requests that fill the queue")
    ap.add_argument("--long-repeats", type=int, default=40,
                    help="the long requests' text: the short one this many times")
    ap.add_argument("--first-audio", type=int, default=20,
                    help="SSE requests whose first audio is timed")
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--per-client", type=int, default=10)
    ap.add_argument("--queue", type=int, default=4)
    ap.add_argument("--max-streams", type=int, default=1,
                    help="requests the Nano server decodes together (serve --max-streams)")
    ap.add_argument("--write-timeout", type=float, default=2.0)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--held", type=int, default=200, help="held connections")
    ap.add_argument("--max-connections", type=int, default=64)
    ap.add_argument("--header-timeout", type=float, default=2.0)
    ap.add_argument("--live-places", type=int, default=3,
                    help="idle live sockets (the tiny Realtime model's line: this many places)")
    ap.add_argument("--live-idle", type=float, default=1.0)
    ap.add_argument("--voices", type=int, default=300, help="stored voices to list")
    ap.add_argument("--listers", type=int, default=2)
    ap.add_argument("--listing-seconds", type=float, default=5.0)
    add_arguments(ap)
    return ap.parse_args(argv)


def run_cases(args, tmp: Path) -> dict:
    from moss_tts.models.nano_tts import NanoTTS
    from moss_tts.models.realtime_tts import RealtimeTTS
    from moss_tts.server import create_app

    r = {}
    model, codec = (args.model, args.codec) if args.model else tiny_model_files(tmp)
    tts = NanoTTS.load(model, codec=codec, threads=args.threads)
    voices = tmp / "voices"
    server = Served(create_app(tts, settings(voices, queue_depth=args.queue,
                               write_timeout=args.write_timeout, max_streams=args.max_streams)),
                    ServerSettings(write_timeout=args.write_timeout))
    body = BODY | {"max_new_frames": args.frames}
    # the frame budget grows with the text: a long text lets max_new_frames take effect
    long_body = BODY | {"input": " ".join([BODY["input"]] * args.long_repeats),
                        "max_new_frames": args.long_frames}
    for i in range(5):  # warm-up: graphs, allocators, the first page-ins
        timed(server.url, body | {"seed": i})
    t0 = time.perf_counter()
    r["seq"] = sequential(server.url, body, args.requests)
    r["wall"] = time.perf_counter() - t0
    r["conc"] = concurrent(server.url, body, args.clients, args.per_client)
    r["queue"] = full_queue(server.url, args.queue, args.max_streams, long_body)
    r["xo"] = cross_origin_plain_post(server.url, voices)
    r["firsts"] = first_audio(server.url, args.first_audio, body)
    r["voices"] = voice_listings(server.url, voices, args.voices, args.listers,
                                 args.listing_seconds)
    r["nr"] = non_reading_client(server, long_body)  # last on this server: small buffers
    server.stop()
    r["held"] = held_connections(create_app(tts, settings(voices)), args.held,
                                 args.max_connections, args.header_timeout)
    tts.close()
    rt_model, rt_codec = tiny_realtime_files(tmp)
    rt = RealtimeTTS.load(rt_model, codec=rt_codec, threads=args.threads)
    r["idle"] = idle_live_sockets(create_app({"moss-tts-realtime": rt}, settings(voices,
                                             queue_depth=args.live_places - 1,
                                             live_idle=args.live_idle)),
                                  args.live_places, args.live_idle)
    rt.close()
    r["attacks"] = run_attacks(args, tmp, (model, codec), (rt_model, rt_codec))
    r["model"] = model
    return r


def report(args, r: dict) -> None:
    lat, rss0, rss1, marks = r["seq"]
    c_lat, c_st, c_bad = r["conc"]
    q_status, q_dt, h_status, h_dt = r["queue"]
    print(cpu_line())
    print(f"{args.requests} requests ({'tiny model' if not args.model else r['model']}, "
          f"max_new_frames {args.frames}, --max-streams {args.max_streams}) in "
          f"{r['wall']:.1f} s; latency ms: {ms(lat)}")
    print(f"process RSS: {rss0:.0f} MiB before, {rss1:.0f} MiB after ({rss1 - rss0:+.1f} MiB); "
          f"along the way (requests: MiB) {', '.join(marks)}")
    print(f"{args.clients} concurrent clients x {args.per_client}: {c_st.count(200)} ok, "
          f"{c_st.count(503)} x 503, {len(c_bad)} differing from their solo run; "
          f"ok latency ms: {ms(c_lat) if c_lat else '-'}")
    print(f"full queue ({args.queue} waiting + {args.max_streams} running, max_new_frames "
          f"{args.long_frames}): "
          f"one more got {q_status} in {1e3 * q_dt:.1f} ms; /health {h_status} in "
          f"{1e3 * h_dt:.1f} ms")
    nr_status, nr_dt, nr_drops = r["nr"]
    print(f"non-reading SSE client (write timeout {args.write_timeout:g} s): a normal request "
          f"got {nr_status} in {nr_dt:.2f} s; the server logged {nr_drops} drop(s) of a "
          "stalled client")
    xo_status, xo_clean = r["xo"]
    print(f"cross-origin text/plain voice POST: {xo_status}, "
          f"{'nothing written' if xo_clean else 'VOICE FILES CHANGED'}")
    print(f"first audio over SSE ({args.first_audio} requests) ms: {ms(r['firsts'])}")
    listing, health, speech = r["voices"]
    print(f"{args.voices} stored voices, {args.listers} clients listing for "
          f"{args.listing_seconds:g} s: {len(listing)} listings, ms: {ms(listing)}; /health "
          f"meanwhile ms: {ms(health)}; tiny speech ms: {ms(speech)}")
    refused, held_health, held_dt, closed_dt, after, log = r["held"]
    print(f"{args.held} held connections (--max-connections {args.max_connections}, "
          f"--header-timeout {args.header_timeout:g}): {refused} got 503 at once; /health "
          f"while held {held_health} in {1e3 * held_dt:.1f} ms; all closed after "
          f"{closed_dt:.1f} s; /health after {after}; {log.records} log records, "
          f"{log.tracebacks} with a traceback or at ERROR")
    free_while, idle_dt, free_after, reasons = r["idle"]
    print(f"{args.live_places} idle live sockets (--live-idle {args.live_idle:g}): free places "
          f"{free_while} while they waited, {free_after} after; all closed within "
          f"{idle_dt:.1f} s, reasons: {sorted(set(reasons))}")
    if r["attacks"]:
        for held in r["attacks"]:
            print(held.line)
        print("bounds held:")
        print(table([held.row() for held in r["attacks"]], ["attack", "bound", "figure", "ok"]))


if __name__ == "__main__":
    raise SystemExit(main())
