"""Which checkpoint a directory is, by the rows of moss_tts.models.registry: its architecture
from config.json, then which of that architecture's published checkpoints (MOSS-TTSD,
MOSS-VoiceGenerator, MOSS-SoundEffect on MossTTSDelay) from the names it goes by or its shape
(docs/upstream-notes.md §family-9). Naming checkpoints is the converters' business: the
run-time registry reads GGUFs, which record what they are."""

from __future__ import annotations

from pathlib import Path

from moss_tts.errors import ConfigError
from moss_tts.models.registry import BY_KIND, Family, checkpoints_of, family_of_config

from .checkpoint import read_config


def family_of_checkpoint(model_dir, *, source: str | None = None) -> Family:
    """The row of a checkpoint directory (`checkpoint_candidates`); where only a name could
    tell (MOSS-TTSD or MOSS-SoundEffect) an error says how to name it."""
    rows, why = checkpoint_candidates(model_dir, source=source)
    if len(rows) > 1:
        raise ConfigError(f"{model_dir}: a MossTTSDelay checkpoint with {why} is MOSS-TTSD or "
                          "MOSS-SoundEffect, and nothing names which: convert it with "
                          "`python -m moss_tts convert ttsd` (or `sfx`)")
    return rows[0]


def checkpoint_candidates(model_dir, *, source: str | None = None) -> tuple[list[Family], str]:
    """The rows a checkpoint directory may be, and what told: its architecture from
    config.json, then which of that architecture's published checkpoints it is, from the names
    it goes by (config.json's `_name_or_path`, the model card's title, the repo id or directory
    it came from, nearest first), else from its shape: 16 codebooks at 2048 wide is
    MOSS-VoiceGenerator; 16 at 8B is MOSS-TTSD or MOSS-SoundEffect (two rows: only a name tells
    them apart); any other count is MOSS-TTS (docs/upstream-notes.md §family-9)."""
    model_dir = Path(model_dir)
    config = read_config(model_dir)
    base = family_of_config(config)
    rows = checkpoints_of(base)
    if len(rows) == 1:
        return [base], _told_by(config)
    names = _names_of(model_dir, config, source)
    by_name = named_checkpoint(rows, names)
    if by_name is not None:
        name = next(n for n in names if named_checkpoint(rows, [n]))
        return [by_name], "by its name" if name == source else f"named {name.lstrip('# ')!r}"
    n_vq = config.get("n_vq")
    width = (config.get("language_config") or {}).get("hidden_size", 0)
    if n_vq == 16 and width <= 2048:
        return [BY_KIND["voicegen"]], f"16 codebooks at width {width}"
    if n_vq == 16:
        return [BY_KIND["ttsd"], BY_KIND["sfx"]], f"16 codebooks at width {width}"
    return [base], f"{n_vq} codebooks, where the other published checkpoints have 16"


def checked_checkpoint(given: Family, model_dir, *, source: str | None = None) -> Family:
    """`given` (the row `convert` was asked for) when the checkpoint may be it; else a
    ConfigError saying what the checkpoint is, what told, and the command that converts it:
    converting MOSS-TTS as MOSS-TTSD would give it the wrong prompt, and the GGUF would say
    MOSS-TTSD."""
    rows, why = checkpoint_candidates(model_dir, source=source)
    if given in rows:
        return given
    command = f"`python -m moss_tts convert {rows[0].kind}`" + "".join(
        f" (or `{r.kind}`)" for r in rows[1:])
    what = " or ".join(r.checkpoint or r.name for r in rows)
    raise ConfigError(f"{source or model_dir} is {what} ({why}), not "
                      f"{given.checkpoint or given.name}: convert it with {command}")


def named_checkpoint(rows: list[Family], names: list[str]) -> Family | None:
    """The first row one of `names` (nearest first) marks, or None; a name marking the base
    (MOSS-TTS) ends the search too, so a folder above it cannot name another checkpoint."""
    for name in names:
        flat = "".join(ch for ch in name.lower() if ch.isalnum())
        for row in sorted(rows, key=lambda r: not r.arch):     # "mossttsd" before "mosstts"
            if any(mark in flat for mark in row.names):
                return row
    return None


def _names_of(model_dir: Path, config: dict, source: str | None) -> list[str]:
    names = [str(config.get("_name_or_path") or "")]
    card = model_dir / "README.md"
    if card.is_file():
        heading = next((line for line in card.read_text(errors="replace").splitlines()
                        if line.startswith("# ")), "")
        names.append(heading)
    if source:
        names.append(source)
    # a Hugging Face cache directory is models--OWNER--NAME/snapshots/HASH: the name is above
    names += [part for part in reversed(model_dir.resolve().parts)]
    return [n for n in names if n]


def _told_by(config: dict) -> str:
    """What in the directory's config named its architecture, in words."""
    if "model_type" not in config and "_class_name" in config:     # a diffusers pipeline
        return f"its model_index.json's _class_name {config['_class_name']!r}"
    return f"its config.json's model_type {config.get('model_type')!r}"
