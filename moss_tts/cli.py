"""`python -m moss_tts <command>`: argument parsing and dispatch only (design §6).

Errors from the library (MossTTSError) print as one line with exit code 1; `--debug` shows
the traceback.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import platform
import sys
import warnings
from contextlib import contextmanager


from . import __version__
from .audio import DEFAULT_SAMPLE_FORMAT, SAMPLE_FORMATS
from .batch.command import add_parser as add_batch_parser
from .cli_args import at_most, check_output, port, positive_float, positive_int, printing, writing
from .errors import InputError, MossTTSError

AUDIO_SUFFIXES = (".wav", ".flac")
# --chunk-seconds: a chunk's memory grows with its positions in the codec's fastest stage, linearly
# (KV caches of window + chunk slots) and with their square (each stage's window mask, built on
# the host, is positions × (window + positions)). Measured: peak RSS of `decode` of 400 s on the
# tiny v1 codec (200 positions/s; masks dominate): 0.10 GB at 10 s, 0.43 GB at 30 s, 1.5 GB at
# 60 s, 5.9 GB at 120 s, and at 3600 s one mask asked for 13.4 GiB. The 24 kHz codec's decoder
# (upstream's default config, 100 positions/s; TowerState built and advanced one chunk, caches
# dominate, ~17 MB per second of chunk): 0.35 GB at 10 s, 0.75 GB at 30 s, 1.44 GB at 60 s,
# before its compute buffer. 6000 positions: 30 s on the tiny codec, 60 s on the 24 kHz one, 15 s
# on Nano's (400/s). Speed gains end near 1,000 positions (codec.py's default): nothing is lost.
MAX_CHUNK_POSITIONS = 6000
MAX_CHUNK_SECONDS = 60.0   # the bound on the slowest codec (100 positions/s); argparse's check
# fixtures/ ships with a checkout, not in the wheel (pyproject includes moss_tts and converters)
TINY_MODELS_COMMAND = "python -m fixtures.make_tiny_pair DIR in a checkout"


def _doctor(args) -> int:
    code = 0   # a reader that stopped early (`| head`) leaves it 0: it had what it wanted
    with printing():
        code = _print_doctor()
    return code


def _print_doctor() -> int:
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
        meta = {key: _plain(f.get(key)) for key in f.keys()}
        tensors = list(f.tensors.values())
        with printing():
            if args.json:   # machine-readable: every value in full, whatever --full says
                print(json.dumps({"file": str(f.path), "gguf_version": f.version, "metadata": meta,
                                  "tensors": [{"name": t.name, "type": t.type.name.lower(),
                                               "shape": list(t.shape), "bytes": t.nbytes}
                                              for t in tensors]}, indent=1, default=str))
            else:
                _print_info(f, meta, tensors, args.full)
    return 0


def _plain(value):
    """GGUF values as JSON-ready Python: arrays become lists (never numpy's abbreviated repr)."""
    return value.tolist() if hasattr(value, "tolist") else value


def _print_info(f, meta: dict, tensors: list, full: bool) -> None:
    total = sum(t.nbytes for t in tensors)
    print(f"{f.path}: GGUF v{f.version}, kind {f.get('moss.kind', '(none)')}, "
          f"{len(tensors)} tensors, {total / 2**20:.1f} MiB")
    print("metadata:")
    for key, value in meta.items():
        if isinstance(value, list) and len(value) > 8 and not full:
            value = value[:8] + [f"... ({len(value)} items)"]
        text = repr(value)
        if len(text) > 160 and not full:
            text = text[:157] + "..."
        print(f"  {key} = {text}")
    print("tensors:")
    shown = tensors if full or len(tensors) <= 60 else tensors[:60]
    for t in shown:
        print(f"  {t.name:60s} {t.type.name.lower():6s} {str(tuple(t.shape)):20s} {t.nbytes}")
    if len(shown) < len(tensors):
        print(f"  ... {len(tensors) - len(shown)} more (--full lists all)")


class Progress:
    """A one-line progress indicator on stderr; silent with --quiet or when stderr is no TTY."""

    def __init__(self, label: str, quiet: bool, unit: str = "frames"):
        self.label, self.unit = label, unit
        self.enabled = not quiet and sys.stderr.isatty()
        self.shown = False

    def __call__(self, done: int, total: int) -> None:
        if self.enabled:
            pct = 100 * done // max(total, 1)
            print(f"\r{self.label}: {pct:3d}% ({done}/{total} {self.unit})", end="", file=sys.stderr,
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


def _resolve(spec: str, family: str, flag: str, quiet: bool = False):
    """A model flag's value → a GGUF path (a checkpoint is converted into the cache once, with
    progress: an 8B takes minutes); a failure names the flag and the offline way out."""
    from .hub import resolve_gguf

    try:
        with Progress(f"converting {spec} into the cache", quiet, "tensors") as bar:
            return resolve_gguf(spec, family, progress=lambda i, n, name: bar(i, n))
    except MossTTSError as e:
        raise type(e)(f"{flag} {e}; {flag} also takes a local .gguf or checkpoint directory "
                      f"(tiny models for a first run offline: {TINY_MODELS_COMMAND})") from None


def _load_codec(args):
    from .codec import Codec

    codec = Codec.load(_resolve(args.codec, "codec", "--codec"), backend=args.backend,
                       threads=args.threads, **({"chunk_seconds": args.chunk_seconds}
                                                if args.chunk_seconds is not None else {}))
    if args.chunk_seconds is not None:
        limit = MAX_CHUNK_POSITIONS / _positions_per_second(codec.config)
        if args.chunk_seconds > limit:
            codec.close()
            raise InputError(f"--chunk-seconds {args.chunk_seconds:g}: this codec takes at most "
                             f"{limit:g} s per chunk (a chunk's memory grows with its square); "
                             "leave it out for the fastest default")
    return codec


def _positions_per_second(cfg) -> float:
    """Positions per second of audio in the codec's fastest transformer stage."""
    from .codec.config import TRANSFORMER
    from .codec.tower import positions_per_frame

    return cfg.frame_rate * max(n for tower in ("encoder", "decoder")
                                for n, s in zip(positions_per_frame(cfg, tower),
                                                getattr(cfg, tower)) if s.kind == TRANSFORMER)


@contextmanager
def _chunk_memory(args):
    """A chunk that the bound lets through but this machine cannot hold: one line, not numpy's
    traceback."""
    try:
        yield
    except MemoryError:
        given = "" if args.chunk_seconds is None else f" {args.chunk_seconds:g}"
        raise InputError(f"--chunk-seconds{given}: not enough free memory for one chunk; pass "
                         "a smaller --chunk-seconds (a chunk's memory grows with its square)") \
            from None


def _check_audio_output(args, *, stdout_ok: bool = False) -> None:
    """Everything about `-o` that can be known before the work: the place and the format."""
    from .audio import container_of

    check_output(args.out, AUDIO_SUFFIXES + (("-",) if stdout_ok else ()))
    if args.out != "-":
        container_of(args.out, args.sample_format)


def _write_audio(args, audio, sample_rate: int) -> None:
    from .audio import encode_file, write_audio

    with writing(args.out):
        if args.out == "-":   # the whole clip is here: a WAV with its exact sizes, as in a file
            sys.stdout.buffer.write(encode_file(audio, sample_rate, "WAV", args.sample_format))
        else:
            write_audio(args.out, audio, sample_rate, sample_format=args.sample_format)


def _encode(args) -> int:
    import numpy as np

    from .audio import read_audio_blocks
    from .codec.io import save_codes

    check_output(args.out, (".npy", "-"))
    blocks, sr, total = read_audio_blocks(args.input)   # an hour of audio never sits in memory
    with _load_codec(args) as codec, Progress("encoding", args.quiet) as bar, _chunk_memory(args):
        codes = codec.encode_blocks(blocks, sr, n_quantizers=args.n_quantizers, total=total,
                                    progress=bar)
    with writing(args.out):
        if args.out == "-":
            np.save(sys.stdout.buffer, codes.astype(np.int32))
        else:
            save_codes(args.out, codes)
    _say(args, f"{_where(args.out)}: {codes.shape[0]} codebooks x {codes.shape[1]} frames")
    return 0


def _decode(args) -> int:
    from .codec.io import load_codes

    _check_audio_output(args, stdout_ok=True)
    codes = load_codes(args.input)
    with _load_codec(args) as codec:
        with Progress("decoding", args.quiet) as bar, _chunk_memory(args):
            audio = codec.decode(codes, n_quantizers=args.n_quantizers, progress=bar)
        _write_audio(args, audio, codec.sample_rate)
        _say(args, f"{_where(args.out)}: {audio.shape[0] / codec.sample_rate:.2f} s at "
                   f"{codec.sample_rate} Hz, {audio.shape[1]} channel(s)")
    return 0


def _reconstruct(args) -> int:
    from .audio import read_audio

    _check_audio_output(args, stdout_ok=True)
    samples, sr = read_audio(args.input)
    with _load_codec(args) as codec, _chunk_memory(args):
        with Progress("encoding", args.quiet) as bar:
            codes = codec.encode(samples, sr, n_quantizers=args.n_quantizers, progress=bar)
        with Progress("decoding", args.quiet) as bar:
            audio = codec.decode(codes, progress=bar)
        _write_audio(args, audio, codec.sample_rate)
        _say(args, f"{_where(args.out)}: {codes.shape[1]} frames through {codes.shape[0]} "
                   "codebooks")
    return 0


def _convert(args) -> int:
    from .models.registry import convert_options, family

    row = family(args.family)
    options = convert_options(args.family, vars(args))
    check_output(args.out, (".gguf",))
    with Progress("writing", args.quiet, "tensors") as bar, writing(args.out):
        out = row.convert(args.model, args.out, outtype=args.outtype, strict=args.strict,
                          progress=lambda i, n, name: bar(i, n), **options)
    _say(args, f"{out}: written ({out.stat().st_size / 2**20:.1f} MiB, {args.outtype})")
    return 0


def _where(out: str) -> str:
    return "stdout" if out == "-" else out


def _say(args, message: str) -> None:
    if not args.quiet:
        print(message, file=sys.stderr)


def _add_runtime_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--backend", default="cpu", help="ggml backend: cpu (default), cuda, vulkan, metal")
    p.add_argument("--threads", type=positive_int, default=None,
                   help="CPU threads (default and maximum: the usable cores)")
    p.add_argument("--quiet", action="store_true", help="no progress or summary on stderr")


def _add_sample_format(p: argparse.ArgumentParser) -> None:
    p.add_argument("--sample-format", choices=list(SAMPLE_FORMATS), default=DEFAULT_SAMPLE_FORMAT,
                   help="output samples, the same in a file and on stdout: s16 (default; 16-bit "
                        "PCM), s24, or f32 (32-bit float, unclipped; WAV only)")


def _add_codec_commands(sub, common) -> None:
    for name, func, helptext, src, dst in (
            ("encode", _encode, "audio file → codes (.npy, int32 [n_quantizers, frames])",
             "audio file (WAV/FLAC)", "codes .npy, or - for the .npy bytes on stdout"),
            ("decode", _decode, "codes (.npy) → audio file", "codes .npy",
             "WAV or FLAC file, or - for a WAV on stdout"),
            ("reconstruct", _reconstruct, "audio → codes → audio through a codec",
             "audio file (WAV/FLAC)", "WAV or FLAC file, or - for a WAV on stdout")):
        p = sub.add_parser(name, help=helptext, parents=[common])
        p.add_argument("input", help=src)
        p.add_argument("--codec", required=True,
                       help="codec GGUF, checkpoint directory or Hugging Face repo id")
        p.add_argument("--out", "-o", required=True, help=dst)
        p.add_argument("--n-quantizers", type=positive_int, default=None,
                       help="use only the first K codebooks (default: all)")
        p.add_argument("--chunk-seconds", type=at_most(MAX_CHUNK_SECONDS), default=None,
                       help="audio per graph run; results are identical for any value. Memory "
                            "grows with it, its masks with its square: the 24 kHz codec's decoder "
                            "caches and masks take 0.35 GB at 10 s, 1.4 GB at 60 s (the tiny "
                            "test codec: 0.1 and 1.5 GB). At most "
                            f"{MAX_CHUNK_POSITIONS} positions of the codec's fastest stage: 60 s "
                            "on the 24 kHz codec, 15 s on Nano's (default: the fastest, 2-10 s)")
        if name != "encode":
            _add_sample_format(p)
        _add_runtime_flags(p)
        p.set_defaults(func=func)


def _serve(args) -> int:
    import uvicorn

    from .cli_tts import load_models
    from .server import create_app

    api_key = args.api_key or os.environ.get("MOSS_TTS_API_KEY") or None
    if args.access_log:
        logging.getLogger("moss_tts.access").setLevel(logging.INFO)
    if api_key is None and args.host not in ("127.0.0.1", "localhost", "::1"):
        print(f"warning: serving on {args.host} without --api-key: anyone who can reach it "
              "can use it", file=sys.stderr)
    models = load_models(args)
    app = create_app(models, queue_depth=args.queue, api_key=api_key,
                     cors_origins=args.cors_origin, allowed_hosts=args.allowed_host,
                     bind_host=args.host, access_log=args.access_log,
                     write_timeout=args.write_timeout)
    _say(args, f"serving {', '.join(models)} on http://{args.host}:{args.port} (POST "
               f"/v1/audio/speech{', API key required' if api_key else ''})")
    uvicorn.run(app, host=args.host, port=args.port, log_level="warning")
    return 0


def _add_serve(sub, common) -> None:
    from .models.registry import DEFAULT

    p = sub.add_parser("serve", help="OpenAI-style speech API (POST /v1/audio/speech)",
                       parents=[common])
    p.add_argument("--model", action="append", default=None,
                   help="a model GGUF of any family, published MOSS-TTS-GGUF directory or Nano "
                        f"repo id; repeatable: a request's 'model' picks one, the first serves "
                        f"OpenAI's names (default {DEFAULT.default_model})")
    p.add_argument("--codec", action="append", default=None,
                   help="each --model's codec GGUF or repo id, in the same order (default: "
                        "the family's, as `tts --help` lists)")
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default loopback)")
    p.add_argument("--port", type=port, default=8080)
    p.add_argument("--queue", type=positive_int, default=4,
                   help="requests that may wait behind the running one; more get 503")
    p.add_argument("--api-key", default=None,
                   help="require 'Authorization: Bearer KEY' on all but /health and the page "
                        "(default: $MOSS_TTS_API_KEY, else no key)")
    p.add_argument("--cors-origin", action="append", default=[], metavar="ORIGIN",
                   help="let pages from ORIGIN (e.g. http://app.example:3000) call the API; "
                        "repeatable. Other origins are refused (403)")
    p.add_argument("--allowed-host", action="append", default=[], metavar="NAME",
                   help="also answer to Host NAME (besides 127.0.0.1, localhost, [::1] and "
                        "--host); repeatable, '*' allows any")
    p.add_argument("--access-log", action="store_true", help="log one line per request")
    p.add_argument("--write-timeout", type=positive_float, default=None, metavar="SECONDS",
                   help="drop a streaming client that reads nothing for this long (default 15)")
    _add_runtime_flags(p)
    p.set_defaults(func=_serve)


def _voice(args) -> int:
    from .voices import add_voice, codec_info, list_voices, remove_voice, voices_dir

    if args.voice_command == "list":
        voices = list_voices()
        _say(args, f"{len(voices)} voice(s) in {voices_dir()} (set MOSS_TTS_VOICES to move them)")
        with printing():
            for v in voices:
                print(f"{v['name']}\t{v.get('frames', '?')} frames\t{_voice_codec(v)}\t"
                      f"{v.get('source', '')}")
        return 0
    if args.voice_command == "remove":
        remove_voice(args.name)
        _say(args, f"removed voice {args.name}")
        return 0
    from .audio import REFERENCE_MAX_SECONDS, read_audio
    from .codec import Codec

    samples, sr = read_audio(args.reference, max_seconds=REFERENCE_MAX_SECONDS)
    with Codec.load(_resolve(args.codec, "codec", "--codec"), threads=args.threads) as codec:
        codes = codec.encode(samples, sr)
        info = {"source": str(args.reference)} | codec_info(codec)
    with writing(str(voices_dir())):
        stored = add_voice(args.name, codes.T, info, overwrite=args.force)
    _say(args, f"voice {args.name}: {codes.shape[1]} frames from {args.reference}, stored in "
               f"{stored.parent}")
    return 0


def _voice_codec(info: dict) -> str:
    """The codec a stored voice was encoded with: a model takes voices of its own codec only."""
    if "variant" not in info:   # stored before voices recorded their codec
        return "codec unknown"
    return f"{info['variant']} codec, {info.get('sample_rate', '?')} Hz"


def _add_voice_commands(sub, common) -> None:
    from .models.registry import DEFAULT
    from .voices import voices_dir

    p = sub.add_parser("voice", help="store, list and remove reference voices", parents=[common],
                       description=f"Voices are stored in {voices_dir()} ($MOSS_TTS_VOICES, "
                                   "default $XDG_DATA_HOME/moss-tts/voices).")
    vs = p.add_subparsers(dest="voice_command", required=True, metavar="ACTION")
    a = vs.add_parser("add", help="encode a reference once and store it under a name",
                      parents=[common])
    a.add_argument("name")
    a.add_argument("reference", help="reference speech (WAV/FLAC)")
    a.add_argument("--codec", default=DEFAULT.default_codec,
                   help="codec GGUF, checkpoint directory or repo id")
    a.add_argument("--force", action="store_true", help="replace an existing voice")
    a.add_argument("--threads", type=positive_int, default=None)
    a.add_argument("--quiet", action="store_true")
    lst = vs.add_parser("list", help="list stored voices (and where they are)", parents=[common])
    lst.add_argument("--quiet", action="store_true")
    r = vs.add_parser("remove", help="delete a stored voice", parents=[common])
    r.add_argument("name")
    r.add_argument("--quiet", action="store_true")
    p.set_defaults(func=_voice)


class _Parser(argparse.ArgumentParser):
    """Usage mistakes print one line (the usage is one `--help` away), like every other error."""

    def error(self, message):
        self.exit(2, f"error: {message} (see {self.prog} --help)\n")


def _common_flags() -> argparse.ArgumentParser:
    """Flags every subcommand also takes after its name. SUPPRESS keeps a subcommand from
    resetting a value given before it (`--debug info x` and `info x --debug` both work)."""
    common = _Parser(add_help=False)
    common.add_argument("--debug", action="store_true", default=argparse.SUPPRESS,
                        help="show tracebacks and debug logging")
    return common


def build_parser() -> argparse.ArgumentParser:
    common = _common_flags()
    p = _Parser(prog="python -m moss_tts",
                                description="MOSS-TTS family on stock ggml, from Python.")
    p.add_argument("--version", action="version", version=f"moss-tts {__version__}")
    p.add_argument("--debug", action="store_true", help="show tracebacks and debug logging")
    sub = p.add_subparsers(dest="command", metavar="COMMAND")
    d = sub.add_parser("doctor", help="report the ggml build, backends, threads and CPU features",
                       parents=[common])
    d.set_defaults(func=_doctor)
    i = sub.add_parser("info", help="show a GGUF file's kind, metadata and tensor table",
                       parents=[common])
    i.add_argument("file", help="a .gguf file")
    i.add_argument("--json", action="store_true", help="machine-readable output, never abbreviated")
    i.add_argument("--full", action="store_true", help="do not abbreviate long values")
    i.set_defaults(func=_info)
    from .cli_tts import add_tts_commands
    from .models.registry import CONVERTIBLE, convert_flag_help

    c = sub.add_parser("convert", help="Hugging Face checkpoint → GGUF", parents=[common])
    c.add_argument("family", choices=list(CONVERTIBLE),
                   help="; ".join(f"{k}: {f.name}" for k, f in CONVERTIBLE.items()))
    c.add_argument("--model", required=True, help="checkpoint directory or Hugging Face repo id")
    c.add_argument("--out", "-o", required=True, help="output .gguf")
    c.add_argument("--outtype", default="f32",
                   help="matmul weight type: f32 (default), f16, bf16, q8_0, q4_K, ...")
    for key, text in convert_flag_help().items():
        c.add_argument("--" + key.replace("_", "-"), help=text)
    c.add_argument("--strict", action="store_true", help="fail on any checkpoint tensor not used")
    c.add_argument("--quiet", action="store_true", help="no progress on stderr")
    c.set_defaults(func=_convert)
    _add_codec_commands(sub, common)
    add_tts_commands(sub, common)
    _add_voice_commands(sub, common)
    _add_serve(sub, common)
    add_batch_parser(sub, common)
    return p


def _report_warnings(quiet: bool) -> None:
    """What the library warns a user about (a frame budget that cut the audio) is one
    "warning:" line on stderr each time, or nothing with --quiet; other warnings as Python
    shows them."""
    from .errors import BudgetWarning
    from .knobs import KNOBS

    shown = warnings.showwarning

    def show(message, category, filename, lineno, file=None, line=None):
        if issubclass(category, BudgetWarning):
            text, keyword = str(message), getattr(message, "keyword", None)
            for knob in KNOBS:      # the knob to raise, as the flag a CLI user types
                if keyword and knob.keyword == keyword:
                    text = text.replace(f"raise {keyword}", f"raise {knob.flag}")
            print(f"warning: {text}", file=sys.stderr)
        else:
            shown(message, category, filename, lineno, file, line)

    warnings.showwarning = show
    warnings.simplefilter("ignore" if quiet else "always", BudgetWarning)


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.DEBUG if args.debug else logging.WARNING,
                        format="%(levelname)s %(name)s: %(message)s")
    if not getattr(args, "func", None):
        parser.print_help(sys.stderr)
        return 2
    _report_warnings(quiet=getattr(args, "quiet", False))
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
