"""`python -m moss_tts voice add | list | remove`: reference voices encoded once and stored
under a name."""

from __future__ import annotations

from .common import positive_int, printing, resolve, say, writing


def _voice(args) -> int:
    from ..voices import add_voice, codec_info, list_voices, remove_voice, voices_dir

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
    from ..audio import REFERENCE_MAX_SECONDS, read_audio
    from ..codec import Codec

    samples, sr = read_audio(args.reference, max_seconds=REFERENCE_MAX_SECONDS)
    with Codec.load(resolve(args.codec, "codec", "--codec"), threads=args.threads) as codec:
        codes = codec.encode(samples, sr)
        info = {"source": str(args.reference)} | codec_info(codec)
    with writing(str(voices_dir())):
        stored = add_voice(args.name, codes.T, info, overwrite=args.force)
    say(args, f"voice {args.name}: {codes.shape[1]} frames from {args.reference}, stored in "
               f"{stored.parent}")
    return 0


def _voice_codec(info: dict) -> str:
    """The codec a stored voice was encoded with: a model takes voices of its own codec only."""
    if "variant" not in info:   # stored before voices recorded their codec
        return "codec unknown"
    return f"{info['variant']} codec, {info.get('sample_rate', '?')} Hz"


def add_parser(sub, common) -> None:
    from ..models.registry import DEFAULT
    from ..voices import voices_dir

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
