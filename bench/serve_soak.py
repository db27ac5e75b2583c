"""Soak the speech server: N short requests against a real uvicorn on loopback; RSS before and
after, p50/p95 latency, and first-audio latency over SSE.

    python bench/serve_soak.py [--requests 1000] [--model nano.gguf --codec codec.gguf]

Without --model it uses the tiny fixture model (fast: it measures the server, not the model).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def rss_mb() -> float:
    for line in open("/proc/self/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def post(url: str, body: dict, *, first_byte: bool = False) -> tuple[float, float]:
    req = urllib.request.Request(url + "/v1/audio/speech", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"}, method="POST")
    t0 = time.perf_counter()
    with urllib.request.urlopen(req, timeout=120) as r:
        first = None
        if first_byte:
            r.readline()  # the first SSE event line
            first = time.perf_counter() - t0
        r.read()
        if r.status != 200:
            raise RuntimeError(f"status {r.status}")
    return time.perf_counter() - t0, first if first is not None else float("nan")


def tiny_models(d: Path):
    from converters.codec import convert as convert_codec
    from converters.nano import convert as convert_nano
    from fixtures.make_codec import make_tiny_nano_checkpoint
    from fixtures.make_nano import make_tiny_nano_tts_checkpoint
    from fixtures.make_spm import make_tiny_spm
    tts = make_tiny_nano_tts_checkpoint(d / "tts", seed=0, tokenizer_model_bytes=make_tiny_spm(),
                                        audio_tokenizer_sample_rate=1600, stop_bias=-50)
    return (convert_nano(tts, d / "nano.gguf"),
            convert_codec(make_tiny_nano_checkpoint(d / "codec", seed=1), d / "codec.gguf"))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=1000)
    ap.add_argument("--model")
    ap.add_argument("--codec")
    ap.add_argument("--frames", type=int, default=12, help="max_new_frames per request")
    ap.add_argument("--threads", type=int, default=None)
    args = ap.parse_args(argv)
    from moss_tts.models.nano_tts import NanoTTS
    from moss_tts.server import create_app
    from tests.server_helpers import Served

    with tempfile.TemporaryDirectory() as tmp:
        model, codec = (args.model, args.codec) if args.model else tiny_models(Path(tmp))
        tts = NanoTTS.load(model, codec=codec, threads=args.threads)
        server = Served(create_app(tts, voices_root=Path(tmp) / "voices"))
        body = {"model": "tts-1", "input": "Hello there, this is a short request.",
                "max_new_frames": args.frames}
        for i in range(5):  # warm-up: graphs, allocators, the first page-ins
            post(server.url, body | {"seed": i})
        rss0, t0 = rss_mb(), time.perf_counter()
        lat, marks = [], []
        for i in range(args.requests):
            lat.append(post(server.url, body | {"seed": i})[0])
            if (i + 1) % max(1, args.requests // 4) == 0:
                marks.append(f"{i + 1}: {rss_mb():.0f}")
        wall = time.perf_counter() - t0
        rss1 = rss_mb()
        firsts = [post(server.url, body | {"seed": i, "stream_format": "sse"}, first_byte=True)[1]
                  for i in range(20)]
        server.stop()
        tts.close()
    q = statistics.quantiles(lat, n=20)
    print(f"{args.requests} requests ({'tiny model' if not args.model else model}, "
          f"max_new_frames {args.frames}) in {wall:.1f} s")
    print(f"latency ms: p50 {1e3 * statistics.median(lat):.1f}  p95 {1e3 * q[18]:.1f}  "
          f"max {1e3 * max(lat):.1f}")
    print(f"process RSS: {rss0:.0f} MiB before, {rss1:.0f} MiB after ({rss1 - rss0:+.1f} MiB); "
          f"along the way (requests: MiB) {', '.join(marks)}")
    print(f"first audio over SSE (20 requests) ms: p50 {1e3 * statistics.median(firsts):.1f}  "
          f"max {1e3 * max(firsts):.1f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
