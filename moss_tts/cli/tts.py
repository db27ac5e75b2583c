"""`python -m moss_tts tts` (any family, read from the model GGUF's kind) and its alias
`tts-nano` (the Nano default model; a non-Nano model is refused). Sampling flags default to
None: the family's options dataclass fills what is not given, so its defaults are written once.

`tts --live`: text read from stdin as it arrives (an LLM's output piped in) is pushed into a
live session (MOSS-TTS-Realtime) delta by delta, and its audio leaves as it is made. Follows
upstream's example_llm_stream_to_tts.py, with stdin as the LLM.
"""

from __future__ import annotations

import argparse
import codecs
import contextlib
import os
import sys
from collections.abc import Iterator
from pathlib import Path

from ..errors import InputError
from .common import (Progress, add_runtime_flags, add_sample_format, check_audio_output,
                     resolve_codec, resolve_model, say, utf8, write_audio, writing)

READ_BYTES = 4096    # --live: one read returns what the pipe holds now, up to this


def check_prompt_flags(args, family) -> None:
    """Continuation flags need a family that continues a recording."""
    if "prompt_text" not in family.keywords:
        for flag in ("prompt_text", "prompt_audio"):
            if getattr(args, flag) is not None:
                raise InputError(f"--{flag.replace('_', '-')} is not a {family.name} option: "
                                 "leave it out, or use a model of a family that takes it")


def check_sound_flag(args, family) -> None:
    """--sound (a described sound, instead of a text) needs a family that makes one; for
    another, the advice is what that family speaks instead — its text and the flags it cannot
    speak without — so that following it works (leaving --sound out alone left a voice designer
    with no text and no --instruction)."""
    from ..knobs import BY_NAME, KNOBS, families_taking
    from ..models.registry import FAMILIES

    if args.sound is None:
        return
    if "sound" not in family.keywords:
        makers = families_taking(BY_NAME["sound"], FAMILIES)
        needs = [f"{k.flag}, {k.help}" for k in KNOBS if k.keyword in family.required
                 and getattr(args, k.name) is None]
        text = ["--text"] if args.text is None and args.text_file is None else []
        give = f" and give {' and '.join(text + needs)}" if text + needs else ""
        raise InputError(
            f"--sound is not a {family.name} option: it describes a sound for "
            + " or ".join(f"{f.name} (--model {f.default_model})" for f in makers) + "; "
            + f"{family.name} speaks a text: leave out --sound{give}")
    if args.text is not None or args.text_file is not None:
        raise InputError("--sound describes the sound instead of a text: leave out "
                         f"--text{'-file' if args.text is None else ''}")


def check_reference_flags(args, family) -> None:
    """--reference / --voice need a family that clones one voice (MOSS-TTSD takes a voice per
    speaker, the voice designer and the sound maker none)."""
    if family.takes_reference:
        return
    for flag in ("reference", "voice"):
        if getattr(args, flag):
            per_speaker = "speakers" in family.keywords
            raise InputError(f"--{flag} is not a {family.name} option: "
                             + ("give each speaker's voice with --speaker N=SRC:TRANSCRIPT"
                                if per_speaker else "leave it out, or use a model of a family "
                                "that takes it"))


def knob_keywords(args, family) -> dict:
    """The knob flags given → the family's `stream` keywords (knobs.synthesis_keywords);
    the --speaker flags as the speakers list every surface gives (speakers.py)."""
    from ..knobs import KNOBS, check_required, synthesis_keywords

    given = {k.name: getattr(args, k.name) for k in KNOBS}
    given["speakers"] = speaker_list(args.speakers)
    words = synthesis_keywords(family, given, "cli")
    check_required(family, words, "cli")
    return words


def speaker_flag(text: str) -> tuple[int, dict]:
    """One `--speaker N=SRC[:TRANSCRIPT]` → (N, its speakers.py entry): SRC an audio file if
    one is there, else a stored voice; the transcript is what follows the first ':' after
    SRC (a file needs one; a stored voice brings its own unless one is given)."""
    from ..speakers import max_speakers, speaker_spec

    number, equals, rest = text.partition("=")
    if not equals or not number.strip().isdigit() or not rest:
        raise argparse.ArgumentTypeError(f"{text!r}: write N=SRC[:TRANSCRIPT] (N the speaker, "
                                         "SRC an audio file or a stored voice)")
    n = int(number)
    if not 1 <= n <= max_speakers():
        raise argparse.ArgumentTypeError(f"{text!r}: speakers are 1 to {max_speakers()} "
                                         f"([S1] … [S{max_speakers()}]), got {n}")
    src, colon, transcript = rest.partition(":")
    if Path(src).is_file():
        if not colon or not transcript.strip():
            raise argparse.ArgumentTypeError(
                f"{n}={src}: a reference file needs its transcript after ':' "
                f"(--speaker {n}={src}:\"what it says\")")
        entry = {"reference": src, "transcript": transcript}
    else:
        entry = {"voice": src, "transcript": transcript if colon else None}
    try:
        return n, speaker_spec(entry, f"{n}={src}", "reference")
    except InputError as e:
        if "voice name" in str(e):
            raise argparse.ArgumentTypeError(f"{n}={src}: no such file, and not a stored "
                                             "voice's name") from None
        raise argparse.ArgumentTypeError(str(e)) from None


def speaker_list(flags: list | None) -> list | None:
    """The --speaker flags, (N, entry) each → the speakers list (entry N-1 is speaker N, None
    where a speaker has no flag)."""
    if not flags:
        return None
    out = [None] * max(n for n, _ in flags)
    for n, entry in flags:
        if out[n - 1] is not None:
            raise InputError(f"--speaker {n} is given twice: give each speaker once")
        out[n - 1] = entry
    return out


def check_speaker_voices(specs: list | None) -> None:
    """Each --speaker naming a stored voice: stored, and with a transcript (stored with it, or
    given after ':'), before the model loads."""
    from ..voices import load_voice

    for n, spec in enumerate(specs or [], 1):
        if spec is None or "voice" not in spec:
            continue
        name = spec["voice"]
        try:
            voice = load_voice(name)[0]
        except InputError as e:
            raise InputError(f"--speaker {n}={name}: no such file, and {e}") from None
        if not (spec["transcript"] or voice.transcript):
            raise InputError(f"--speaker {n}={name}: the voice has no stored transcript: give "
                             f"it (--speaker {n}={name}:\"what it says\"), or store it with "
                             f"`voice add {name} REF.wav --transcript \"...\" --force`")


def _tts(args) -> int:
    from ..knobs import bounded_text, renamed

    # --live: stdin is read as it arrives; --sound: the sound is described instead of a text
    described = args.sound is not None and args.text is None and args.text_file is None
    text = None if args.live or described else _read_text(args)
    check_audio_output(args, stdout_ok=True)
    _check_tts_flags(args)
    model, family = resolve_model(args.model, args.quiet)
    if args.family is not None and family.kind != args.family:
        raise InputError(f"{args.model}: a {family.name} model; `{args.command}` speaks with "
                         f"{args.family} models only — use `python -m moss_tts tts`")
    cls = family.tts_class()
    if args.live:
        check_live(args, cls)
    check_prompt_flags(args, family)
    check_sound_flag(args, family)
    check_reference_flags(args, family)
    words = knob_keywords(args, family)     # every knob checked before anything loads
    bounded_text(cls, text, "cli", _text_source(args))    # and the family's bound on the text
    check_speaker_voices(words.get("speakers"))
    codec = resolve_codec(args.codec, family, args.quiet)
    try:
        return _speak(args, family, model, codec, text, words)
    except InputError as e:                 # the API names its parameters; say the flags
        raise renamed(e, "cli") from None


def _speak(args, family, model, codec, text, words) -> int:
    from ..audio import REFERENCE_MAX_SECONDS, read_audio
    from ..live import live_chunks
    from ..speakers import speakers_argument

    with family.tts_class().load(model, codec=codec, backend=args.backend,
                                 threads=args.threads) as tts:
        if words.get("speakers") is not None:
            words["speakers"] = speakers_argument(
                words["speakers"], voice=tts.voice,
                speech=lambda path: read_audio(path, max_seconds=REFERENCE_MAX_SECONDS,
                                               name=f"--speaker {path}"))
        voice = {"reference": _reference(args, tts)} if family.takes_reference else {}
        # a family whose stream reports its steps (a diffusion sampler) fills the bar with them
        bar = Progress("generating", args.quiet, unit="steps")
        if args.live:                        # --max-frames caps a turn
            session = tts.session(voice=voice["reference"], **words)
            chunks = live_chunks(session, stdin_deltas(sys.stdin.fileno()), tts.channels)
        else:   # a file is whole audio, the same as synthesize's and batch's
            given = {**voice, **_prompt(args, tts), **words}
            if family.reports_progress:
                given["progress"] = bar
            chunks = tts.stream(text, **(given if args.out == "-" else tts.whole_keywords(given)))
        with bar, contextlib.closing(chunks):
            if args.out == "-":
                _stream_to_stdout(args, chunks, tts, bar)
                return 0
            audio = _collect(chunks, tts, bar)
        write_audio(args, audio, tts.sample_rate)
        say(args, f"{args.out}: {len(audio) / tts.sample_rate:.2f} s at {tts.sample_rate} Hz, "
                   f"{'stereo' if tts.channels == 2 else 'mono'}")
    return 0


def _reference(args, tts):
    from ..audio import REFERENCE_MAX_SECONDS, read_audio

    if args.voice:
        return tts.voice(args.voice)
    if args.reference:
        return tts.encode_reference(*read_audio(args.reference, max_seconds=REFERENCE_MAX_SECONDS,
                                                name=f"--reference {args.reference}"))
    return None


def _prompt(args, tts) -> dict:
    """Continuation: the prompt audio encoded whole (it must match its transcript; one past
    PROMPT_MAX_SECONDS is refused before it is decoded), and the transcript
    (`_check_tts_flags` made sure both or neither are given)."""
    from ..audio import PROMPT_MAX_SECONDS, read_audio

    if args.prompt_audio is None:
        return {}
    audio = read_audio(args.prompt_audio, limit_seconds=PROMPT_MAX_SECONDS,
                       name=f"--prompt-audio {args.prompt_audio}")
    return {"prompt": tts.encode_reference(*audio, max_seconds=None),
            "prompt_text": args.prompt_text}


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


def _text_source(args) -> str:
    """The flag that gave the text, as an error names it."""
    if args.text_file is not None:
        return "--text-file"
    return "--text" if args.text is not None else "the text on stdin"


def _read_text(args) -> str:
    if args.text is not None:   # argv bytes that are not UTF-8 arrive as lone surrogates
        return utf8(os.fsencode(args.text), "--text")
    if args.text_file == "-":   # the usual name for stdin; read even a terminal, to Ctrl-D
        if sys.stdin is None:
            raise InputError("--text-file -: stdin is closed; pass a file name or --text")
        return utf8(sys.stdin.buffer.read(), "stdin")
    if args.text_file is not None:
        try:
            data = Path(args.text_file).read_bytes()
        except OSError as e:
            raise InputError(f"{args.text_file}: cannot read ({e.strerror})") from None
        return utf8(data, args.text_file)
    if sys.stdin is None or sys.stdin.isatty():
        raise InputError("no text: pass --text, --text-file, or pipe text on stdin (a sound "
                         "effect: --sound)")
    return utf8(sys.stdin.buffer.read(), "stdin")


def _stream_to_stdout(args, chunks, tts, bar) -> None:
    from ..audio import PcmStreamWriter

    done = 0
    with writing("-"):
        with PcmStreamWriter(sys.stdout.buffer, tts.sample_rate, tts.channels, fmt=args.format,
                             sample_format=args.sample_format) as out:
            for part in chunks:
                out.write(part)
                done += len(part)
                if len(part):       # an empty chunk: a step of a sampler that reports its own
                    bar.audio(done / tts.sample_rate)


def _collect(chunks, tts, bar):
    import numpy as np

    parts, done = [], 0
    for part in chunks:
        parts.append(part)
        done += len(part)
        if len(part):           # an empty chunk: a step of a sampler that reports its own
            bar.audio(done / tts.sample_rate)
    return np.concatenate(parts) if parts else np.zeros((0, tts.channels), np.float32)


# command → the family it is bound to (None: the GGUF's)
FAMILY_OF = {"tts": None, "tts-nano": "nano"}


def commands() -> dict[str, str]:
    from ..models.registry import BY_KIND, FAMILIES     # the rows only: no family is loaded

    names = ", ".join(f.short for f in FAMILIES)       # the rows' own: no class is imported
    return {"tts": f"text → speech with any MOSS-TTS model (the family is read from the GGUF: "
                   f"{names})",
            "tts-nano": f"text → speech with MOSS-TTS-{BY_KIND['nano'].short}"}


def add_flags(p, command: str, common) -> None:
    from ..models.registry import DEFAULT

    _add_tts_flags(p, DEFAULT)
    p.set_defaults(func=_tts, family=FAMILY_OF[command])


def _add_tts_flags(p: argparse.ArgumentParser, default) -> None:
    from ..models.registry import FAMILIES

    src = p.add_mutually_exclusive_group()
    src.add_argument("--text", help="the text to speak (or --text-file, or stdin)")
    src.add_argument("--text-file", help="read the text from this UTF-8 file (- for stdin)")
    p.add_argument("--model", default=default.default_model, help="model GGUF (any family), "
                   "published MOSS-TTS-GGUF directory, checkpoint directory or Hugging Face repo "
                   f"id (default {default.default_model}; converted once into the cache)")
    p.add_argument("--codec", default=None, help="codec GGUF, checkpoint directory or repo id "
                   "(default: the family's — " + "; ".join(
                       f"{f.short}: {f.default_codec or 'none, its own VAE'}" for f in FAMILIES)
                   + ")")
    voice = p.add_mutually_exclusive_group()
    voice.add_argument("--reference", "--prompt-speech", dest="reference",
                       help="reference speech to clone (WAV/FLAC)")
    voice.add_argument("--voice", help="a stored voice (python -m moss_tts voice add ...)")
    continuing = ", ".join(f.short for f in FAMILIES if "prompt_text" in f.keywords)
    p.add_argument("--prompt-text", help=f"{continuing}: continuation: the transcript of "
                                          "--prompt-audio")
    p.add_argument("--prompt-audio", help=f"{continuing}: continuation: speech the output "
                                           "continues")
    p.add_argument("--live", action="store_true",
                   help="Realtime: speak stdin's text as it arrives (pipe an LLM's output in); "
                        "the audio leaves as it is made")
    p.add_argument("--out", "-o", required=True,
                   help="output .wav/.flac, or - to stream WAV (or --format raw) to stdout")
    p.add_argument("--format", choices=["wav", "raw"], default="wav",
                   help="stdout format: WAV with a streaming header, or raw interleaved samples")
    add_sample_format(p)
    add_knob_flags(p, FAMILIES)
    add_runtime_flags(p)


def add_knob_flags(p: argparse.ArgumentParser, families) -> None:
    """One flag per knob (knobs.KNOBS), default None (the family fills what is not given), its
    help naming the families that take it where not all do, and their defaults."""
    from ..knobs import KNOBS, families_taking, family_defaults

    for knob in KNOBS:
        takers = families_taking(knob, families)
        who = "" if len(takers) == len(families) else \
            ", ".join(f.short for f in takers) + ": "
        defaults = family_defaults(knob, families)
        text = who + knob.help + (f" (default: {defaults})" if defaults else "")
        flags = [knob.flag, *("--" + a.replace("_", "-") for a in knob.aliases)]
        if knob.kind is list:       # one item a flag, repeated (each parsed by the CLI's form)
            p.add_argument(*flags, dest=knob.name, type=_list_item_type(knob), action="append",
                           metavar="N=SRC[:TRANSCRIPT]", default=None, help=text)
        elif knob.kind is bool:
            p.add_argument(*flags, dest=knob.name, action="store_true", default=None, help=text)
        else:
            p.add_argument(*flags, dest=knob.name, type=knob_type(knob), default=None,
                           help=text)


def knob_type(knob):
    """argparse `type=` for a knob: its parse, the message without the flag (argparse names it)."""
    from ..knobs import parse

    def typed(text: str):
        try:
            return parse(knob, text, "cli")
        except InputError as e:
            raise argparse.ArgumentTypeError(str(e).removeprefix(knob.flag + " ")) from None

    typed.__name__ = knob.name      # argparse says "invalid <name> value" for other errors
    return typed


def _list_item_type(knob):
    """argparse `type=` for one item of a list knob, in the CLI's own form."""
    typed = {"speakers": speaker_flag}[knob.name]
    typed.__name__ = knob.cli        # argparse says "invalid <name> value" for other errors
    return typed


def check_live(args, cls) -> None:
    """--live needs a family with live sessions, and stdin for its text."""
    if not cls.LIVE:
        raise InputError(f"--live needs a MOSS-TTS-Realtime model; {args.model} is a "
                         f"{cls.NAME} one: leave out --live")
    if args.text is not None or args.text_file is not None:
        raise InputError("--live reads the text from stdin as it arrives: leave out "
                         "--text/--text-file and pipe the text in")


def stdin_deltas(fd: int) -> Iterator[str]:
    """The text on `fd` as it arrives: each read returns what is there without waiting for more,
    decoded as UTF-8 across read boundaries. Only a count of the bytes read is kept (a pipe from
    a language model may never end), which with the decoder's unfinished character is enough to
    name a bad byte by its offset in the whole input."""
    decoder = codecs.getincrementaldecoder("utf-8")()
    read = 0
    while data := os.read(fd, READ_BYTES):
        pending = decoder.getstate()[0]     # an unfinished character's first bytes, read before
        try:
            text = decoder.decode(data)
        except UnicodeDecodeError:
            utf8(pending + data, "stdin", offset=read - len(pending))
            raise
        read += len(data)
        if text:
            yield text
    pending = decoder.getstate()[0]
    try:
        decoder.decode(b"", final=True)
    except UnicodeDecodeError:
        utf8(pending, "stdin", offset=read - len(pending))
        raise
