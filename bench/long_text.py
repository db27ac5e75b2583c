"""Long text in every family on the tiny models (issue 22 #2): per family and text length, the
characters, the utterances (sentence chunks) the text became, wall seconds and the peak RSS of
a fresh process that loads the model and streams the whole text (RSS from resource.getrusage).

    python -m bench.long_text [--chars 10000 100000] [--family delay ...] [--frames 40]

The goal: 100,000 characters in every family exit 0 with a peak RSS ≤ 300 MB, and ten times
the text takes at most twelve times as long. The models are random: what is measured is the
work per character, not the speech.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.common import cpu_line, table


FAMILIES = ("nano", "delay", "local", "local_v15", "realtime")
# each family's name for its frame budget per utterance (Delay counts staircase rows);
# Realtime speaks one utterance paced by the text, so it keeps its own budget (MAX_FRAMES)
BUDGET = {"nano": "max_frames", "delay": "max_new_rows", "local": "max_frames",
          "local_v15": "max_frames"}
SENTENCES = ("The quick brown fox jumps over the lazy dog near the river bank.",
             "Would you like a cup of tea, or perhaps some coffee instead?",
             "Numbers such as 1,234 and 56.7 percent are read out in full!",
             "She said that the meeting had moved to Thursday at three o'clock.",
             "Long ago, in a quiet village by the sea, there lived an old sailor.")


def long_text(chars: int) -> str:
    """About `chars` characters of varied English sentences (deterministic)."""
    out, n, i = [], 0, 0
    while n < chars:
        sentence = f"{SENTENCES[i % len(SENTENCES)]} Part {i}."
        out.append(sentence)
        n += len(sentence) + 1
        i += 1
    return " ".join(out)[:chars]


def build(root: Path) -> dict[str, tuple[Path, Path]]:
    """family → (model GGUF, codec GGUF): the tiny checkpoints of the tests (a random model
    may speak to its frame budget on every chunk: `--frames` bounds what that costs)."""
    from converters.codec import convert as codec
    from converters.delay import convert as delay
    from converters.local import convert as local
    from converters.local_v15 import convert as local_v15
    from converters.realtime import convert as realtime
    from fixtures.make_codec import make_tiny_v1_checkpoint, make_tiny_v2_checkpoint
    from fixtures.make_delay import make_tiny_delay_checkpoint
    from fixtures.make_local import make_tiny_local_checkpoint
    from fixtures.make_local_v15 import make_tiny_local_v15_checkpoint
    from fixtures.make_realtime import make_tiny_realtime_checkpoint
    from fixtures.make_tiny_pair import make_tiny_pair

    v1 = codec(str(make_tiny_v1_checkpoint(root / "v1", seed=0)), root / "v1.gguf")
    v2 = codec(str(make_tiny_v2_checkpoint(root / "v2", seed=0)), root / "v2.gguf")
    return {
        "nano": make_tiny_pair(root / "nano", stop_bias=0.0),
        "delay": (delay(str(make_tiny_delay_checkpoint(root / "delay")), root / "delay.gguf",
                        strict=True), v1),
        "local": (local(str(make_tiny_local_checkpoint(root / "local", seed=1, speech=True)),
                        root / "local.gguf", strict=True), v1),
        "local_v15": (local_v15(str(make_tiny_local_v15_checkpoint(root / "v15")),
                                root / "local_v15.gguf", strict=True), v2),
        "realtime": (realtime(str(make_tiny_realtime_checkpoint(root / "rt", steer=True)),
                              root / "realtime.gguf", strict=True), v1),
    }


def utterances(tts, family: str, text: str) -> int:
    """How many utterances the family makes of the text (Realtime speaks one, its frames paced
    by the text and capped by its frame budget)."""
    from moss_tts.models.long_text import split_long_text

    if family == "nano":
        return len(tts.split_text(text)[0])
    return 1 if family == "realtime" else len(split_long_text(text, tts.tokenizer))


def worker(family: str, model: str, codec: str, chars: int, frames: int) -> None:
    """One measurement in this (fresh) process: load, stream the whole text, print JSON."""
    from moss_tts import load_tts

    tts = load_tts(model, codec=codec, threads=1)
    text = long_text(chars)
    budget = {BUDGET[family]: frames} if family in BUDGET else {}
    cpu = resource.getrusage(resource.RUSAGE_SELF)
    start = time.perf_counter()
    samples = sum(len(chunk) for chunk in tts.stream(text, seed=1, **budget))
    seconds = time.perf_counter() - start
    usage = resource.getrusage(resource.RUSAGE_SELF)
    # CPU seconds beside wall seconds: on a shared machine the wall clock also counts waiting
    cpu_s = usage.ru_utime + usage.ru_stime - cpu.ru_utime - cpu.ru_stime
    rss_mb = usage.ru_maxrss / 1024   # Linux: KiB
    print(json.dumps({"family": family, "chars": len(text),
                      "chunks": utterances(tts, family, text), "seconds": round(seconds, 2),
                      "cpu_s": round(cpu_s, 2),
                      "audio_s": round(samples / tts.sample_rate, 1), "rss_mb": round(rss_mb)}))


def measure(family: str, files: tuple[str, str], chars: int, frames: int) -> dict:
    cmd = [sys.executable, "-m", "bench.long_text", "--worker", family, files[0], files[1],
           str(chars), str(frames)]
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        return {"family": family, "chars": chars, "exit": done.returncode,
                "error": (done.stderr.strip().splitlines() or ["?"])[-1][:80]}
    return json.loads(done.stdout.strip().splitlines()[-1]) | {"exit": 0}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--chars", type=int, nargs="+", default=[10_000, 100_000])
    parser.add_argument("--family", nargs="+", choices=FAMILIES, default=list(FAMILIES))
    parser.add_argument("--frames", type=int, default=40,
                        help="frame budget of each utterance (rows for Delay; Realtime keeps "
                             "its own)")
    parser.add_argument("--worker", nargs=5, help=argparse.SUPPRESS)
    parser.add_argument("--build", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        family, model, codec, chars, frames = args.worker
        worker(family, model, codec, int(chars), int(frames))
        return 0
    if args.build:
        built = build(Path(args.build))
        print(json.dumps({family: [str(p) for p in pair] for family, pair in built.items()}))
        return 0
    print(cpu_line())
    print(f"frame budget per utterance: {args.frames}; one thread; a fresh process each")
    with tempfile.TemporaryDirectory() as tmp:
        # built in a process of its own: a worker's peak RSS counts the memory of the process
        # it was forked from, so this one stays small
        built = subprocess.run([sys.executable, "-m", "bench.long_text", "--build", tmp],
                               capture_output=True, text=True, check=True)
        files = json.loads(built.stdout.strip().splitlines()[-1])
        rows = [measure(f, files[f], c, args.frames) for f in args.family for c in args.chars]
    for r in rows:
        base = next((b for b in rows if b["family"] == r["family"] and b.get("seconds")), None)
        if base and r.get("seconds") and base is not r:
            r["x_wall"] = f"{r['seconds'] / base['seconds']:.1f}x"
            r["x_cpu"] = f"{r['cpu_s'] / base['cpu_s']:.1f}x"
            r["x_text"] = f"{r['chars'] / base['chars']:.0f}x"
    print(table(rows, ["family", "chars", "chunks", "seconds", "cpu_s", "audio_s", "rss_mb",
                       "exit", "x_text", "x_wall", "x_cpu", "error"]))
    return 0 if all(r["exit"] == 0 for r in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
