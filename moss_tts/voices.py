"""Stored voices: a reference's codec codes, encoded once (`voice add`), reused by name."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import numpy as np

from .codec.io import save_codes
from .errors import InputError

NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")


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
    return root / f"{name}.npy", root / f"{name}.json"


def add_voice(name: str, codes: np.ndarray, info: dict, *, root: Path | None = None,
              overwrite: bool = False) -> Path:
    """Store codes [frames, n_vq] and `info` (sample rate, codebooks, source) under `name`."""
    codes_path, info_path = _paths(name, root)
    if codes_path.exists() and not overwrite:
        raise InputError(f"voice {name!r} exists; remove it first (or pass --force)")
    codes = np.asarray(codes, dtype=np.int32)
    if codes.ndim != 2 or codes.shape[0] == 0:
        raise InputError(f"voice codes must be [frames, n_vq], got {codes.shape}")
    info = dict(info, frames=int(codes.shape[0]), n_vq=int(codes.shape[1]))
    save_codes(codes_path, codes)
    tmp = info_path.with_suffix(".json.partial")
    tmp.write_text(json.dumps(info, indent=1, sort_keys=True))
    os.replace(tmp, info_path)
    return codes_path


def load_voice(name: str, *, root: Path | None = None) -> tuple[np.ndarray, dict]:
    codes_path, info_path = _paths(name, root)
    if not codes_path.exists():
        known = ", ".join(v["name"] for v in list_voices(root)) or "none"
        raise InputError(f"no voice named {name!r} (known: {known}); add one with "
                         "`python -m moss_tts voice add NAME REF.wav`")
    info = json.loads(info_path.read_text()) if info_path.exists() else {}
    return np.load(codes_path, allow_pickle=False), info


def list_voices(root: Path | None = None) -> list[dict]:
    root = Path(root) if root else voices_dir()
    out = []
    for p in sorted(root.glob("*.npy")) if root.is_dir() else []:
        info_path = p.with_suffix(".json")
        info = json.loads(info_path.read_text()) if info_path.exists() else {}
        out.append({"name": p.stem, **info})
    return out


def remove_voice(name: str, *, root: Path | None = None) -> None:
    codes_path, info_path = _paths(name, root)
    if not codes_path.exists():
        raise InputError(f"no voice named {name!r}")
    codes_path.unlink()
    info_path.unlink(missing_ok=True)
