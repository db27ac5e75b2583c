"""A model argument is a GGUF path or a Hugging Face repo id; a repo id is downloaded (through
huggingface_hub) and converted once into the cache, then reused."""

from __future__ import annotations

import logging
import os
import re
from pathlib import Path

from .errors import InputError, ModelFileError

logger = logging.getLogger(__name__)

DEFAULT_NANO = "OpenMOSS-Team/MOSS-TTS-Nano"
DEFAULT_NANO_CODEC = "OpenMOSS-Team/MOSS-Audio-Tokenizer-Nano"
_REPO_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")


def cache_dir() -> Path:
    root = os.environ.get("MOSS_TTS_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "moss-tts")
    return Path(root)


def resolve_gguf(spec: str, family: str, *, outtype: str = "f32", progress=None) -> Path:
    """`spec` → a GGUF path. family: "nano" or "codec" (which converter a repo id needs)."""
    path = Path(spec).expanduser()
    if path.is_file():
        return path
    if path.is_dir():
        return _convert(str(path), family, outtype, progress,
                        cache_dir() / "gguf" / f"{path.resolve().name}-{family}-{outtype}.gguf")
    if not _REPO_ID.match(spec):
        raise InputError(f"{spec}: no such file, and not a Hugging Face repo id (owner/name)")
    target = cache_dir() / "gguf" / f"{spec.replace('/', '--')}-{outtype}.gguf"
    if target.is_file():
        return target
    return _convert(spec, family, outtype, progress, target)


def _convert(source: str, family: str, outtype: str, progress, target: Path) -> Path:
    if family == "nano":
        from converters.nano import convert
    elif family == "codec":
        from converters.codec import convert
    else:
        raise ModelFileError(f"unknown model family {family!r}")
    logger.info("converting %s to %s", source, target)
    return convert(source, target, outtype=outtype, progress=progress)
