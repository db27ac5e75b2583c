"""`python -m moss_tts tts` with a MOSS-TTS-Local-Transformer-v1.5 GGUF (tiny model, tiny v2
stereo codec): the family read from the file, the same audio as the Python API for the same
seed, its own flags (language, duration, continuation, --max-frames) reaching the model, and
other families' flags refused in one line."""

import os
import subprocess
import sys

import numpy as np
import pytest
import soundfile as sf

from converters.local_v15 import convert
from fixtures.make_local_v15 import SAMPLE_RATE, make_tiny_local_v15_checkpoint
from moss_tts.cli import main
from moss_tts.models.local_v15_tts import LocalV15TTS
from moss_tts.sampling import LocalV15SamplingOptions

TEXT = "Hello there."


@pytest.fixture(scope="module")
def files(tmp_path_factory, tiny_codec):
    d = tmp_path_factory.mktemp("cli_local_v15")
    ckpt = make_tiny_local_v15_checkpoint(d / "hf", continue_bias=6.0)
    return (convert(str(ckpt), d / "m.gguf", strict=True),
            tiny_codec("v2"))


def cli(*args):
    return subprocess.run([sys.executable, "-m", "moss_tts", *map(str, args)],
                          capture_output=True, env=dict(os.environ))


def test_tts_speaks_local_v15_as_the_api_does(files, tmp_path):
    model, codec = files
    prompt = tmp_path / "prompt.wav"
    rng = np.random.default_rng(0)
    sf.write(prompt, (0.2 * rng.standard_normal((10 * 32, 2))).astype(np.float32), SAMPLE_RATE,
             subtype="FLOAT")
    out = tmp_path / "o.wav"
    r = cli("tts", "--model", model, "--codec", codec, "--text", TEXT, "--seed", 3,
            "--max-frames", 7, "--language", "en", "--seconds", 0.2, "--prompt-audio", prompt,
            "--prompt-text", "Earlier.", "--temperature", 1.1, "--threads", 1,
            "--sample-format", "f32", "-o", out)
    assert r.returncode == 0, r.stderr
    audio, sr = sf.read(out, dtype="float32", always_2d=True)
    with LocalV15TTS.load(model, codec=codec, threads=1) as tts:
        voice = tts.encode_reference(*sf.read(prompt, dtype="float32"), max_seconds=None)
        want, _ = tts.synthesize(TEXT, prompt=voice, prompt_text="Earlier.", seed=3,
                                 max_frames=7, language="en", seconds=0.2,
                                 options=LocalV15SamplingOptions(audio_temperature=1.1))
    assert sr == SAMPLE_RATE and audio.shape == (7 * 32, 2)
    # the command streams (adaptive chunks), synthesize() pushes 8 frames at a time: the same
    # frames, decoded up to the codec's f32 order
    np.testing.assert_allclose(audio, want, atol=1e-5, rtol=0)


@pytest.mark.parametrize("flag, value", [("--max-new-rows", 5),
                                         ("--voice-clone-max-text-tokens", 5)])
def test_another_familys_flag_is_refused_in_one_line(files, tmp_path, capsys, flag, value):
    model, codec = files
    assert main(["tts", "--model", str(model), "--codec", str(codec), "--text", "hi", flag,
                 str(value), "-o", str(tmp_path / "x.wav")]) != 0
    err = capsys.readouterr().err.strip()
    assert f"{flag} is not a MOSS-TTS-Local-Transformer-v1.5 option" in err and "\n" not in err
    assert not (tmp_path / "x.wav").exists()
