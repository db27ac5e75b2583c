"""The results ledger: one fsync'd append per record, a torn tail tolerated, one run per
directory, and the resume rule (same key and the audio file present)."""

import hashlib
import os

import pytest

from moss_tts.batch.ledger import RESULTS, Ledger, file_sha256, line_key
from moss_tts.batch.manifest import Line
from moss_tts.errors import InputError

LINE = Line(number=1, id="a", text="Hello.", seed=3)


def key(line=LINE, model="m" * 64):
    return line_key(line, model_sha256=model, codec_sha256="c" * 64, suffix=".wav")


def test_a_line_is_done_only_with_its_key_its_status_and_its_file(tmp_path):
    with Ledger(tmp_path) as ledger:
        ledger.append({"id": "a", "status": "ok", "key": key(), "output": "a.wav"})
        assert not ledger.done("a", key())                      # no audio file yet
        (tmp_path / "a.wav").write_bytes(b"RIFF")
        assert ledger.done("a", key())
        assert not ledger.done("a", key(Line(number=1, id="a", text="Hello!", seed=3)))
        assert not ledger.done("a", key(Line(number=1, id="a", text="Hello.", seed=4)))
        assert not ledger.done("a", key(model="n" * 64))
        ledger.append({"id": "a", "status": "failed", "key": key(), "output": None})
        assert not ledger.done("a", key())                      # the last record wins
    with Ledger(tmp_path) as again:                              # and survives a reopen
        assert again.latest["a"]["status"] == "failed"


def test_a_torn_last_record_is_ignored_and_the_next_starts_on_its_own_line(tmp_path):
    with Ledger(tmp_path) as ledger:
        ledger.append({"id": "a", "status": "ok", "key": "k", "output": "a.wav"})
    with open(tmp_path / RESULTS, "ab") as f:
        f.write(b'{"id": "b", "sta')                            # killed mid-write
    with Ledger(tmp_path) as ledger:
        assert set(ledger.latest) == {"a"}
        ledger.append({"id": "c", "status": "ok", "key": "k", "output": "c.wav"})
    with Ledger(tmp_path) as ledger:
        assert set(ledger.latest) == {"a", "c"}


def test_one_run_per_directory(tmp_path):
    with Ledger(tmp_path):
        with pytest.raises(InputError, match="another batch run is writing"):
            Ledger(tmp_path)
    Ledger(tmp_path).close()                                     # free again once closed


def test_opening_sweeps_the_partial_files_of_a_killed_run(tmp_path):
    (tmp_path / ".a.wav.0123456789ab.partial").write_bytes(b"half")
    (tmp_path / "keep.wav").write_bytes(b"whole")
    with Ledger(tmp_path):
        assert sorted(p.name for p in tmp_path.iterdir()) == ["keep.wav", RESULTS]


def test_file_sha256_is_the_files_sha256_and_notices_a_change(tmp_path):
    f = tmp_path / "model.gguf"
    f.write_bytes(b"GGUF" + bytes(range(256)) * 5000)
    assert file_sha256(f) == hashlib.sha256(f.read_bytes()).hexdigest()
    f.write_bytes(b"GGUF" + bytes(10))
    os.utime(f, ns=(1, 1))                                       # a new mtime and size
    assert file_sha256(f) == hashlib.sha256(f.read_bytes()).hexdigest()


def test_an_output_directory_that_is_a_file_is_one_error(tmp_path):
    (tmp_path / "taken").write_text("a file")
    with pytest.raises(InputError, match="taken: cannot use as the output directory"):
        Ledger(tmp_path / "taken")


def test_a_model_is_hashed_once_across_runs_until_its_size_or_mtime_changes(tmp_path):
    """issue 22 #9: every run read the whole model again to hash it. A fresh process (a
    rerun) must take the hash from the user cache while path, size and mtime are the same —
    shown by rewriting the bytes behind an unchanged size and mtime — and hash again once
    the mtime moves."""
    import subprocess
    import sys

    def in_a_new_process():
        return subprocess.run([sys.executable, "-c", "import sys; from moss_tts.batch.ledger "
                               "import file_sha256; print(file_sha256(sys.argv[1]))", str(f)],
                              capture_output=True, text=True, check=True).stdout.strip()

    f = tmp_path / "model.gguf"
    f.write_bytes(b"GGUF" + bytes(range(256)) * 5000)
    first = hashlib.sha256(f.read_bytes()).hexdigest()
    assert file_sha256(f) == first
    stamp = f.stat().st_mtime_ns
    f.write_bytes(b"GGUF" + bytes(reversed(range(256))) * 5000)     # same size
    os.utime(f, ns=(stamp, stamp))
    assert in_a_new_process() == first                               # not read again
    os.utime(f, ns=(stamp + 10**9, stamp + 10**9))
    assert in_a_new_process() == hashlib.sha256(f.read_bytes()).hexdigest() != first
