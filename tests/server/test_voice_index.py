"""Stored voices behind the server (issue 23, the server's hole 2): listed from an index, read
off the event loop, kept up to date with files another process adds or removes, and capped by
`--max-voices`. Real uvicorn on loopback, a stub model; voice files are real `.voice.npz`
files written as `voice add` writes them. File reads are seen by wrapping `numpy.load`, through
which every voice file is read."""

import json
import threading

import numpy as np

from moss_tts.voices import add_voice, remove_voice
from tests.server.helpers import call, silent_wav_b64

MANY = 300       # voices in the directory: enough that reading them all is real work
GUARD_SECONDS = 20
INFO = {"variant": "stub", "sample_rate": 1600, "codebooks": 4, "source": "test"}


def store(root, names):
    for name in names:
        add_voice(name, np.zeros((5, 2), np.int32), INFO, root=root)


class VoiceReads:
    """numpy.load, counting the voice files it opens under `root`; with `hold`, the first such
    read waits until the test sets `release` (and sets `reading` as it starts waiting)."""

    def __init__(self, monkeypatch, root, hold=False):
        self.root, self.hold, self.count = str(root), hold, 0
        self.reading, self.release = threading.Event(), threading.Event()
        real = np.load

        def load(path, *args, **kwargs):
            if str(path).startswith(self.root):
                self.count += 1
                if self.hold and not self.reading.is_set():
                    self.reading.set()
                    assert self.release.wait(GUARD_SECONDS), "the test never released the read"
            return real(path, *args, **kwargs)
        monkeypatch.setattr(np, "load", load)


def names(s) -> list[str]:
    status, _, body = call(s.url, "/v1/audio/voices")
    assert status == 200
    return [v["name"] for v in json.loads(body)["voices"]]


def test_health_is_answered_while_a_listing_reads_voice_files(serve, tmp_path, monkeypatch):
    """Progress, not time: a listing is held inside its first file read, and /health is
    answered meanwhile (with the read on the event loop it waited for the listing)."""
    root = tmp_path / "voices"
    store(root, [f"v{i:03d}" for i in range(MANY)])
    s = serve()
    reads = VoiceReads(monkeypatch, root, hold=True)
    listing = {}
    lister = threading.Thread(target=lambda: listing.setdefault("names", names(s)))
    lister.start()
    try:
        assert reads.reading.wait(GUARD_SECONDS)
        assert call(s.url, "/health", timeout=GUARD_SECONDS)[0] == 200
        assert "names" not in listing          # the listing is still held in its read
    finally:
        reads.release.set()
        lister.join(GUARD_SECONDS)
    assert listing["names"] == [f"v{i:03d}" for i in range(MANY)]


def test_voice_files_are_read_once_not_per_listing_or_speech(serve, tmp_path, monkeypatch):
    root = tmp_path / "voices"
    store(root, [f"v{i:03d}" for i in range(MANY)])
    s = serve()
    reads = VoiceReads(monkeypatch, root)
    assert len(names(s)) == MANY and reads.count == MANY       # the first listing reads each
    assert len(names(s)) == MANY
    speech = {"input": "hi", "voice": "alloy", "response_format": "pcm"}   # not a stored voice
    assert call(s.url, "/v1/audio/speech", speech)[0] == 200
    assert reads.count == MANY                                  # nothing read again


def test_the_listing_follows_voices_another_process_adds_and_removes(serve, tmp_path,
                                                                     monkeypatch):
    """`voice add` / `voice remove` beside the running server (the same functions, another
    writer): seen at the next listing, at once (within the directory's mtime tick too), and
    only the changed file is read."""
    root = tmp_path / "voices"
    store(root, ["alice", "bob"])
    s = serve()
    assert names(s) == ["alice", "bob"]
    reads = VoiceReads(monkeypatch, root)
    store(root, ["carol"])
    assert names(s) == ["alice", "bob", "carol"] and reads.count == 1
    remove_voice("alice", root=root)
    add_voice("bob", np.zeros((9, 2), np.int32), INFO, root=root, overwrite=True)
    status, _, body = call(s.url, "/v1/audio/voices")
    voices = {v["name"]: v for v in json.loads(body)["voices"]}
    assert sorted(voices) == ["bob", "carol"] and voices["bob"]["frames"] == 9


def test_uploads_past_max_voices_are_409_until_one_is_deleted(serve, tmp_path):
    s = serve(max_voices=2)
    store(tmp_path / "voices", ["stored"])          # one already there (voice add)
    upload = {"name": "first", "audio": silent_wav_b64(0.2)}
    assert call(s.url, "/v1/audio/voices", upload)[0] == 201
    status, _, body = call(s.url, "/v1/audio/voices", upload | {"name": "second"})
    assert status == 409 and "--max-voices" in json.loads(body)["error"]["message"]
    assert names(s) == ["first", "stored"]
    assert call(s.url, "/v1/audio/voices/stored", method="DELETE")[0] == 200
    assert call(s.url, "/v1/audio/voices", upload | {"name": "second"})[0] == 201
    assert names(s) == ["first", "second"]
