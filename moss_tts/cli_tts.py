"""`python -m moss_tts tts` (any family, read from the model GGUF's kind) and its alias
`tts-nano` (the Nano default model; a non-Nano model is refused). Sampling flags default to
None: the family's options dataclass fills what is not given, so its defaults are written once.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import itertools
import sys
from pathlib import Path

from .cli import (Progress, _add_runtime_flags, _add_sample_format, _check_audio_output,
                  _resolve, _say, _write_audio)
from .cli_args import non_negative_int, positive_float, positive_int, probability, writing
from .errors import InputError

# sampling flag (its dest) → the options field it sets, when the family's dataclass has it
SAMPLING_FLAGS = {"temperature": "audio_temperature", "top_k": "audio_top_k",
                  "top_p": "audio_top_p", "repetition_penalty": "audio_repetition_penalty",
                  "text_temperature": "text_temperature", "text_top_k": "text_top_k",
                  "text_top_p": "text_top_p"}
# flags only some families take: dest → (flag, families, the `stream` keyword it becomes)
FAMILY_FLAGS = {
    "prompt_text": ("--prompt-text", ("nano", "delay", "local", "local-v15"), "prompt_text"),
    "prompt_audio": ("--prompt-audio", ("nano", "delay", "local", "local-v15"), None),  # prompt
    "max_frames": ("--max-frames", ("nano", "local", "local-v15", "realtime"), "max_frames"),
    "voice_clone_max_text_tokens": ("--voice-clone-max-text-tokens", ("nano",),
                                    "max_text_tokens"),
    "language": ("--language", ("delay", "local", "local-v15"), "language"),
    "instruction": ("--instruction", ("delay", "local", "local-v15"), "instruction"),
    "tokens": ("--tokens", ("delay", "local", "local-v15"), "tokens"),
    "seconds": ("--seconds", ("delay", "local", "local-v15"), "seconds"),
    "max_new_rows": ("--max-new-rows", ("delay",), "max_new_rows"),
    "n_vq": ("--n-vq", ("local",), "n_vq_for_inference"),
}


def model_path(spec: str):
    """--model → what `load_tts` takes: a file or a published MOSS-TTS-GGUF directory as they
    are; a checkpoint directory or repo id converted (into the cache) by the family its
    config.json names."""
    from .models.delay_published import is_published_dir

    return spec if Path(spec).is_file() or is_published_dir(spec) else \
        _resolve(spec, "model", "--model")


def check_family_flags(args, cls) -> None:
    """A flag the loaded family does not take → one line naming the flag and the family."""
    fields = {f.name for f in dataclasses.fields(cls.OPTIONS)}
    unused = [flag for dest, (flag, families, _) in FAMILY_FLAGS.items()
              if cls.FAMILY not in families and getattr(args, dest) is not None]
    unused += ["--" + dest.replace("_", "-") for dest, field in SAMPLING_FLAGS.items()
               if field not in fields and getattr(args, dest) is not None]
    if unused:
        raise InputError(f"{unused[0]} is not a {cls.NAME} option (the --model is a "
                         f"{cls.NAME} one): leave it out, or pass a model of the family "
                         "`--help` names for it")


def sampling_options(args, options_class):
    """The given sampling flags over the family's defaults; --greedy is argmax everywhere."""
    fields = {f.name for f in dataclasses.fields(options_class)}
    given = {field: getattr(args, dest) for dest, field in SAMPLING_FLAGS.items()
             if getattr(args, dest) is not None}
    if args.greedy:   # a family either has a sampling switch or is greedy at temperature 0
        given.update({"do_sample": False} if "do_sample" in fields else
                     {"text_temperature": 0, "audio_temperature": 0})
    return options_class(**given)


def stream_keywords(args, family: str) -> dict:
    return {word: getattr(args, dest) for dest, (_, families, word) in FAMILY_FLAGS.items()
            if family in families and word is not None and getattr(args, dest) is not None}


def _tts(args) -> int:
    from .cli_live import check_live, stdin_deltas
    from .live import live_chunks
    from .load import tts_class

    text = None if args.live else _read_text(args)   # --live: stdin is read as it arrives
    _check_audio_output(args, stdout_ok=True)
    _check_tts_flags(args)
    model = model_path(args.model)
    cls = tts_class(model)
    if args.family is not None and cls.FAMILY != args.family:
        raise InputError(f"{args.model}: a {cls.NAME} model; `{args.command}` speaks with "
                         f"{args.family} models only — use `python -m moss_tts tts`")
    if args.live:
        check_live(args, cls)
    check_family_flags(args, cls)
    options = sampling_options(args, cls.OPTIONS)
    codec = _resolve(_codec_spec(args.codec, cls), "codec", "--codec")
    with cls.load(model, codec=codec, backend=args.backend, threads=args.threads) as tts:
        if args.live:
            session = tts.session(voice=_reference(args, tts), options=options, seed=args.seed,
                                  **stream_keywords(args, cls.FAMILY))   # --max-frames a turn
            chunks = live_chunks(session, stdin_deltas(sys.stdin.fileno()), tts.channels)
        else:
            chunks = tts.stream(text, reference=_reference(args, tts), options=options,
                                seed=args.seed, **_prompt(args, tts),
                                **stream_keywords(args, cls.FAMILY))
        with Progress("generating", args.quiet) as bar, contextlib.closing(chunks):
            if args.out == "-":
                _stream_to_stdout(args, chunks, tts, bar)
                return 0
            audio = _collect(chunks, tts, bar)
        _write_audio(args, audio, tts.sample_rate)
        _say(args, f"{args.out}: {len(audio) / tts.sample_rate:.2f} s at {tts.sample_rate} Hz, "
                   f"{'stereo' if tts.channels == 2 else 'mono'}")
    return 0


def _codec_spec(given: str | None, cls) -> str:
    """--codec, or the family's default codec (Nano's; the others have none)."""
    from .hub import DEFAULT_NANO_CODEC

    spec = given or {"nano": DEFAULT_NANO_CODEC}.get(cls.FAMILY)
    if spec is None:
        raise InputError(f"--codec is required for {cls.NAME}: pass {cls.CODEC_NAME}")
    return spec


def load_models(args) -> dict:
    """serve's --model (repeatable; Nano's default without one) and --codec paired with them
    in order → {name: loaded TTS}, named moss-tts-<family> (the file's stem when two share a
    family). A failure closes what was loaded."""
    from .hub import DEFAULT_NANO
    from .load import tts_class

    specs, codecs = args.model or [DEFAULT_NANO], args.codec or []
    if len(codecs) > len(specs):
        raise InputError(f"{len(codecs)} --codec for {len(specs)} --model: give each model's "
                         "codec after it, in the same order")
    models: dict = {}
    try:
        for spec, codec in itertools.zip_longest(specs, codecs):
            path = model_path(spec)
            cls = tts_class(path)
            name = f"moss-tts-{cls.FAMILY}" if f"moss-tts-{cls.FAMILY}" not in models \
                else Path(spec).stem
            if name in models:
                raise InputError(f"--model {spec}: the name {name!r} is taken; rename the file")
            models[name] = cls.load(path, codec=_resolve(_codec_spec(codec, cls), "codec",
                                                         "--codec"),
                                    backend=args.backend, threads=args.threads)
    except BaseException:
        for tts in models.values():
            tts.close()
        raise
    return models


def _reference(args, tts):
    from .audio import REFERENCE_MAX_SECONDS, read_audio

    if args.voice:
        return tts.voice(args.voice)
    if args.reference:
        return tts.encode_reference(*read_audio(args.reference, max_seconds=REFERENCE_MAX_SECONDS))
    return None


def _prompt(args, tts) -> dict:
    """Continuation: the prompt audio encoded whole (it must match its transcript)."""
    from .audio import read_audio

    if args.prompt_audio is None:
        return {}
    return {"prompt": tts.encode_reference(*read_audio(args.prompt_audio), max_seconds=None)}


def _check_tts_flags(args) -> None:
    """Flag combinations the model would refuse only after loading, in the flags' own words."""
    if args.out != "-" and args.format != "wav":
        raise InputError("--format raw is for -o - (stdout); a file's format follows its name")
    if (args.prompt_text is None) != (args.prompt_audio is None):
        raise InputError("--prompt-text and --prompt-audio go together: continuation needs the "
                         "recording and its transcript")
    if args.prompt_audio is not None and (args.reference or args.voice):
        raise InputError("--prompt-audio continues a recording and --reference/--voice clone a "
                         "voice: use one of the two")
    if args.tokens is not None and args.seconds is not None:
        raise InputError("--tokens and --seconds both set the duration: give one")


def _read_text(args) -> str:
    if args.text is not None:
        return args.text
    if args.text_file == "-":   # the usual name for stdin; read even a terminal, to Ctrl-D
        if sys.stdin is None:
            raise InputError("--text-file -: stdin is closed; pass a file name or --text")
        return _utf8(sys.stdin.buffer.read(), "stdin")
    if args.text_file is not None:
        try:
            data = Path(args.text_file).read_bytes()
        except OSError as e:
            raise InputError(f"{args.text_file}: cannot read ({e.strerror})") from None
        return _utf8(data, args.text_file)
    if sys.stdin is None or sys.stdin.isatty():
        raise InputError("no text: pass --text, --text-file, or pipe text on stdin")
    return _utf8(sys.stdin.buffer.read(), "stdin")


def _utf8(data: bytes, source: str) -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise InputError(f"{source}: not UTF-8 text (byte {e.start}: {data[e.start:e.start + 1]!r}"
                         "); convert it, e.g. iconv -t UTF-8") from None


def _stream_to_stdout(args, chunks, tts, bar) -> None:
    from .audio import PcmStreamWriter

    done = 0
    with writing("-"):
        with PcmStreamWriter(sys.stdout.buffer, tts.sample_rate, tts.channels, fmt=args.format,
                             sample_format=args.sample_format) as out:
            for part in chunks:
                out.write(part)
                done += len(part)
                bar.audio(done / tts.sample_rate)


def _collect(chunks, tts, bar):
    import numpy as np

    parts, done = [], 0
    for part in chunks:
        parts.append(part)
        done += len(part)
        bar.audio(done / tts.sample_rate)
    return np.concatenate(parts) if parts else np.zeros((0, tts.channels), np.float32)


def _family_defaults(field: str) -> str:
    """'nano 0.8, delay 1.7': each family's default for an options field, read from its
    dataclass (the help never repeats a number)."""
    from .sampling import (DelaySamplingOptions, LocalSamplingOptions, LocalV15SamplingOptions,
                           RealtimeSamplingOptions, SamplingOptions)

    return ", ".join(f"{family} {getattr(cls(), field)}" for family, cls in
                     (("nano", SamplingOptions), ("delay", DelaySamplingOptions),
                      ("local", LocalSamplingOptions), ("local-v15", LocalV15SamplingOptions),
                      ("realtime", RealtimeSamplingOptions))
                     if hasattr(cls(), field))


def add_tts_commands(sub, common) -> None:
    from .hub import DEFAULT_NANO, DEFAULT_NANO_CODEC

    for name, family, helptext in (
            ("tts", None, "text → speech with any MOSS-TTS model (the family is read from the "
                          "GGUF: MOSS-TTS-Nano, MOSS-TTS (Delay), MOSS-TTS-Local-Transformer, "
                          "MOSS-TTS-Local-Transformer-v1.5, MOSS-TTS-Realtime)"),
            ("tts-nano", "nano", "text → 48 kHz stereo speech with MOSS-TTS-Nano")):
        p = sub.add_parser(name, help=helptext, parents=[common])
        _add_tts_flags(p, DEFAULT_NANO, DEFAULT_NANO_CODEC)
        p.set_defaults(func=_tts, family=family)


# how --help names a family, for the flags only some families take
SHORT_NAMES = {"nano": "Nano", "delay": "Delay", "local": "Local", "local-v15": "Local v1.5",
               "realtime": "Realtime"}


def _who(dest: str, text: str) -> str:
    """A family flag's help, prefixed by the families FAMILY_FLAGS gives it to."""
    return f"{', '.join(SHORT_NAMES[f] for f in FAMILY_FLAGS[dest][1])}: {text}"


def _add_tts_flags(p: argparse.ArgumentParser, default_model: str, default_codec: str) -> None:
    src = p.add_mutually_exclusive_group()
    src.add_argument("--text", help="the text to speak (or --text-file, or stdin)")
    src.add_argument("--text-file", help="read the text from this UTF-8 file (- for stdin)")
    p.add_argument("--model", default=default_model, help="model GGUF (any family), published "
                   "MOSS-TTS-GGUF directory, checkpoint directory or Hugging Face repo id "
                   f"(default {default_model}; converted once into the cache)")
    p.add_argument("--codec", default=None, help="codec GGUF, checkpoint directory or repo id "
                   f"(default for Nano: {default_codec}; required for other families)")
    voice = p.add_mutually_exclusive_group()
    voice.add_argument("--reference", "--prompt-speech", dest="reference",
                       help="reference speech to clone (WAV/FLAC)")
    voice.add_argument("--voice", help="a stored voice (python -m moss_tts voice add ...)")
    p.add_argument("--prompt-text", help=_who("prompt_text", "continuation: the transcript of "
                                                              "--prompt-audio"))
    p.add_argument("--prompt-audio", help=_who("prompt_audio", "continuation: speech the output "
                                                                "continues"))
    p.add_argument("--language", help=_who("language", "the language of the text (e.g. en, zh)"))
    p.add_argument("--instruction", help=_who("instruction", "a style instruction for the voice"))
    p.add_argument("--tokens", type=positive_int, default=None,
                   help=_who("tokens", "the duration in codec frames (or --seconds)"))
    p.add_argument("--seconds", type=positive_float, default=None,
                   help=_who("seconds", "the duration in seconds"))
    p.add_argument("--live", action="store_true",
                   help="Realtime: speak stdin's text as it arrives (pipe an LLM's output in); "
                        "the audio leaves as it is made")
    p.add_argument("--out", "-o", required=True,
                   help="output .wav/.flac, or - to stream WAV (or --format raw) to stdout")
    p.add_argument("--format", choices=["wav", "raw"], default="wav",
                   help="stdout format: WAV with a streaming header, or raw interleaved samples")
    _add_sample_format(p)
    p.add_argument("--seed", type=non_negative_int, default=None,
                   help="random seed, 0 or more (default: unseeded)")
    p.add_argument("--greedy", action="store_true", help="argmax decoding instead of sampling")
    for flag, kind, what in (
            ("--temperature", positive_float, "audio temperature"),
            ("--text-temperature", positive_float, "text (Nano: stop decision) temperature"),
            ("--top-k", non_negative_int, "audio top-k, 0 = off"),
            ("--top-p", probability, "audio top-p"),
            ("--repetition-penalty", positive_float, "audio repetition penalty, 1 = off"),
            ("--text-top-k", non_negative_int, "text top-k, 0 = off"),
            ("--text-top-p", probability, "text top-p")):
        field = SAMPLING_FLAGS[flag[2:].replace("-", "_")]
        p.add_argument(flag, type=kind, default=None,
                       help=f"{what} (family default: {_family_defaults(field)})")
    p.add_argument("--max-frames", "--max-new-frames", dest="max_frames", type=positive_int,
                   default=None, help=_who("max_frames", "cap of generated frames (Nano: per "
                                                         "text chunk)"))
    p.add_argument("--voice-clone-max-text-tokens", type=positive_int, default=None,
                   help=_who("voice_clone_max_text_tokens", "text tokens per chunk of a long "
                                                            "text, 1-250"))
    p.add_argument("--max-new-rows", type=positive_int, default=None,
                   help=_who("max_new_rows", "cap of generated rows (frames plus the staircase)"))
    p.add_argument("--n-vq", type=positive_int, default=None,
                   help=_who("n_vq", "codebooks to generate and decode, 1-32 (variable bitrate; "
                                     "default all)"))
    _add_runtime_flags(p)
