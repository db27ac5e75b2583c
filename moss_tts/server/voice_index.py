"""The speech server's index of stored voices: name → what `GET /v1/audio/voices` lists (codec,
frames, source), read once and then only where a file changed (reading all of 1,271 voices took
0.7 s a listing). Files that `voice add` / `voice remove` change from another process show at the
next listing: each moves the directory's mtime, and a directory changed within RACY_SECONDS of a
scan is scanned again (a second change in the same mtime tick would not move it: git's "racily
clean"). Every method does file work: routes call them in a thread, model workers directly."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

from ..voices import add_voice, remove_voice, voice_info, voice_of, voices_dir
from .request import RequestError

RACY_SECONDS = 2.0       # a directory changed this recently may change again unseen


class VoiceIndex:
    """The voices under `root` (None: the user's voices directory), at most `limit` of them
    stored through the server (serve --max-voices)."""

    def __init__(self, root, limit: int):
        self.root = Path(root) if root else voices_dir()
        self.limit = limit
        self._lock = threading.Lock()        # the routes' threads and the model workers
        self._stamp: int | None = None       # the directory's mtime at the last full scan
        self._signatures: dict[str, tuple] = {}   # voice → its files' (name, inode, mtime, size)
        self._entries: dict[str, dict] = {}       # voice → its listing entry

    def listing(self) -> list[dict]:
        """Every stored voice, by name, as `voices.list_voices` gives them."""
        with self._lock:
            self._refresh()
            return [self._entries[name] for name in sorted(self._entries)]

    def known(self, name: str) -> bool:
        with self._lock:
            self._refresh()
            return name in self._entries

    def check_room(self, name: str) -> None:
        """A 409 when `limit` voices are stored or `name` is taken (checked before an upload
        is decoded)."""
        with self._lock:
            self._refresh()
            self._need_room(name)

    def add(self, name: str, codes, info: dict) -> None:
        """Stores a voice (voices.add_voice) if there is room and the name is free; the checks
        and the write are one step, so two uploads racing for the last place (or one name)
        cannot both take it."""
        with self._lock:
            self._refresh()
            self._need_room(name)
            add_voice(name, codes, info, root=self.root)
            self._stamp = None

    def remove(self, name: str) -> None:
        with self._lock:
            remove_voice(name, root=self.root)
            self._stamp = None

    def _need_room(self, name: str) -> None:
        if name in self._entries:     # voices.add_voice would say `--force`: a CLI flag
            raise RequestError(409, f"voice {name!r} exists; delete it first (DELETE "
                                    f"/v1/audio/voices/{name})")
        if len(self._entries) >= self.limit:
            raise RequestError(409, f"the server stores at most {self.limit} voices (serve "
                                    "--max-voices); delete one first (DELETE "
                                    "/v1/audio/voices/NAME)")

    def _refresh(self) -> None:
        """Re-reads what changed since the last scan (the lock is held)."""
        try:
            stamp = os.stat(self.root).st_mtime_ns
        except FileNotFoundError:
            self._stamp, self._signatures, self._entries = None, {}, {}
            return
        if stamp == self._stamp:
            return
        files: dict[str, list] = {}
        with os.scandir(self.root) as entries:
            for entry in entries:
                stem = voice_of(entry.name) or (entry.name[:-len(".json")]
                                                if entry.name.endswith(".json") else None)
                if stem is None:         # NAME.json holds an older voice's info
                    continue
                try:
                    st = entry.stat()
                except FileNotFoundError:   # removed since the directory was read
                    continue
                files.setdefault(stem, []).append(
                    (entry.name, st.st_ino, st.st_mtime_ns, st.st_size))
        signatures = {name: tuple(sorted(f)) for name, f in files.items()
                      if any(voice_of(file[0]) for file in f)}
        self._entries = {name: self._entries[name] if self._signatures.get(name) == signature
                         else {"name": name, **voice_info(name, self.root)}
                         for name, signature in signatures.items()}
        self._signatures = signatures
        racy = time.time() - stamp / 1e9 < RACY_SECONDS
        self._stamp = None if racy else stamp
