"""Soak the speech server on loopback: N short requests (p50/p95 latency, RSS growth), 8
concurrent clients, a full queue, a client that stops reading, a cross-origin text/plain POST,
and first-audio latency over SSE.

    python bench/serve_soak.py [--requests 1000] [--model nano.gguf --codec codec.gguf]

Without --model it uses the tiny fixture model (fast: it measures the server, not the model).
"""

from __future__ import annotations

import argparse
import json
import logging
import socket
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.server.helpers import Served, call, tiny_model_files  # noqa: E402

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


def full_queue(url, depth, long_body):
    """depth + 1 long requests in flight, then one more and /health: how fast each answers."""
    threads = [threading.Thread(target=timed, args=(url, long_body | {"seed": i}))
               for i in range(depth + 1)]
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
    """Counts the server's 'stopped reading' warnings (the drop of a stalled client)."""

    def __init__(self):
        super().__init__(logging.WARNING)
        self.count = 0

    def emit(self, record):
        self.count += "stopped reading" in record.getMessage()


def cross_origin_plain_post(url, voices: Path):
    """What any web page may send without a preflight: it must plant nothing."""
    before = sorted(voices.glob("*")) if voices.is_dir() else []
    st, _, _ = call(url, "/v1/audio/voices", data=json.dumps({"name": "planted", "audio": "AAAA"})
                    .encode(), headers={"Content-Type": "text/plain",
                                        "Origin": "http://evil.example"})
    after = sorted(voices.glob("*")) if voices.is_dir() else []
    return st, after == before


def first_audio(url, n):
    import urllib.request
    out = []
    for i in range(n):
        req = urllib.request.Request(url + "/v1/audio/speech", method="POST",
                                     data=json.dumps(BODY | {"seed": i, "stream_format": "sse",
                                                             "response_format": "pcm"}).encode(),
                                     headers={"Content-Type": "application/json"})
        t0 = time.perf_counter()
        with urllib.request.urlopen(req, timeout=120) as r:
            r.readline()
            out.append(time.perf_counter() - t0)
            r.read()
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=1000)
    ap.add_argument("--model")
    ap.add_argument("--codec")
    ap.add_argument("--frames", type=int, default=12, help="max_new_frames per short request")
    ap.add_argument("--long-frames", type=int, default=1000,
                    help="max_new_frames of the long requests that fill the queue")
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--per-client", type=int, default=10)
    ap.add_argument("--queue", type=int, default=4)
    ap.add_argument("--write-timeout", type=float, default=2.0)
    ap.add_argument("--threads", type=int, default=None)
    args = ap.parse_args(argv)
    from moss_tts.models.nano_tts import NanoTTS
    from moss_tts.server import create_app

    with tempfile.TemporaryDirectory() as tmp:
        model, codec = (args.model, args.codec) if args.model else tiny_model_files(Path(tmp))
        tts = NanoTTS.load(model, codec=codec, threads=args.threads)
        voices = Path(tmp) / "voices"
        server = Served(create_app(tts, voices_root=voices, queue_depth=args.queue,
                                   write_timeout=args.write_timeout))
        body = BODY | {"max_new_frames": args.frames}
        # the frame budget grows with the text: a long text lets max_new_frames take effect
        long_body = BODY | {"input": " ".join([BODY["input"]] * 40),
                            "max_new_frames": args.long_frames}
        for i in range(5):  # warm-up: graphs, allocators, the first page-ins
            timed(server.url, body | {"seed": i})
        t0 = time.perf_counter()
        lat, rss0, rss1, marks = sequential(server.url, body, args.requests)
        wall = time.perf_counter() - t0
        c_lat, c_st, c_bad = concurrent(server.url, body, args.clients, args.per_client)
        q_status, q_dt, h_status, h_dt = full_queue(server.url, args.queue, long_body)
        xo_status, xo_clean = cross_origin_plain_post(server.url, voices)
        firsts = first_audio(server.url, 20)
        nr_status, nr_dt, nr_drops = non_reading_client(server, long_body)  # last: small buffers
        server.stop()
        tts.close()
    print(f"{args.requests} requests ({'tiny model' if not args.model else model}, "
          f"max_new_frames {args.frames}) in {wall:.1f} s; latency ms: {ms(lat)}")
    print(f"process RSS: {rss0:.0f} MiB before, {rss1:.0f} MiB after ({rss1 - rss0:+.1f} MiB); "
          f"along the way (requests: MiB) {', '.join(marks)}")
    print(f"{args.clients} concurrent clients x {args.per_client}: {c_st.count(200)} ok, "
          f"{c_st.count(503)} x 503, {len(c_bad)} differing from their solo run; "
          f"ok latency ms: {ms(c_lat) if c_lat else '-'}")
    print(f"full queue ({args.queue} waiting + 1 running, max_new_frames {args.long_frames}): "
          f"one more got {q_status} in {1e3 * q_dt:.1f} ms; /health {h_status} in "
          f"{1e3 * h_dt:.1f} ms")
    print(f"non-reading SSE client (write timeout {args.write_timeout:g} s): a normal request "
          f"got {nr_status} in {nr_dt:.2f} s; the server logged {nr_drops} drop(s) of a "
          "stalled client")
    print(f"cross-origin text/plain voice POST: {xo_status}, "
          f"{'nothing written' if xo_clean else 'VOICE FILES CHANGED'}")
    print(f"first audio over SSE (20 requests) ms: {ms(firsts)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
