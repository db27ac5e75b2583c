"""`python -m moss_tts tts --model realtime.gguf`: the family comes from the GGUF kind; the
audio is the Python API's for the same options and seed; --greedy and --max-frames reach the
model; another family's flag is refused in one line."""

import os
import subprocess
import sys

import numpy as np
import pytest
import soundfile as sf

from converters.realtime import convert as convert_realtime
from fixtures.make_realtime import SAMPLE_RATE, make_tiny_realtime_checkpoint
from moss_tts.models.realtime_tts import RealtimeTTS
from moss_tts.sampling import RealtimeSamplingOptions

TEXT = "Hello there, quick brown foxes jump."


@pytest.fixture(scope="module")
def models(tmp_path_factory, tiny_codec):
    d = tmp_path_factory.mktemp("tts_realtime")
    ckpt = make_tiny_realtime_checkpoint(d / "rt", seed=0, steer=True)
    return (convert_realtime(str(ckpt), d / "rt.gguf", strict=True),
            tiny_codec())


def cli(models, *extra):
    return subprocess.run([sys.executable, "-m", "moss_tts", "tts", "--model", models[0],
                           "--codec", models[1], "--text", TEXT, "--threads", "1",
                           "--sample-format", "f32", *map(str, extra)],
                          capture_output=True, env=dict(os.environ))


@pytest.mark.parametrize("flags, options, max_frames", [
    (("--seed", 7), RealtimeSamplingOptions(), 1000),
    (("--greedy", "--max-frames", 6), RealtimeSamplingOptions(do_sample=False), 6),
], ids=["sampled", "greedy_capped"])
def test_realtime_through_tts_equals_the_api(models, tmp_path, flags, options, max_frames):
    out = tmp_path / "r.wav"
    r = cli(models, *flags, "-o", out)
    assert r.returncode == 0, r.stderr
    audio, sr = sf.read(out, dtype="float32", always_2d=True)
    seed = 7 if "--seed" in flags else None
    with RealtimeTTS.load(models[0], codec=models[1], threads=1) as tts:
        want, _ = tts.synthesize(TEXT, options=options, seed=seed, max_frames=max_frames)
    assert sr == SAMPLE_RATE and audio.shape[1] == 1 and len(audio) > 0
    np.testing.assert_array_equal(audio, want)
    if max_frames == 6:
        assert len(audio) == 6 * 64


def test_another_familys_flag_is_refused_in_one_line(models, tmp_path):
    r = cli(models, "--language", "en", "-o", tmp_path / "x.wav")
    err = r.stderr.decode().strip()
    assert r.returncode != 0 and "\n" not in err
    assert "--language is not a MOSS-TTS-Realtime option" in err
