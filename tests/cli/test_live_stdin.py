"""`tts --live` reads stdin as it arrives (cli/tts.py `stdin_deltas`): a pipe from a language
model may run for ever, so the reader keeps a count of the bytes it has read, never the bytes
themselves — its memory stays the same however much text goes through (measured with
tracemalloc, never by time) — and a byte that is not UTF-8 is still named by its offset in the
whole input, as the whole input decoded at once names it, wherever the reads cut it."""

import os
import tracemalloc

import pytest

from moss_tts.cli import tts as tts_cli
from moss_tts.cli.common import utf8
from moss_tts.errors import InputError

# ASCII and two-, three- and four-byte characters, so reads cut inside characters
TEXT = "Hello wörld, 你好, 🙂 — a live text from a language model. ".encode()
PIPED = 8 * 2**20        # bytes fed through in the memory test
HELD = 256 * 2**10       # what the reader may hold at its peak: a few reads, not the input


def fd_holding(tmp_path, data: bytes) -> int:
    path = tmp_path / "stdin"
    path.write_bytes(data)
    return os.open(path, os.O_RDONLY)


def read_all(fd: int) -> int:
    """Every delta of `fd`, dropped as it comes → the characters read."""
    try:
        return sum(len(text) for text in tts_cli.stdin_deltas(fd))
    finally:
        os.close(fd)


def whole_input_message(data: bytes) -> str:
    """The error the whole input decoded at once gives (what the old reader, keeping it all,
    reported)."""
    with pytest.raises(InputError) as e:
        utf8(data, "stdin")
    return str(e.value)


def test_the_reader_holds_a_few_reads_however_much_text_goes_through(tmp_path):
    data = TEXT * (PIPED // len(TEXT))
    fd = fd_holding(tmp_path, data)
    tracemalloc.start()
    try:
        chars = read_all(fd)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert chars == len(data.decode())
    assert peak < HELD, f"the reader held {peak} bytes reading {len(data)}"


@pytest.mark.parametrize("read_bytes", [1, 2, 3, 4096])
@pytest.mark.parametrize("bad", [
    b"\xff",                 # never UTF-8
    b"\xe4\xbd",             # a three-byte character cut short, then more text
    b"\xf0\x9f\x99A",        # a four-byte character whose last byte is not a continuation
], ids=["invalid", "cut-short", "bad-continuation"])
def test_a_bad_byte_is_named_by_its_offset_in_the_whole_input(tmp_path, monkeypatch,
                                                               read_bytes, bad):
    monkeypatch.setattr(tts_cli, "READ_BYTES", read_bytes)   # reads cut in every place
    data = TEXT * 3 + b"ok " + bad + b" and more" + TEXT
    with pytest.raises(InputError) as e:
        read_all(fd_holding(tmp_path, data))
    assert str(e.value) == whole_input_message(data)
    assert f"byte {len(TEXT) * 3 + 3}:" in str(e.value)


@pytest.mark.parametrize("read_bytes", [1, 4096])
def test_a_character_cut_short_at_the_end_is_named_by_its_offset(tmp_path, monkeypatch,
                                                                 read_bytes):
    monkeypatch.setattr(tts_cli, "READ_BYTES", read_bytes)
    data = TEXT * 200 + b"\xf0\x9f\x99"
    with pytest.raises(InputError) as e:
        read_all(fd_holding(tmp_path, data))
    assert str(e.value) == whole_input_message(data)
    assert f"byte {len(TEXT) * 200}:" in str(e.value)


def test_a_bad_byte_after_megabytes_is_named_by_its_offset(tmp_path):
    data = TEXT * (PIPED // len(TEXT)) + b"\xc3("
    with pytest.raises(InputError) as e:
        read_all(fd_holding(tmp_path, data))
    assert f"byte {len(data) - 2}: b'\\xc3'" in str(e.value)
