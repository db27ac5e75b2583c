"""Batch throughput: audio seconds per wall second for one manifest made four ways — a plain
shell-style loop over `tts-nano` (the model reloaded per line), `batch` with 1 and 2 local
workers, and `batch --ray local` (2 actors; its wall time includes starting the cluster).

    python bench/batch.py --model nano.gguf --codec nano-codec.gguf [--lines 8] [--frames 50]
    python bench/batch.py --tiny        # the tiny test models: overheads only, not model speed

Each mode runs as its own subprocess(es) into a fresh directory; the table gives the other
load on the machine just before it (bench/harness.py foreign_share), since it may be shared.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.common import table
from bench.harness import foreign_share

TEXT = "Line {i} of the benchmark: a calm voice reads a short sentence."
MODES = ("cli-loop", "batch-1", "batch-2", "ray-2")


def tiny_models(root: Path) -> tuple[Path, Path]:
    from converters.codec import convert as convert_codec
    from converters.nano import convert as convert_nano
    from fixtures.make_codec import make_tiny_nano_checkpoint
    from fixtures.make_nano import make_tiny_nano_tts_checkpoint
    from fixtures.make_spm import make_tiny_spm

    ckpt = make_tiny_nano_tts_checkpoint(root / "tts", seed=0, stop_bias=-50,
                                         tokenizer_model_bytes=make_tiny_spm(),
                                         audio_tokenizer_sample_rate=1600)
    return (convert_nano(ckpt, root / "nano.gguf"),
            convert_codec(make_tiny_nano_checkpoint(root / "codec", seed=1), root / "codec.gguf"))


def commands(mode: str, manifest: Path, rows: list[dict], out: Path, model, codec) -> list[list]:
    base = [sys.executable, "-m", "moss_tts"]
    if mode == "cli-loop":
        return [base + ["tts-nano", "--model", model, "--codec", codec, "--text", r["text"],
                        "--seed", r["seed"], "--max-frames", r["max_frames"], "--quiet",
                        "-o", out / f"{r['id']}.wav"] for r in rows]
    extra = {"batch-1": ["--workers", 1], "batch-2": ["--workers", 2],
             "ray-2": ["--ray", "local", "--workers", 2]}[mode]
    return [base + ["batch", manifest, "--out", out, "--model", model, "--codec", codec,
                    "--quiet", *extra]]


def measure(mode: str, manifest: Path, rows: list[dict], out: Path, model, codec) -> dict:
    import soundfile as sf

    load = foreign_share(1.0)
    t0 = time.perf_counter()
    for cmd in commands(mode, manifest, rows, out, model, codec):
        r = subprocess.run([str(c) for c in cmd], cwd=ROOT, capture_output=True, text=True)
        if r.returncode:
            return {"mode": mode, "error": (r.stderr.strip().splitlines() or ["?"])[-1]}
    wall = time.perf_counter() - t0
    audio = sum(sf.info(p).duration for p in out.glob("*.wav"))
    return {"mode": mode, "lines": len(list(out.glob("*.wav"))), "audio s": f"{audio:.1f}",
            "wall s": f"{wall:.1f}", "audio s / wall s": f"{audio / wall:.2f}",
            "lines/s": f"{len(rows) / wall:.2f}", "other load": f"{100 * load:.0f} %"}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", help="Nano GGUF")
    p.add_argument("--codec", help="Nano codec GGUF")
    p.add_argument("--tiny", action="store_true", help="use the tiny test models")
    p.add_argument("--lines", type=int, default=8)
    p.add_argument("--frames", type=int, default=50, help="frame cap per line (80 ms each)")
    p.add_argument("--modes", default=",".join(MODES))
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="bench-batch-") as tmp:
        tmp = Path(tmp)
        model, codec = tiny_models(tmp) if args.tiny else (args.model, args.codec)
        if not (model and codec):
            p.error("pass --model and --codec, or --tiny")
        rows = [{"id": f"line{i:04d}", "text": TEXT.format(i=i), "seed": i,
                 "max_frames": args.frames} for i in range(args.lines)]
        manifest = tmp / "manifest.jsonl"
        manifest.write_text("".join(json.dumps(r) + "\n" for r in rows))
        results = [measure(mode, manifest, rows, tmp / mode, model, codec)
                   for mode in args.modes.split(",")]
    print(table(results, ["mode", "lines", "audio s", "wall s", "audio s / wall s", "lines/s",
                          "other load", "error"]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
