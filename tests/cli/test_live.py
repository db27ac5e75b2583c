"""`python -m moss_tts tts --live`: text piped on stdin is spoken as it arrives by the tiny
MOSS-TTS-Realtime model — the audio equals offline generation over the same text (greedy), the
first audio leaves before stdin ends, and misuse is one line."""

import os
import select
import subprocess
import sys
import time

import numpy as np
import pytest
import soundfile as sf

from moss_tts.models.realtime_tts import RealtimeTTS
from moss_tts.sampling import RealtimeSamplingOptions
from tests.server.helpers import tiny_model_files, tiny_realtime_files

TEXT = "Hello there, this is a live test. It speaks as the text arrives, word by word!"
GREEDY = RealtimeSamplingOptions(do_sample=False)


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    d = tmp_path_factory.mktemp("cli_live")
    realtime, codec = tiny_realtime_files(d)
    nano, nano_codec = tiny_model_files(d)
    with RealtimeTTS.load(realtime, codec=codec, threads=1) as tts:
        # a frame a push, as a live session pushes (whole audio pushes 8: chunk_ladder.py)
        offline, _ = tts.synthesize(TEXT, options=GREEDY, chunk_frames=1)
    return {"realtime": realtime, "codec": codec, "nano": nano, "nano_codec": nano_codec,
            "offline": offline}


def live_args(models, *extra):
    return [sys.executable, "-m", "moss_tts", "tts", "--live", "--model", models["realtime"],
            "--codec", models["codec"], "--greedy", "--sample-format", "f32", "--threads", "1",
            *map(str, extra)]


def test_live_stdin_to_a_file_equals_offline_greedy(models, tmp_path):
    out = tmp_path / "live.wav"
    r = subprocess.run(live_args(models, "-o", out), input=TEXT.encode(), capture_output=True)
    assert r.returncode == 0, r.stderr
    audio, sr = sf.read(out, dtype="float32", always_2d=True)
    assert sr == 3200 and len(audio) > 0
    np.testing.assert_array_equal(audio, models["offline"])
    # sensitivity: other text speaks differently
    r = subprocess.run(live_args(models, "-o", out), input=TEXT[:40].encode(), capture_output=True)
    assert r.returncode == 0, r.stderr
    assert not np.array_equal(sf.read(out, dtype="float32", always_2d=True)[0],
                              models["offline"])


def test_live_max_frames_caps_the_turn(models, tmp_path):
    out = tmp_path / "capped.wav"
    r = subprocess.run(live_args(models, "--max-frames", 5, "-o", out), input=TEXT.encode(),
                       capture_output=True)
    assert r.returncode == 0, r.stderr
    audio = sf.read(out, dtype="float32", always_2d=True)[0]
    hop = 64           # the tiny v1 codec's samples per frame
    assert len(audio) == 5 * hop and len(models["offline"]) > 5 * hop
    np.testing.assert_array_equal(audio, models["offline"][: 5 * hop])


def test_live_audio_leaves_while_stdin_is_still_open(models):
    p = subprocess.Popen(live_args(models, "-o", "-", "--format", "raw"), stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        first, rest = TEXT[:60], TEXT[60:]
        p.stdin.write(first.encode())
        p.stdin.flush()
        early = b""
        deadline = time.time() + 120
        while not early and time.time() < deadline:   # stdin stays open meanwhile
            if select.select([p.stdout], [], [], 0.5)[0]:
                early = os.read(p.stdout.fileno(), 1 << 16)
            assert p.poll() is None, p.stderr.read()
        assert early, "no audio before the end of stdin"
        p.stdin.write(rest.encode())
        p.stdin.close()
        tail = p.stdout.read()
        assert p.wait(60) == 0, p.stderr.read()
    finally:
        p.kill()
        p.wait()
    audio = np.frombuffer(early + tail, "<f4").reshape(-1, 1)
    np.testing.assert_array_equal(audio, models["offline"])


def test_live_with_a_family_without_live_mode_is_one_line(models, tmp_path):
    r = subprocess.run([sys.executable, "-m", "moss_tts", "tts", "--live", "--model",
                        models["nano"], "--codec", models["nano_codec"], "-o",
                        tmp_path / "x.wav"], input=b"Hi.", capture_output=True)
    assert r.returncode != 0 and not (tmp_path / "x.wav").exists()
    lines = r.stderr.decode().strip().splitlines()
    assert len(lines) == 1 and "--live needs a MOSS-TTS-Realtime model" in lines[0], lines


@pytest.mark.parametrize("extra, stdin, problem", [
    (("--text", "Hi."), b"", "leave out --text/--text-file"),
    ((), b"Hello \xff there", "stdin: not UTF-8 text"),
])
def test_live_misuse_is_one_line_and_writes_nothing(models, tmp_path, extra, stdin, problem):
    out = tmp_path / "x.wav"
    r = subprocess.run(live_args(models, *extra, "-o", out), input=stdin, capture_output=True)
    assert r.returncode != 0 and not out.exists()
    lines = r.stderr.decode().strip().splitlines()
    assert len(lines) == 1 and problem in lines[0], lines
