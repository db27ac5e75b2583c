"""moss_tts/voices.py: a voice is stored as one unit (codes + info), so concurrent writers of one
name never leave one writer's codes with another's info, and never crash each other."""

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from moss_tts.errors import InputError
from moss_tts.voices import add_voice, list_voices, load_voice, remove_voice

REPO = Path(__file__).resolve().parents[1]
ITERATIONS = 150

# Each writer stores `ITERATIONS` versions of voice "v" tagged (writer, i) in both the codes and
# the info, and after each write checks that what it reads back is one consistent version.
WRITER = textwrap.dedent("""
    import sys
    import numpy as np
    from moss_tts.voices import add_voice, load_voice
    root, writer, n = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    mixed = 0
    for i in range(n):
        tag = writer * 100000 + i
        add_voice("v", np.full((5 + writer, 4), tag, np.int32), {"tag": tag}, root=root,
                  overwrite=True)
        codes, info = load_voice("v", root=root)
        codes = codes.codes
        mixed += int(codes[0, 0] != info["tag"] or codes.shape[0] != info["frames"])
    print("MIXED", mixed)
""")


def test_concurrent_overwrites_keep_codes_and_info_together(tmp_path):
    procs = [subprocess.Popen([sys.executable, "-c", WRITER, str(tmp_path), str(w),
                               str(ITERATIONS)], cwd=REPO, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for w in (1, 2)]
    results = [p.communicate(timeout=120) for p in procs]
    for p, (out, err) in zip(procs, results):
        assert p.returncode == 0, f"a writer crashed: {err.strip().splitlines()[-1:]}"
        assert out.split() == ["MIXED", "0"], out
    voice, info = load_voice("v", root=tmp_path)
    codes = voice.codes
    assert info["tag"] in (100000 + ITERATIONS - 1, 200000 + ITERATIONS - 1)
    assert (codes == info["tag"]).all() and codes.shape[0] == info["frames"]
    assert [p.name for p in tmp_path.iterdir()] == ["v.voice.npz"]   # no temp file left


def test_round_trip_list_and_remove(tmp_path):
    codes = np.arange(12, dtype=np.int32).reshape(3, 4)
    add_voice("alice", codes, {"source": "a.wav"}, root=tmp_path)
    got, info = load_voice("alice", root=tmp_path)
    np.testing.assert_array_equal(got.codes, codes)
    assert got.name == "alice" and got.codec is None     # stored without its codec
    assert info == {"source": "a.wav", "frames": 3, "n_vq": 4}
    assert list_voices(tmp_path) == [{"name": "alice", **info}]
    with pytest.raises(InputError, match="exists"):
        add_voice("alice", codes, {}, root=tmp_path)
    remove_voice("alice", root=tmp_path)
    assert list_voices(tmp_path) == []
    with pytest.raises(InputError, match="no voice named 'alice'"):
        load_voice("alice", root=tmp_path)


def test_voices_stored_as_npy_and_json_still_load_and_are_replaced_whole(tmp_path):
    # the layout before one-file voices: NAME.npy (codes) + NAME.json (info)
    np.save(tmp_path / "old.npy", np.ones((2, 3), np.int32))
    (tmp_path / "old.json").write_text(json.dumps({"frames": 2, "n_vq": 3, "source": "x"}))
    voice, info = load_voice("old", root=tmp_path)
    assert voice.codes.shape == (2, 3) and info["source"] == "x"
    assert [v["name"] for v in list_voices(tmp_path)] == ["old"]
    with pytest.raises(InputError, match="exists"):
        add_voice("old", np.zeros((4, 3), np.int32), {}, root=tmp_path)
    add_voice("old", np.zeros((4, 3), np.int32), {"source": "y"}, root=tmp_path, overwrite=True)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["old.voice.npz"]
    assert load_voice("old", root=tmp_path)[1]["source"] == "y"


def test_a_damaged_voice_file_is_a_one_line_error(tmp_path):
    (tmp_path / "bad.voice.npz").write_bytes(b"PK\x03\x04 not really a zip")
    with pytest.raises(InputError, match="voice 'bad' is unreadable"):
        load_voice("bad", root=tmp_path)
    assert list_voices(tmp_path) == [{"name": "bad"}]
