"""`python -m moss_tts encode | decode | reconstruct`: audio through a codec alone."""

from __future__ import annotations

import sys
from contextlib import contextmanager

from ..errors import InputError
from .common import (Progress, add_runtime_flags, add_sample_format, at_most, check_audio_output,
                     check_output, positive_int, resolve, say, where, write_audio, writing)

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


def _load_codec(args):
    from ..codec import Codec

    codec = Codec.load(resolve(args.codec, "codec", "--codec"), backend=args.backend,
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
    from ..codec.config import TRANSFORMER
    from ..codec.tower import positions_per_frame

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


def _encode(args) -> int:
    import numpy as np

    from ..audio import read_audio_blocks
    from ..codec.io import save_codes

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
    say(args, f"{where(args.out)}: {codes.shape[0]} codebooks x {codes.shape[1]} frames")
    return 0


def _decode(args) -> int:
    from ..codec.io import load_codes

    check_audio_output(args, stdout_ok=True)
    codes = load_codes(args.input)
    with _load_codec(args) as codec:
        with Progress("decoding", args.quiet) as bar, _chunk_memory(args):
            audio = codec.decode(codes, n_quantizers=args.n_quantizers, progress=bar)
        write_audio(args, audio, codec.sample_rate)
        say(args, f"{where(args.out)}: {audio.shape[0] / codec.sample_rate:.2f} s at "
                   f"{codec.sample_rate} Hz, {audio.shape[1]} channel(s)")
    return 0


def _reconstruct(args) -> int:
    from ..audio import read_audio

    check_audio_output(args, stdout_ok=True)
    samples, sr = read_audio(args.input)
    with _load_codec(args) as codec, _chunk_memory(args):
        with Progress("encoding", args.quiet) as bar:
            codes = codec.encode(samples, sr, n_quantizers=args.n_quantizers, progress=bar)
        with Progress("decoding", args.quiet) as bar:
            audio = codec.decode(codes, progress=bar)
        write_audio(args, audio, codec.sample_rate)
        say(args, f"{where(args.out)}: {codes.shape[1]} frames through {codes.shape[0]} "
                   "codebooks")
    return 0


# command → (what it runs, its one-line help, its input, its output)
COMMANDS = {
    "encode": (_encode, "audio file → codes (.npy, int32 [n_quantizers, frames])",
               "audio file (WAV/FLAC)", "codes .npy, or - for the .npy bytes on stdout"),
    "decode": (_decode, "codes (.npy) → audio file", "codes .npy",
               "WAV or FLAC file, or - for a WAV on stdout"),
    "reconstruct": (_reconstruct, "audio → codes → audio through a codec",
                    "audio file (WAV/FLAC)", "WAV or FLAC file, or - for a WAV on stdout")}


def commands() -> dict[str, str]:
    return {name: helptext for name, (_, helptext, _, _) in COMMANDS.items()}


def add_flags(p, command: str, common) -> None:
    func, _, src, dst = COMMANDS[command]
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
    if command != "encode":
        add_sample_format(p)
    add_runtime_flags(p)
    p.set_defaults(func=func)
