"""`python -m moss_tts <command>`: argument parsing and dispatch only (design §6).

Errors from the library (MossTTSError) print as one line with exit code 1; `--debug` shows
the traceback.
"""

from __future__ import annotations

import argparse
import json
import logging
import platform
import sys

from . import __version__
from .errors import MossTTSError


def _doctor(args) -> int:
    from .ggml import backend, lib

    print(f"moss-tts {__version__} (python {platform.python_version()}, {platform.machine()})")
    try:
        manifest = lib.read_manifest()
        L = lib.get()
    except MossTTSError as e:
        print(f"ggml: NOT AVAILABLE — {e}")
        return 1
    src = manifest.get("source", {})
    origin = src.get("name") or src.get("path") or "?"
    print(f"ggml {L.ggml_version().decode()} (commit {L.ggml_commit().decode()}) from {origin}")
    print(f"  libraries: {L.lib_dir}")
    if manifest.get("source_hash"):
        print(f"  source sha256: {manifest['source_hash']}")
    flags = manifest.get("flags") or {}
    if flags:
        print("  build flags: " + " ".join(f"{k}={v}" for k, v in sorted(flags.items())))
    if manifest.get("compiler"):
        print(f"  compiler: {manifest['compiler']}")
    print(f"  cpu features: {' '.join(lib.cpu_features(L)) or 'none'}")
    print(f"  threads (default): {backend.default_threads()}")
    print("backends:")
    for d in backend.devices():
        mem = f", {d.memory_total / 2**30:.1f} GiB" if d.memory_total else ""
        print(f"  {d.registry.lower():8s} {d.name} — {d.description} [{d.kind}{mem}]")
    with backend.Backend("cpu") as b:
        ok = _smoke_test(b)
    print(f"smoke test (2x2 matmul on cpu): {'ok' if ok else 'FAILED'}")
    return 0 if ok else 1


def _smoke_test(b) -> bool:
    import numpy as np

    from .ggml import Graph, ops

    with Graph(b, name="doctor") as g:
        x = g.input("x", (2, 2))
        g.output(ops.mul_mat(x, x), "y")
        v = np.array([[1, 2], [3, 4]], dtype=np.float32)
        return bool(np.allclose(g.run({"x": v})["y"], v @ v.T))


def _info(args) -> int:
    from .ggml.weights import GGUFFile

    with GGUFFile(args.file) as f:
        meta = {}
        for key in f.keys():
            value = f.get(key)
            if hasattr(value, "tolist"):
                value = value.tolist()
            if isinstance(value, list) and len(value) > 8 and not args.full:
                value = value[:8] + [f"... ({len(value)} items)"]
            meta[key] = value
        tensors = list(f.tensors.values())
        total = sum(t.nbytes for t in tensors)
        if args.json:
            print(json.dumps({"file": str(f.path), "gguf_version": f.version, "metadata": meta,
                              "tensors": [{"name": t.name, "type": t.type.name.lower(),
                                           "shape": list(t.shape), "bytes": t.nbytes}
                                          for t in tensors]}, indent=1, default=str))
            return 0
        print(f"{f.path}: GGUF v{f.version}, kind {f.get('moss.kind', '(none)')}, "
              f"{len(tensors)} tensors, {total / 2**20:.1f} MiB")
        print("metadata:")
        for key, value in meta.items():
            text = repr(value)
            if len(text) > 160 and not args.full:
                text = text[:157] + "..."
            print(f"  {key} = {text}")
        print("tensors:")
        shown = tensors if args.full or len(tensors) <= 60 else tensors[:60]
        for t in shown:
            print(f"  {t.name:60s} {t.type.name.lower():6s} {str(tuple(t.shape)):20s} {t.nbytes}")
        if len(shown) < len(tensors):
            print(f"  ... {len(tensors) - len(shown)} more (--full lists all)")
    return 0


class Progress:
    """A one-line progress indicator on stderr; silent with --quiet or when stderr is no TTY."""

    def __init__(self, label: str, quiet: bool):
        self.label = label
        self.enabled = not quiet and sys.stderr.isatty()
        self.shown = False

    def __call__(self, done: int, total: int) -> None:
        if self.enabled:
            pct = 100 * done // max(total, 1)
            print(f"\r{self.label}: {pct:3d}% ({done}/{total} frames)", end="", file=sys.stderr,
                  flush=True)
            self.shown = True

    def close(self) -> None:
        if self.shown:
            print(file=sys.stderr)
            self.shown = False


def _load_codec(args):
    from .codec import Codec

    return Codec.load(args.codec, backend=args.backend, threads=args.threads,
                      **({"chunk_seconds": args.chunk_seconds} if args.chunk_seconds else {}))


def _encode(args) -> int:
    from .audio import read_audio
    from .codec.io import save_codes

    samples, sr = read_audio(args.input)
    with _load_codec(args) as codec:
        bar = Progress("encoding", args.quiet)
        try:
            codes = codec.encode(samples, sr, n_quantizers=args.n_quantizers, progress=bar)
        finally:
            bar.close()
    save_codes(args.out, codes)
    _say(args, f"{args.out}: {codes.shape[0]} codebooks x {codes.shape[1]} frames")
    return 0


def _decode(args) -> int:
    from .audio import write_audio
    from .codec.io import load_codes

    codes = load_codes(args.input)
    with _load_codec(args) as codec:
        bar = Progress("decoding", args.quiet)
        try:
            audio = codec.decode(codes, n_quantizers=args.n_quantizers, progress=bar)
        finally:
            bar.close()
        write_audio(args.out, audio, codec.sample_rate)
        _say(args, f"{args.out}: {audio.shape[0] / codec.sample_rate:.2f} s at "
                   f"{codec.sample_rate} Hz, {audio.shape[1]} channel(s)")
    return 0


def _reconstruct(args) -> int:
    from .audio import read_audio, write_audio

    samples, sr = read_audio(args.input)
    with _load_codec(args) as codec:
        bar = Progress("encoding", args.quiet)
        try:
            codes = codec.encode(samples, sr, n_quantizers=args.n_quantizers, progress=bar)
        finally:
            bar.close()
        bar = Progress("decoding", args.quiet)
        try:
            audio = codec.decode(codes, progress=bar)
        finally:
            bar.close()
        write_audio(args.out, audio, codec.sample_rate)
        _say(args, f"{args.out}: {codes.shape[1]} frames through {codes.shape[0]} codebooks")
    return 0


def _convert(args) -> int:
    if args.family == "codec":
        from converters.codec import convert
    else:  # argparse restricts the choices; each family lands with its own issue
        raise AssertionError(args.family)
    bar = Progress("writing", args.quiet)
    try:
        out = convert(args.model, args.out, outtype=args.outtype, strict=args.strict,
                      progress=lambda i, n, name: bar(i, n))
    finally:
        bar.close()
    _say(args, f"{out}: written ({out.stat().st_size / 2**20:.1f} MiB, {args.outtype})")
    return 0


def _say(args, message: str) -> None:
    if not args.quiet:
        print(message, file=sys.stderr)


def _add_runtime_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--backend", default="cpu", help="ggml backend: cpu (default), cuda, vulkan, metal")
    p.add_argument("--threads", type=int, default=None, help="CPU threads (default: usable cores)")
    p.add_argument("--quiet", action="store_true", help="no progress or summary on stderr")


def _add_codec_commands(sub) -> None:
    for name, func, helptext, src, dst in (
            ("encode", _encode, "audio file → codes (.npy, int32 [n_quantizers, frames])",
             "audio file (WAV/FLAC)", "codes .npy"),
            ("decode", _decode, "codes (.npy) → audio file", "codes .npy", "WAV or FLAC file"),
            ("reconstruct", _reconstruct, "audio → codes → audio through a codec",
             "audio file (WAV/FLAC)", "WAV or FLAC file")):
        p = sub.add_parser(name, help=helptext)
        p.add_argument("input", help=src)
        p.add_argument("--codec", required=True, help="codec GGUF (python -m moss_tts convert codec ...)")
        p.add_argument("--out", "-o", required=True, help=dst)
        p.add_argument("--n-quantizers", type=int, default=None,
                       help="use only the first K codebooks (default: all)")
        p.add_argument("--chunk-seconds", type=float, default=None,
                       help="audio per graph run (memory/speed trade-off; results are identical)")
        _add_runtime_flags(p)
        p.set_defaults(func=func)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m moss_tts",
                                description="MOSS-TTS family on stock ggml, from Python.")
    p.add_argument("--version", action="version", version=f"moss-tts {__version__}")
    p.add_argument("--debug", action="store_true", help="show tracebacks and debug logging")
    sub = p.add_subparsers(dest="command", metavar="COMMAND")
    d = sub.add_parser("doctor", help="report the ggml build, backends, threads and CPU features")
    d.set_defaults(func=_doctor)
    i = sub.add_parser("info", help="show a GGUF file's kind, metadata and tensor table")
    i.add_argument("file", help="a .gguf file")
    i.add_argument("--json", action="store_true", help="machine-readable output")
    i.add_argument("--full", action="store_true", help="do not abbreviate long values")
    i.set_defaults(func=_info)
    c = sub.add_parser("convert", help="Hugging Face checkpoint → GGUF")
    c.add_argument("family", choices=["codec"], help="what the checkpoint is")
    c.add_argument("--model", required=True, help="checkpoint directory or Hugging Face repo id")
    c.add_argument("--out", "-o", required=True, help="output .gguf")
    c.add_argument("--outtype", default="f32",
                   help="matmul weight type: f32 (default), f16, bf16, q8_0, q4_K, ...")
    c.add_argument("--strict", action="store_true", help="fail on any checkpoint tensor not used")
    c.add_argument("--quiet", action="store_true", help="no progress on stderr")
    c.set_defaults(func=_convert)
    _add_codec_commands(sub)
    return p


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.DEBUG if args.debug else logging.WARNING,
                        format="%(levelname)s %(name)s: %(message)s")
    if not getattr(args, "func", None):
        parser.print_help(sys.stderr)
        return 2
    try:
        return args.func(args)
    except MossTTSError as e:
        if args.debug:
            raise
        print(f"error: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
