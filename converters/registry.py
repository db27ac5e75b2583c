"""`python -m moss_tts convert <family>`: the one registry of converters, and the finish step
they share (unused checkpoint keys, `--strict`, shape checks, atomic write)."""

from __future__ import annotations

import importlib
from pathlib import Path

from moss_tts.errors import ConfigError, ModelFileError

# family → (module with `convert(model, out, *, outtype, strict, progress)`, what it converts)
FAMILIES = {
    "codec": ("converters.codec", "a MOSS-Audio-Tokenizer"),
    "nano": ("converters.nano", "MOSS-TTS-Nano"),
    "delay": ("converters.delay", "MOSS-TTS / MOSS-TTS-v1.5 (MossTTSDelay)"),
    "local": ("converters.local", "MOSS-TTS-Local-Transformer (MossTTSLocal, 1.7B)"),
    "local-v15": ("converters.local_v15", "MOSS-TTS-Local-Transformer-v1.5 (4B)"),
    "realtime": ("converters.realtime", "MOSS-TTS-Realtime (MossTTSRealtime)"),
}
# what a repo id or checkpoint directory given as a model converts to when no type is asked
# for: exact f32 where it fits in memory; the 8B MOSS-TTS and the 4B Local v1.5 at q6_K (heads
# q8_0, P21). q6_K, not q8_0: on x86 ggml multiplies K-quants with int8 dot products, so q6_K
# prefills 2.6x faster than q8_0 (which is slower than f32 there) and steps 1.2x faster from
# 0.77x the bytes (the 8B, bench/delay.py; README "Weight types and speed"), at +0.0008
# against q8_0's +0.0004 perplexity on LLaMA-7B (llama.cpp's quantize table)
HUB_OUTTYPE = {"delay": "q6_K", "local-v15": "q6_K"}
# `convert` flags only some families take: flag → (families, help). Each reaches the family's
# `convert()` as the keyword of the same name (--head-type → head_type) when given.
FAMILY_FLAGS = {
    "--head-type": (("delay", "local", "realtime"), "type of the text and audio heads (default: "
                                            "--outtype, but q8_0 when that is lower: a quantized "
                                            "text head costs WER)"),
    "--embed-type": (("delay", "local", "local-v15", "realtime"),
                     "type of the embedding tables (default f32; Local v1.5's audio tables are "
                     "its heads too)"),
}


def family_of(config: dict) -> str:
    """The family a checkpoint's config.json holds, for converting a repo id or directory
    given where any model may come. Structure first: V2 (Local) says `moss_tts_delay` too (P26)."""
    kind, keys = config.get("model_type"), set(config)
    if kind == "moss_tts_nano":
        return "nano"
    if "gpt2_config" in keys or kind == "moss_tts_local":
        return "local-v15"
    if "local_num_layers" in keys:
        return "local"
    if kind == "moss_tts_delay":
        return "delay"
    if kind == "moss_tts_realtime":
        return "realtime"
    if kind in ("moss-audio-tokenizer", "speech_tokenizer") or "encoder_kwargs" in keys:
        return "codec"
    raise ConfigError(f"model_type {kind!r}: not a checkpoint of a family this version converts "
                      f"({', '.join(FAMILIES)})")


def converter(family: str):
    """The `convert` function of a family."""
    try:
        module, _ = FAMILIES[family]
    except KeyError:
        raise ModelFileError(f"unknown model family {family!r}; known: "
                             f"{', '.join(FAMILIES)}") from None
    return importlib.import_module(module).convert


def family_options(family: str, given: dict) -> dict:
    """The family flags set in `given` (parsed arguments by dest) as `convert()` keywords; a
    flag the family does not take is an error, not ignored."""
    out = {}
    for flag, (families, _) in FAMILY_FLAGS.items():
        key = flag.removeprefix("--").replace("-", "_")
        if given.get(key) is None:
            continue
        if family not in families:
            raise ConfigError(f"{flag} applies to convert {' / '.join(families)} only, not "
                              f"{family}")
        out[key] = given[key]
    return out


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
                       progress=None, refine=None) -> Path:
    """The common route of a TTS converter: resolve the checkpoint, parse its config.json,
    embed its tokenizer, map its tensors lazily, then `finish`. `refine(cfg, ckpt) -> cfg`
    settles what only the tensors tell (a tied head stored once)."""
    from .checkpoint import open_checkpoint, read_config, resolve_model_dir

    model_dir = resolve_model_dir(model)
    cfg = parse_config(read_config(model_dir))
    tokenizer = find_tokenizer(model_dir)
    # closed on every way out: a failed conversion keeps no checkpoint file mapped
    with open_checkpoint(model_dir) as ckpt:
        if refine is not None:
            cfg = refine(cfg, ckpt)
        meta = cfg.to_metadata() | {tokenizer_key: tokenizer}
        tensors, unmapped = map_tensors(ckpt, cfg)
        return finish(model_dir, out, tensors, unmapped, cfg.tensor_shapes(), meta, kind=kind,
                      version=version, type_for=type_for, strict=strict, progress=progress)
