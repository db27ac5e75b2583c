"""`python -m moss_tts voice add | list | remove`: reference voices encoded once and stored
under a name — from a recording, or designed from a description by a voice-design model
(MOSS-VoiceGenerator), with the transcript MOSS-TTSD needs of a speaker's voice."""

from __future__ import annotations

import os

from ..errors import InputError
from ..knobs import MAX_PROMPT_CHARS
from .common import add_runtime_flags, printing, resolve, resolve_model, say, utf8, writing

# what a designed voice says: a few seconds of ordinary speech with most English sounds, as a
# reference should be (upstream suggests 5-15 s); its transcript is stored with it
SAMPLE_TEXT = ("The quick brown fox jumps over the lazy dog, while the morning light falls "
               "softly across the quiet street.")


def _voice(args) -> int:
    from ..voices import list_voices, remove_voice, voices_dir

    if args.voice_command == "list":
        voices = list_voices()
        say(args, f"{len(voices)} voice(s) in {voices_dir()} (set MOSS_TTS_VOICES to move them)")
        with printing():
            for v in voices:
                print(f"{v['name']}\t{v.get('frames', '?')} frames\t{_voice_codec(v)}\t"
                      f"{v.get('source', '')}")
        return 0
    if args.voice_command == "remove":
        remove_voice(args.name)
        say(args, f"removed voice {args.name}")
        return 0
    return _add(args)


def _add(args) -> int:
    from ..voices import check_name

    check_name(args.name)
    transcript = None if args.transcript is None else _transcript(args.transcript)
    if (args.reference is None) == (args.from_description is None):
        raise InputError("voice add takes a reference recording (REF.wav) or --from-description"
                         " \"...\" with --model: give one")
    if args.from_description is None:
        for flag in ("model", "text", "seed", "max_new_rows"):
            if getattr(args, flag) is not None:
                raise InputError(f"--{flag.replace('_', '-')} is for --from-description (a designed voice): leave "
                                 "it out with a recording")
        return _add_recording(args, transcript)
    if transcript is not None:
        raise InputError("--transcript is the sample's text with --from-description: give it "
                         "as --text")
    if not args.from_description.strip() or len(args.from_description) > MAX_PROMPT_CHARS:
        raise InputError(f"--from-description must describe the voice in 1 to "
                         f"{MAX_PROMPT_CHARS} characters, e.g. \"a calm, low female voice\"")
    return _add_designed(args)


def _transcript(text: str) -> str:
    from ..speakers import MAX_TRANSCRIPT_CHARS

    text = utf8(os.fsencode(text), "--transcript")
    if not text.strip() or len(text) > MAX_TRANSCRIPT_CHARS:
        raise InputError(f"--transcript must be the words the recording says (1 to "
                         f"{MAX_TRANSCRIPT_CHARS} characters), got {len(text.strip())}")
    return text


def _add_recording(args, transcript: str | None) -> int:
    from ..audio import REFERENCE_MAX_SECONDS, read_audio
    from ..codec import Codec
    from ..models.registry import DEFAULT
    from ..voices import codec_info

    samples, sr = read_audio(args.reference, max_seconds=REFERENCE_MAX_SECONDS)
    codec_spec = args.codec or DEFAULT.default_codec
    with Codec.load(resolve(codec_spec, "codec", "--codec"), backend=args.backend,
                    threads=args.threads) as codec:
        codes = codec.encode(samples, sr)
        info = {"source": str(args.reference)} | codec_info(codec)
    if transcript is not None:       # MOSS-TTSD continues from a speaker's words
        info["transcript"] = transcript
    stored = _store(args, codes.T, info)
    say(args, f"voice {args.name}: {codes.shape[1]} frames from {args.reference}, stored in "
               f"{stored.parent}")
    return 0


def _add_designed(args) -> int:
    """A sample spoken in the described voice by a voice-design model, encoded by that model's
    codec at all its codebooks (so a model using more than the designer's can take it), and
    stored with the sample's text as its transcript and the description as its source."""
    import numpy as np

    from ..knobs import synthesis_keywords
    from ..models.registry import FAMILIES
    from ..voices import codec_info
    from .common import Progress

    designers = [f for f in FAMILIES if "instruction" in f.required]
    model, family = resolve_model(args.model or designers[0].default_model, args.quiet)
    if family not in designers:
        raise InputError(f"--from-description needs a voice-design model "
                         f"({', '.join(f.name for f in designers)}); {args.model} is a "
                         f"{family.name} one")
    text = SAMPLE_TEXT if args.text is None else utf8(os.fsencode(args.text), "--text")
    words = synthesis_keywords(family, {"instruction": args.from_description, "seed": args.seed,
                                        "max_new_rows": args.max_new_rows}, "cli")
    codec_spec = resolve(args.codec or family.default_codec, "codec", "--codec", args.quiet)
    with family.tts_class().load(model, codec=codec_spec, backend=args.backend,
                                 threads=args.threads) as tts:
        parts, sr = [], tts.sample_rate
        with Progress("designing", args.quiet) as bar:
            for part in tts.stream(text, **words):
                parts.append(part)
                bar.audio(sum(map(len, parts)) / sr)
        audio = np.concatenate(parts)
        codes = tts.codec.encode(audio, sr, n_quantizers=tts.codec.n_quantizers)
        info = {"source": f"described: {args.from_description}", "model": str(args.model),
                "transcript": text} | codec_info(tts.codec)
    stored = _store(args, codes.T, info)
    say(args, f"voice {args.name}: {codes.shape[1]} frames ({len(audio) / sr:.1f} s) designed "
               f"by {family.name} from {args.from_description!r}, stored in {stored.parent}")
    return 0


def _store(args, codes, info: dict):
    from ..voices import add_voice, voices_dir

    with writing(str(voices_dir())):
        return add_voice(args.name, codes, info, overwrite=args.force)


def _voice_codec(info: dict) -> str:
    """The codec a stored voice was encoded with: a model takes voices of its own codec only."""
    if "variant" not in info:   # stored before voices recorded their codec
        return "codec unknown"
    return f"{info['variant']} codec, {info.get('sample_rate', '?')} Hz"


def commands() -> dict[str, str]:
    return {"voice": "store, list and remove reference voices"}


def add_flags(p, command: str, common) -> None:
    from ..knobs import BY_NAME
    from ..models.registry import DEFAULT
    from ..voices import voices_dir
    from .tts import knob_type

    p.description = (f"Voices are stored in {voices_dir()} ($MOSS_TTS_VOICES, default "
                     "$XDG_DATA_HOME/moss-tts/voices).")
    vs = p.add_subparsers(dest="voice_command", required=True, metavar="ACTION")
    a = vs.add_parser("add", help="encode a reference (or a voice designed from a description) "
                                  "once and store it under a name", parents=[common])
    a.add_argument("name")
    a.add_argument("reference", nargs="?", help="reference speech (WAV/FLAC)")
    a.add_argument("--transcript", help="what the reference says, stored with it (MOSS-TTSD "
                                        "needs it of each speaker's voice)")
    a.add_argument("--from-description", metavar="DESCRIPTION",
                   help="design the voice instead: a voice-design model (--model) speaks --text "
                        "in the described voice, e.g. \"a calm, low female voice\"")
    a.add_argument("--model", help="with --from-description: the voice-design model (GGUF, "
                                    "checkpoint directory or repo id; default: the "
                                    "voice-design family's)")
    a.add_argument("--text", help="with --from-description: what the sample says, stored as "
                                  f"its transcript (default: {SAMPLE_TEXT!r})")
    for name, text in (("seed", "the sample's random seed (default: unseeded)"),
                       ("max_new_rows", "the sample's cap of generated rows (default: the "
                                        "model's)")):
        knob = BY_NAME[name]
        a.add_argument(knob.flag, dest=name, type=knob_type(knob), default=None,
                       help=f"with --from-description: {text}")
    a.add_argument("--codec", default=None,
                   help="codec GGUF, checkpoint directory or repo id (default: "
                        f"{DEFAULT.default_codec}; with --from-description the model's family's)")
    a.add_argument("--force", action="store_true", help="replace an existing voice")
    add_runtime_flags(a)
    lst = vs.add_parser("list", help="list stored voices (and where they are)", parents=[common])
    lst.add_argument("--quiet", action="store_true")
    r = vs.add_parser("remove", help="delete a stored voice", parents=[common])
    r.add_argument("name")
    r.add_argument("--quiet", action="store_true")
    p.set_defaults(func=_voice)
