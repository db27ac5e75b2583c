"""A model argument is a GGUF path or a Hugging Face repo id; a repo id is downloaded (through
huggingface_hub) and converted once into the cache, then reused."""

from __future__ import annotations

import logging
import os
import re
from pathlib import Path

from .errors import InputError, ModelFileError

logger = logging.getLogger(__name__)

_REPO_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")


def cache_dir() -> Path:
    root = os.environ.get("MOSS_TTS_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "moss-tts")
    return Path(root)


def resolve_gguf(spec: str, family: str, *, outtype: str | None = None, progress=None) -> Path:
    """`spec` → a GGUF path. family: which converter a repo id or checkpoint directory needs —
    "codec", a TTS family, or "model": any TTS family, read from its config.json. outtype:
    the family's default (f32; q6_K for the 8B Delay and the 4B Local v1.5) unless given."""
    path = Path(spec).expanduser()
    if path.is_file():
        return path
    if path.is_dir():
        family = _family(str(path), family)
        outtype = outtype or _outtype(family)
        return _convert(str(path), family, outtype, progress,
                        cache_dir() / "gguf" /
                        f"{path.resolve().name}-{family}-{_label(family, outtype)}.gguf")
    if not _REPO_ID.match(spec):
        raise InputError(f"{spec}: no such file, and not a Hugging Face repo id (owner/name)")
    # a conversion made before: no hub call to find the family again
    for made in ([_label(family, outtype)] if outtype else _labels(family)):
        if _repo_target(spec, made).is_file():
            return _repo_target(spec, made)
    family = _family(spec, family)
    outtype = outtype or _outtype(family)
    target = _repo_target(spec, _label(family, outtype))
    return target if target.is_file() else _convert(spec, family, outtype, progress, target)


def _repo_target(spec: str, label: str) -> Path:
    return cache_dir() / "gguf" / f"{spec.replace('/', '--')}-{label}.gguf"


def _label(family: str, outtype: str) -> str:
    """How a conversion's file is named: its type, and its row's other converter keywords."""
    from .models.registry import family as row

    options = () if family == "model" else row(family).hub_options
    return "-".join([outtype, *(f"{key.split('_')[0]}-{value}" for key, value in options)])


def _labels(family: str) -> list[str]:
    from .models.registry import FAMILIES

    return [_label(family, _outtype(family))] if family != "model" else \
        sorted({_label(f.kind, f.hub_outtype) for f in FAMILIES})


def _outtype(family: str) -> str:
    from .models.registry import family as row

    return row(family).hub_outtype


def _family(source: str, family: str) -> str:
    """"model" → the TTS family its config.json names, and for an architecture with several
    published checkpoints, which one (its name, its model card's title, its shape); only the
    JSON and Markdown files are fetched."""
    if family != "model":
        return family
    from converters.checkpoint import resolve_model_dir
    from converters.naming import family_of_checkpoint

    found = family_of_checkpoint(resolve_model_dir(source, allow_patterns=("*.json", "*.md")),
                                 source=source).kind
    if found == "codec":
        raise ModelFileError(f"{source} is an audio codec checkpoint, not a speech model: pass "
                             "it as --codec")
    return found


def _convert(source: str, family: str, outtype: str, progress, target: Path) -> Path:
    from converters.registry import convert

    from .models.registry import family as row

    logger.info("converting %s (%s) to %s", source, family, target)
    return convert(row(family), source, target, outtype=outtype, progress=progress,
                   **dict(row(family).hub_options))
