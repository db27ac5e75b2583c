"""The results ledger of a batch output directory: `results.jsonl`, one record per finished
line, appended with one write and an fsync, so a killed run loses at most the line in flight.

A rerun reads it back: the last record of an id wins, and a line is skipped when that record
succeeded with the same key (text, voice, reference, seed, options, model and codec hashes,
format) and its audio file exists. One run at a time owns a directory (an flock on the
results file).
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
from pathlib import Path

from ..errors import InputError
from ..fileio import atomic_output
from ..hub import cache_dir
from .manifest import Line

RESULTS = "results.jsonl"


def file_sha256(path: str | os.PathLike) -> str:
    """sha256 of a file's bytes, kept in the user cache by (path, size, mtime): a rerun does
    not read a multi-GB model again; a file changed in place has a new mtime and is hashed."""
    path = Path(path).resolve()
    st = path.stat()
    stamp = {"path": str(path), "size": st.st_size, "mtime_ns": st.st_mtime_ns}
    entry = cache_dir() / "sha256" / f"{hashlib.sha256(str(path).encode()).hexdigest()[:32]}.json"
    try:
        known = json.loads(entry.read_text())
        if {k: known.get(k) for k in stamp} == stamp and isinstance(known.get("sha256"), str):
            return known["sha256"]
    except (OSError, ValueError):    # none yet, or damaged: hash again
        pass
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(1 << 22):
            h.update(block)
    try:    # a cache that cannot be written only costs the next run a re-hash
        with atomic_output(entry) as tmp:
            tmp.write_text(json.dumps({**stamp, "sha256": h.hexdigest()}))
    except OSError:
        pass
    return h.hexdigest()


def line_key(line: Line, *, model_sha256: str, codec_sha256: str, suffix: str) -> str:
    """What a line's audio depends on, hashed: a rerun redoes the line when any of it changes."""
    what = {"text": line.text, "voice": line.voice, "reference": line.reference, "seed": line.seed,
            "options": line.options, "model": model_sha256, "codec": codec_sha256, "format": suffix}
    return hashlib.sha256(json.dumps(what, sort_keys=True).encode()).hexdigest()


class Ledger:
    """`with Ledger(out_dir) as ledger:` → `done(id, key)`, `append(record)`."""

    def __init__(self, out_dir: str | os.PathLike):
        self.dir = Path(out_dir)
        self.path = self.dir / RESULTS
        self._fd = None
        try:
            self.dir.mkdir(parents=True, exist_ok=True)
            self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o666)
        except OSError as e:
            raise InputError(f"{self.dir}: cannot use as the output directory "
                             f"({e.strerror or e})") from None
        try:    # held until close; the kernel drops it when a killed run's process ends
            fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            self.close()
            raise InputError(f"{self.dir}: another batch run is writing this directory; wait for "
                             "it or choose another --out") from None
        self._sweep_partials()
        self.latest = self._read()
        self._torn_tail = self._ends_mid_line()

    def _sweep_partials(self) -> None:
        """Temporary files of a run that was killed (fileio.atomic_output names them so): no
        other run writes here while we hold the lock, so they are all dead."""
        for tmp in self.dir.glob(".*.partial"):
            tmp.unlink(missing_ok=True)

    def _read(self) -> dict[str, dict]:
        latest = {}
        if self.path.exists():
            for text in self.path.read_text(encoding="utf-8", errors="replace").splitlines():
                try:
                    record = json.loads(text)
                except json.JSONDecodeError:
                    continue  # the torn last line of a killed run: that line is redone
                if isinstance(record, dict) and isinstance(record.get("id"), str):
                    latest[record["id"]] = record
        return latest

    def _ends_mid_line(self) -> bool:
        if self.path.stat().st_size == 0:
            return False
        with open(self.path, "rb") as f:
            f.seek(-1, os.SEEK_END)
            return f.read(1) != b"\n"

    def done(self, line_id: str, key: str) -> bool:
        """Whether a previous run already made this line, as it would be made now."""
        record = self.latest.get(line_id)
        return bool(record and record.get("status") == "ok" and record.get("key") == key
                    and (self.dir / str(record.get("output", ""))).is_file())

    def append(self, record: dict) -> None:
        """One record, as one write, on disk (fsync) before this returns."""
        data = (json.dumps(record, sort_keys=True) + "\n").encode()
        if self._torn_tail:
            data = b"\n" + data
            self._torn_tail = False
        os.write(self._fd, data)
        os.fsync(self._fd)
        self.latest[record["id"]] = record

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
