"""moss_tts/fileio.py: every output file (WAV, FLAC, codes .npy, GGUF, voice) is created with the
mode a plain `open(path, "w")` gives under the umask, atomically, under a unique temp name."""

import os
import stat

import numpy as np
import pytest

from converters.gguf_io import write_gguf
from moss_tts.audio import write_audio
from moss_tts.codec.io import save_codes
from moss_tts.fileio import atomic_output
from moss_tts.voices import add_voice

WRITERS = {
    "wav": lambda d: write_audio(d / "a.wav", np.zeros((64, 2), np.float32), 16000),
    "flac": lambda d: write_audio(d / "a.flac", np.zeros((64, 1), np.float32), 16000),
    "npy": lambda d: save_codes(d / "c.npy", np.zeros((2, 3), np.int32)),
    "gguf": lambda d: write_gguf(d / "m.gguf", {"w": np.ones(4, np.float32)}, {}, kind="codec",
                                 version=1),
    "voice": lambda d: add_voice("bob", np.zeros((3, 2), np.int32), {}, root=d / "voices"),
}


@pytest.fixture
def umask():
    """Set the process umask for one test (os.umask is process-wide; pytest runs serially)."""
    old = os.umask(0o022)
    yield os.umask
    os.umask(old)


@pytest.mark.parametrize("mask", [0o022, 0o077, 0o002])
@pytest.mark.parametrize("kind", list(WRITERS))
def test_output_files_get_the_mode_a_plain_write_gets(tmp_path, umask, kind, mask):
    umask(mask)
    path = WRITERS[kind](tmp_path)
    plain = tmp_path / "plain"
    plain.write_bytes(b"")   # what the same process gets from an ordinary file write
    want = stat.S_IMODE(plain.stat().st_mode)
    assert want == 0o666 & ~mask
    assert stat.S_IMODE(path.stat().st_mode) == want, f"{kind}: {oct(path.stat().st_mode)}"
    assert not [p for p in path.parent.iterdir() if p.name.endswith(".partial")]


def test_atomic_output_leaves_nothing_on_failure_and_keeps_the_old_file(tmp_path):
    target = tmp_path / "out.bin"
    target.write_bytes(b"old")
    with pytest.raises(RuntimeError):
        with atomic_output(target) as tmp:
            tmp.write_bytes(b"half")
            raise RuntimeError("writer failed")
    assert target.read_bytes() == b"old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.bin"]


def test_atomic_output_gives_concurrent_writers_distinct_temp_files(tmp_path):
    target = tmp_path / "out.bin"
    with atomic_output(target) as a, atomic_output(target) as b:
        assert a != b and a.exists() and b.exists()
        a.write_bytes(b"a")
        b.write_bytes(b"b")
    assert target.read_bytes() == b"a"   # the last rename (the outer block) wins, whole


@pytest.mark.parametrize("kind", list(WRITERS))
def test_every_writer_writes_through_a_symlink(tmp_path, kind):
    """issue 22 #10: the rename replaced a symlink at the output path by a plain file; like
    open(path, "w"), a writer must put the new file where the link points, and keep the link."""
    probe = WRITERS[kind](tmp_path / "probe")         # where this writer puts its file
    name = probe.relative_to(tmp_path / "probe")
    link = tmp_path / "w" / name
    link.parent.mkdir(parents=True)
    target = tmp_path / "elsewhere" / "target"   # not there yet: a voice is never overwritten
    target.parent.mkdir()
    link.symlink_to(target)
    WRITERS[kind](tmp_path / "w")
    assert link.is_symlink() and os.readlink(link) == str(target)
    assert target.stat().st_size == probe.stat().st_size
    leftovers = [p.name for d in (link.parent, target.parent) for p in d.iterdir()
                 if p.name.endswith(".partial")]
    assert not leftovers
