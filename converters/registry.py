"""What the converters share: running a family's converter (its row in
moss_tts.models.registry names the module), the family-only `convert` flags, and the finish
step (unused checkpoint keys, `--strict`, shape checks, atomic write)."""

from __future__ import annotations

import importlib
import inspect
from pathlib import Path

from moss_tts.errors import ConfigError
from moss_tts.models.registry import CONVERTIBLE, Family, family

# `convert` flags only some families take: keyword → help. A family takes the ones its
# converter's `convert()` has as keywords (read from the signature: declared once, there), and
# each reaches it as that keyword when given.
CONVERT_FLAGS = {
    "head_type": "type of the text and audio heads (default: --outtype, but q8_0 when that is "
                 "lower: a quantized text head costs WER)",
    "embed_type": "type of the embedding tables (default f32; Local v1.5's audio tables are its "
                  "heads too)",
    "decoder_type": "type of the codec decoder's linears (default: --outtype; 'stream': q6_K for "
                    "a large decoder, the 24 kHz and v2 codecs', what a repo id converts to): "
                    "lighter decoder weights stream faster, while f32 encoder weights keep "
                    "codes equal to upstream's",
}


def converter(row: Family):
    """The converter module of a family's row."""
    return importlib.import_module(row.converter)


def convert(row: Family, *args, **kwargs) -> Path:
    """The family converter's `convert(model, out, *, outtype, strict, progress, ...)`; a
    converter shared by several checkpoints is told which one it writes."""
    if row.checkpoint:
        kwargs["checkpoint"] = row
    if args:
        check_architecture(row, args[0])
    return converter(row).convert(*args, **kwargs)


def check_architecture(row: Family, model) -> None:
    """A local checkpoint directory that is not `row`'s is refused by what it is and the
    command that converts it (naming.checked_checkpoint: a converter would fail on a missing
    field, or worse, not fail); a directory no row recognizes is left to the converter."""
    from moss_tts.errors import MossTTSError
    from moss_tts.models.registry import family_of_config

    from .checkpoint import read_config
    from .naming import checked_checkpoint

    path = Path(str(model)).expanduser()
    if not path.is_dir():
        return                  # a repo id: its converter reads it once fetched
    try:
        family_of_config(read_config(path))
    except MossTTSError:
        return
    checked_checkpoint(row, path, source=str(model))


def flags_of(row: Family) -> tuple[str, ...]:
    """The family-only flags a family's converter takes."""
    params = inspect.signature(converter(row).convert).parameters
    return tuple(key for key in CONVERT_FLAGS if key in params)


def convert_options(kind: str, given: dict) -> dict:
    """`convert`'s family-only flags set in `given` (parsed arguments by dest) as the family
    converter's keywords; a flag the family does not take is an error, not ignored."""
    out = {}
    for key in CONVERT_FLAGS:
        if given.get(key) is None:
            continue
        if key not in flags_of(family(kind)):
            takers = [f.kind for f in CONVERTIBLE.values() if key in flags_of(f)]
            raise ConfigError(f"--{key.replace('_', '-')} applies to convert "
                              f"{' / '.join(takers)} only, not {kind}")
        out[key] = given[key]
    return out


def convert_flag_help() -> dict[str, str]:
    """`convert`'s family-only flags → their help, prefixed by the families that take them."""
    return {key: "/".join(f.kind for f in CONVERTIBLE.values() if key in flags_of(f))
            + f" only: {text}" for key, text in CONVERT_FLAGS.items()}


def finish(model_dir, out, tensors: dict, unmapped: list[str], expected: dict[str, tuple],
           meta: dict, *, kind: str, version: int, type_for, strict: bool,
           progress=None) -> Path:
    """Report every checkpoint tensor not used (fail with `strict`), check each expected
    tensor is there with its declared shape (all problems in one error), then write the GGUF
    atomically with the tensors in declaration order."""
    from .checkpoint import expected_tensors, report_unmapped
    from .gguf_io import write_gguf   # the gguf package is needed only when writing

    # well-formed names the architecture has no place for are reported like any other unused
    # tensor, never dropped silently (C21)
    report_unmapped(model_dir, list(unmapped) + sorted(n for n in tensors if n not in expected),
                    strict)
    return write_gguf(out, expected_tensors(model_dir, tensors, expected), meta, kind=kind,
                      version=version, type_for=type_for, progress=progress)


def convert_checkpoint(model: str, out, *, parse_config, find_tokenizer, map_tensors,
                       tokenizer_key: str, kind: str, version: int, type_for, strict: bool,
                       progress=None, refine=None, meta: dict | None = None) -> Path:
    """The common route of a TTS converter: resolve the checkpoint, parse its config.json,
    embed its tokenizer, map its tensors lazily, then `finish`. `refine(cfg, ckpt) -> cfg`
    settles what only the tensors tell (a tied head stored once); `meta`: more GGUF keys."""
    from .checkpoint import open_checkpoint, read_config, resolve_model_dir

    model_dir = resolve_model_dir(model)
    cfg = parse_config(read_config(model_dir))
    tokenizer = find_tokenizer(model_dir)
    # closed on every way out: a failed conversion keeps no checkpoint file mapped
    with open_checkpoint(model_dir) as ckpt:
        if refine is not None:
            cfg = refine(cfg, ckpt)
        meta = cfg.to_metadata() | {tokenizer_key: tokenizer} | (meta or {})
        tensors, unmapped = map_tensors(ckpt, cfg)
        return finish(model_dir, out, tensors, unmapped, cfg.tensor_shapes(), meta, kind=kind,
                      version=version, type_for=type_for, strict=strict, progress=progress)
