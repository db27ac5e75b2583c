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

from pathlib import Path

from . import __version__
from .errors import InputError, MossTTSError


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

    def audio(self, seconds: float) -> None:
        """Progress of open-ended work: the seconds of audio made so far."""
        if self.enabled:
            print(f"\r{self.label}: {seconds:6.1f} s of audio", end="", file=sys.stderr, flush=True)
            self.shown = True

    def close(self) -> None:
        if self.shown:
            print(file=sys.stderr)
            self.shown = False

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def _load_codec(args):
    from .codec import Codec

    return Codec.load(args.codec, backend=args.backend, threads=args.threads,
                      **({"chunk_seconds": args.chunk_seconds} if args.chunk_seconds else {}))


def _encode(args) -> int:
    from .audio import read_audio_blocks
    from .codec.io import save_codes

    blocks, sr, total = read_audio_blocks(args.input)   # an hour of audio never sits in memory
    with _load_codec(args) as codec, Progress("encoding", args.quiet) as bar:
        codes = codec.encode_blocks(blocks, sr, n_quantizers=args.n_quantizers, total=total,
                                    progress=bar)
    save_codes(args.out, codes)
    _say(args, f"{args.out}: {codes.shape[0]} codebooks x {codes.shape[1]} frames")
    return 0


def _decode(args) -> int:
    from .audio import write_audio
    from .codec.io import load_codes

    codes = load_codes(args.input)
    with _load_codec(args) as codec:
        with Progress("decoding", args.quiet) as bar:
            audio = codec.decode(codes, n_quantizers=args.n_quantizers, progress=bar)
        write_audio(args.out, audio, codec.sample_rate)
        _say(args, f"{args.out}: {audio.shape[0] / codec.sample_rate:.2f} s at "
                   f"{codec.sample_rate} Hz, {audio.shape[1]} channel(s)")
    return 0


def _reconstruct(args) -> int:
    from .audio import read_audio, write_audio

    samples, sr = read_audio(args.input)
    with _load_codec(args) as codec:
        with Progress("encoding", args.quiet) as bar:
            codes = codec.encode(samples, sr, n_quantizers=args.n_quantizers, progress=bar)
        with Progress("decoding", args.quiet) as bar:
            audio = codec.decode(codes, progress=bar)
        write_audio(args.out, audio, codec.sample_rate)
        _say(args, f"{args.out}: {codes.shape[1]} frames through {codes.shape[0]} codebooks")
    return 0


def _convert(args) -> int:
    from converters.registry import converter, family_options
    convert = converter(args.family)
    with Progress("writing", args.quiet) as bar:
        out = convert(args.model, args.out, outtype=args.outtype, strict=args.strict,
                      progress=lambda i, n, name: bar(i, n),
                      **family_options(args.family, vars(args)))
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


def _read_text(args) -> str:
    if args.text is not None:
        return args.text
    if args.text_file is not None:
        try:
            return Path(args.text_file).read_text(encoding="utf-8")
        except OSError as e:
            raise InputError(f"{args.text_file}: cannot read ({e.strerror})") from None
    if sys.stdin is None or sys.stdin.isatty():
        raise InputError("no text: pass --text, --text-file, or pipe text on stdin")
    return sys.stdin.read()


def _tts_nano(args) -> int:
    from .audio import REFERENCE_MAX_SECONDS, read_audio, write_audio
    from .hub import resolve_gguf
    from .models.nano_tts import NanoTTS, Reference
    from .sampling import SamplingOptions
    from .voices import load_voice

    text = _read_text(args)
    options = SamplingOptions(
        do_sample=not args.greedy, text_temperature=args.text_temperature,
        audio_temperature=args.temperature, audio_top_k=args.top_k, audio_top_p=args.top_p,
        audio_repetition_penalty=args.repetition_penalty)
    if args.out != "-" and Path(args.out).suffix.lower() not in (".wav", ".flac"):
        raise InputError(f"{args.out}: use a .wav or .flac file name, or - for stdout")
    model = resolve_gguf(args.model, "nano")
    codec = resolve_gguf(args.codec, "codec")
    with NanoTTS.load(model, codec=codec, backend=args.backend, threads=args.threads) as tts:
        reference = prompt = None
        if args.voice:
            codes, _ = load_voice(args.voice)
            reference = Reference(codes[:, : tts.config.n_vq])
        elif args.reference:
            reference = tts.encode_reference(*read_audio(args.reference,
                                                         max_seconds=REFERENCE_MAX_SECONDS))
        if args.prompt_audio:
            prompt = tts.encode_reference(*read_audio(args.prompt_audio), max_seconds=None)
        chunks = tts.stream(text, reference=reference, prompt_text=args.prompt_text,
                            prompt=prompt, options=options, seed=args.seed,
                            max_frames=args.max_frames,
                            max_text_tokens=args.voice_clone_max_text_tokens)
        bar = Progress("generating", args.quiet)
        done = 0
        if args.out == "-":
            from .audio import PcmStreamWriter
            with PcmStreamWriter(sys.stdout.buffer, tts.sample_rate, 2, fmt=args.format) as out:
                for part in chunks:
                    out.write(part)
                    done += len(part)
                    bar.audio(done / tts.sample_rate)
            bar.close()
            return 0
        parts = []
        for part in chunks:
            parts.append(part)
            done += len(part)
            bar.audio(done / tts.sample_rate)
        bar.close()
        import numpy as np
        audio = np.concatenate(parts) if parts else np.zeros((0, 2), np.float32)
        write_audio(args.out, audio, tts.sample_rate)
        _say(args, f"{args.out}: {len(audio) / tts.sample_rate:.2f} s at {tts.sample_rate} Hz, stereo")
    return 0


def _add_tts_nano(sub) -> None:
    from .hub import DEFAULT_NANO, DEFAULT_NANO_CODEC

    p = sub.add_parser("tts-nano", help="text → 48 kHz stereo speech with MOSS-TTS-Nano")
    src = p.add_mutually_exclusive_group()
    src.add_argument("--text", help="the text to speak (or --text-file, or stdin)")
    src.add_argument("--text-file", help="read the text from this UTF-8 file")
    p.add_argument("--model", default=DEFAULT_NANO, help="Nano GGUF or Hugging Face repo id "
                   f"(default {DEFAULT_NANO}; converted once into the cache)")
    p.add_argument("--codec", default=DEFAULT_NANO_CODEC, help="codec GGUF or repo id "
                   f"(default {DEFAULT_NANO_CODEC})")
    voice = p.add_mutually_exclusive_group()
    voice.add_argument("--reference", "--prompt-speech", dest="reference",
                       help="reference speech to clone (WAV/FLAC)")
    voice.add_argument("--voice", help="a stored voice (python -m moss_tts voice add ...)")
    p.add_argument("--prompt-text", help="continuation: the transcript of --prompt-audio")
    p.add_argument("--prompt-audio", help="continuation: speech the output continues")
    p.add_argument("--out", "-o", required=True, help="output .wav/.flac, or - for stdout")
    p.add_argument("--format", choices=["wav", "raw"], default="wav",
                   help="stdout format: WAV (streamed header) or raw s16le interleaved stereo")
    p.add_argument("--seed", type=int, default=None, help="random seed (default: unseeded)")
    p.add_argument("--greedy", action="store_true", help="argmax decoding instead of sampling")
    p.add_argument("--temperature", type=float, default=0.8, help="audio temperature (0.8)")
    p.add_argument("--text-temperature", type=float, default=1.0, help="stop decision temperature")
    p.add_argument("--top-k", type=int, default=25, help="audio top-k (25; 0 = off)")
    p.add_argument("--top-p", type=float, default=0.95, help="audio top-p (0.95)")
    p.add_argument("--repetition-penalty", type=float, default=1.2,
                   help="per-channel audio repetition penalty (1.2; 1 = off)")
    p.add_argument("--max-frames", "--max-new-frames", dest="max_frames", type=int, default=1000,
                   help="hard cap of frames per text chunk (80 ms each; default 1000)")
    p.add_argument("--voice-clone-max-text-tokens", type=int, default=75,
                   help="text tokens per chunk when cloning a voice (75)")
    p.add_argument("--stream", action="store_true",
                   help="emit audio as it is generated (always on for --out -)")
    _add_runtime_flags(p)
    p.set_defaults(func=_tts_nano)


def _serve(args) -> int:
    import uvicorn

    from .hub import resolve_gguf
    from .models.nano_tts import NanoTTS
    from .server import create_app

    tts = NanoTTS.load(resolve_gguf(args.model, "nano"), codec=resolve_gguf(args.codec, "codec"),
                       backend=args.backend, threads=args.threads)
    app = create_app(tts, queue_depth=args.queue)
    _say(args, f"serving MOSS-TTS-Nano on http://{args.host}:{args.port} (POST /v1/audio/speech)")
    uvicorn.run(app, host=args.host, port=args.port, log_level="warning")
    return 0


def _add_serve(sub) -> None:
    from .hub import DEFAULT_NANO, DEFAULT_NANO_CODEC

    p = sub.add_parser("serve", help="OpenAI-style speech API (POST /v1/audio/speech)")
    p.add_argument("--model", default=DEFAULT_NANO, help="Nano GGUF or Hugging Face repo id")
    p.add_argument("--codec", default=DEFAULT_NANO_CODEC, help="codec GGUF or repo id")
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default loopback)")
    p.add_argument("--port", type=int, default=8080)
    p.add_argument("--queue", type=int, default=4,
                   help="requests that may wait behind the running one; more get 503")
    _add_runtime_flags(p)
    p.set_defaults(func=_serve)


def _voice(args) -> int:
    from .voices import add_voice, list_voices, remove_voice

    if args.voice_command == "list":
        for v in list_voices():
            print(f"{v['name']}\t{v.get('frames', '?')} frames\t{v.get('source', '')}")
        return 0
    if args.voice_command == "remove":
        remove_voice(args.name)
        _say(args, f"removed voice {args.name}")
        return 0
    from .audio import REFERENCE_MAX_SECONDS, read_audio
    from .codec import Codec
    from .hub import resolve_gguf

    samples, sr = read_audio(args.reference, max_seconds=REFERENCE_MAX_SECONDS)
    with Codec.load(resolve_gguf(args.codec, "codec"), threads=args.threads) as codec:
        codes = codec.encode(samples, sr)
        info = {"source": str(args.reference), "sample_rate": codec.sample_rate,
                "codebook_size": codec.config.codebook_size, "variant": codec.config.variant}
    add_voice(args.name, codes.T, info, overwrite=args.force)
    _say(args, f"voice {args.name}: {codes.shape[1]} frames from {args.reference}")
    return 0


def _add_voice_commands(sub) -> None:
    from .hub import DEFAULT_NANO_CODEC

    p = sub.add_parser("voice", help="store, list and remove reference voices")
    vs = p.add_subparsers(dest="voice_command", required=True, metavar="ACTION")
    a = vs.add_parser("add", help="encode a reference once and store it under a name")
    a.add_argument("name")
    a.add_argument("reference", help="reference speech (WAV/FLAC)")
    a.add_argument("--codec", default=DEFAULT_NANO_CODEC, help="codec GGUF or repo id")
    a.add_argument("--force", action="store_true", help="replace an existing voice")
    a.add_argument("--threads", type=int, default=None)
    a.add_argument("--quiet", action="store_true")
    lst = vs.add_parser("list", help="list stored voices")
    lst.add_argument("--quiet", action="store_true")
    r = vs.add_parser("remove", help="delete a stored voice")
    r.add_argument("name")
    r.add_argument("--quiet", action="store_true")
    p.set_defaults(func=_voice)


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
    from converters.registry import FAMILIES, FAMILY_FLAGS
    c = sub.add_parser("convert", help="Hugging Face checkpoint → GGUF")
    c.add_argument("family", choices=list(FAMILIES),
                   help="; ".join(f"{k}: {what}" for k, (_, what) in FAMILIES.items()))
    c.add_argument("--model", required=True, help="checkpoint directory or Hugging Face repo id")
    c.add_argument("--out", "-o", required=True, help="output .gguf")
    c.add_argument("--outtype", default="f32",
                   help="matmul weight type: f32 (default), f16, bf16, q8_0, q4_K, ...")
    for flag, (families, text) in FAMILY_FLAGS.items():
        c.add_argument(flag, help=f"{'/'.join(families)} only: {text}")
    c.add_argument("--strict", action="store_true", help="fail on any checkpoint tensor not used")
    c.add_argument("--quiet", action="store_true", help="no progress on stderr")
    c.set_defaults(func=_convert)
    _add_codec_commands(sub)
    _add_tts_nano(sub)
    _add_voice_commands(sub)
    _add_serve(sub)
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
