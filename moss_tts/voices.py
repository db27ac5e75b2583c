"""Stored voices: a reference's codec codes, encoded once (`voice add`), reused by name."""

from __future__ import annotations

import json
import os
import re
import zipfile
from pathlib import Path

import numpy as np

from .errors import InputError, VoiceError
from .fileio import atomic_output
from .reference import Reference, codec_info, codec_problem  # noqa: F401 (what voices record)

NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")   # matched whole (check_name)
SUFFIX = ".voice.npz"  # codes and info in one file, so one rename stores a voice whole


def voices_dir() -> Path:
    root = os.environ.get("MOSS_TTS_VOICES") or os.path.join(
        os.environ.get("XDG_DATA_HOME") or os.path.expanduser("~/.local/share"), "moss-tts", "voices")
    return Path(root)


def check_name(name) -> str:
    """A voice name, or InputError: the whole string must match (a trailing newline would pass
    `re.match` with `$`), and null or a number is not a name."""
    if not isinstance(name, str) or not NAME.fullmatch(name) or name.endswith((".npy", ".json")):
        raise InputError(f"voice name {name!r} must be 1-64 letters, digits, '_', '-' or '.', "
                         "starting with a letter or digit")
    return name


def _paths(name: str, root: Path | None) -> tuple[Path, Path]:
    check_name(name)
    root = Path(root) if root else voices_dir()
    return root / f"{name}{SUFFIX}", root / f"{name}.npy"


def add_voice(name: str, codes: np.ndarray, info: dict, *, root: Path | None = None,
              overwrite: bool = False) -> Path:
    """Store codes [frames, n_vq] and `info` (sample rate, codebooks, source) under `name`.

    Codes and info are one file, replaced in one rename: concurrent writers of a name leave
    one writer's codes with that writer's info, never a mix."""
    path, legacy = _paths(name, root)
    if (path.exists() or legacy.exists()) and not overwrite:
        raise InputError(f"voice {name!r} exists; remove it first (or pass --force)")
    codes = np.asarray(codes, dtype=np.int32)
    if codes.ndim != 2 or codes.shape[0] == 0:
        raise InputError(f"voice codes must be [frames, n_vq], got {codes.shape}")
    info = dict(info, frames=int(codes.shape[0]), n_vq=int(codes.shape[1]))
    with atomic_output(path) as tmp, open(tmp, "wb") as f:
        np.savez(f, codes=codes, info=np.array(json.dumps(info, sort_keys=True)))
    _remove_legacy(legacy)
    return path


def load_voice(name: str, *, root: Path | None = None) -> tuple[Reference, dict]:
    """A stored voice as (Reference, info): the Reference carries all its codes [frames, the
    codec's codebooks] and the codec that made them, so any model can refuse a voice of another
    codec by name (`tts.voice(name)` is this, fitted to the model)."""
    codes, info = _stored(name, root)   # info holds codec_info's keys (older voices: none)
    return Reference(codes, info if "variant" in info else None, name,
                     info.get("transcript")), info


def _stored(name: str, root: Path | None) -> tuple[np.ndarray, dict]:
    path, legacy = _paths(name, root)
    try:
        if path.exists():
            return _read(path)
        if legacy.exists():
            return _read_legacy(legacy)
    except (OSError, ValueError, KeyError, zipfile.BadZipFile) as e:
        raise VoiceError(name, f"voice {name!r} is unreadable ({str(e).splitlines()[0]})",
                         "add it again with `python -m moss_tts voice add NAME REF.wav "
                         "--force`") from None
    known = ", ".join(v["name"] for v in list_voices(root)) or "none"
    raise InputError(f"no voice named {name!r} (known: {known}); add one with "
                     "`python -m moss_tts voice add NAME REF.wav`")


def list_voices(root: Path | None = None) -> list[dict]:
    root = Path(root) if root else voices_dir()
    if not root.is_dir():
        return []
    names = {name for p in root.iterdir() if (name := voice_of(p.name)) is not None}
    return [{"name": name, **voice_info(name, root)} for name in sorted(names)]


def voice_of(file_name: str) -> str | None:
    """The voice that a file of the voices directory stores (NAME.voice.npz, or an older
    NAME.npy), or None for any other file (a hidden `.….partial` being written, NAME.json)."""
    if file_name.startswith("."):
        return None
    if file_name.endswith(SUFFIX):
        return file_name[: -len(SUFFIX)]
    return file_name[: -len(".npy")] if file_name.endswith(".npy") else None


def voice_info(name: str, root: Path | None = None) -> dict:
    """What `add_voice` recorded of a stored voice (codec, frames, source), read without its
    codes; {} for a bad name or a damaged file, which a listing shows without details."""
    try:
        path, legacy = _paths(name, root)
        if path.exists():
            with np.load(path, allow_pickle=False) as z:   # an npz reads members on demand
                return json.loads(str(z["info"]))
        info_path = legacy.with_suffix(".json")
        return json.loads(info_path.read_text()) if info_path.exists() else {}
    except (InputError, OSError, ValueError, KeyError, zipfile.BadZipFile):
        return {}


def remove_voice(name: str, *, root: Path | None = None) -> None:
    path, legacy = _paths(name, root)
    if not (path.exists() or legacy.exists()):
        raise InputError(f"no voice named {name!r}")
    path.unlink(missing_ok=True)
    _remove_legacy(legacy)


def _read(path: Path) -> tuple[np.ndarray, dict]:
    with np.load(path, allow_pickle=False) as z:
        return z["codes"], json.loads(str(z["info"]))


def _read_legacy(codes_path: Path) -> tuple[np.ndarray, dict]:
    """Voices stored before SUFFIX: codes in NAME.npy, info in NAME.json."""
    info_path = codes_path.with_suffix(".json")
    info = json.loads(info_path.read_text()) if info_path.exists() else {}
    return np.load(codes_path, allow_pickle=False), info


def _remove_legacy(codes_path: Path) -> None:
    codes_path.unlink(missing_ok=True)
    codes_path.with_suffix(".json").unlink(missing_ok=True)
