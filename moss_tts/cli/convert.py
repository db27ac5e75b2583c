"""`python -m moss_tts convert`: a Hugging Face checkpoint → GGUF, by the family's converter
(the registry names it)."""

from __future__ import annotations

from .common import Progress, check_output, say, writing


def _convert(args) -> int:
    from converters.registry import convert, convert_options

    from ..models.registry import family

    row = family(args.family)
    options = convert_options(args.family, vars(args))
    check_output(args.out, (".gguf",))
    with Progress("writing", args.quiet, "tensors") as bar, writing(args.out):
        out = convert(row, args.model, args.out, outtype=args.outtype, strict=args.strict,
                      progress=lambda i, n, name: bar(i, n), **options)
    say(args, f"{out}: written ({out.stat().st_size / 2**20:.1f} MiB, {args.outtype})")
    return 0


def commands() -> dict[str, str]:
    return {"convert": "Hugging Face checkpoint → GGUF"}


def add_flags(p, command: str, common) -> None:
    from converters.registry import convert_flag_help

    from ..models.registry import CONVERTIBLE

    p.add_argument("family", choices=list(CONVERTIBLE),
                   help="; ".join(f"{k}: {f.name}" for k, f in CONVERTIBLE.items()))
    p.add_argument("--model", required=True, help="checkpoint directory or Hugging Face repo id")
    p.add_argument("--out", "-o", required=True, help="output .gguf")
    p.add_argument("--outtype", default="f32",
                   help="matmul weight type: f32 (default), f16, bf16, q8_0, q4_K, ...")
    for key, text in convert_flag_help().items():
        p.add_argument("--" + key.replace("_", "-"), help=text)
    p.add_argument("--strict", action="store_true", help="fail on any checkpoint tensor not used")
    p.add_argument("--quiet", action="store_true", help="no progress on stderr")
    p.set_defaults(func=_convert)
