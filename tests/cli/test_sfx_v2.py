"""`tts` with MOSS-SoundEffect v2.0 (the tiny pipeline through the real converter): no codec,
`--sound` and the diffusion knobs as flags, the file equal to the API's audio; flags it does
not take refused in one line before the model loads."""

import os
import subprocess
import sys

import numpy as np
import pytest
import soundfile as sf

from fixtures.make_soundeffect_v2 import make_tiny_sfx_v2
from moss_tts import load_tts
from moss_tts.cli import main

KNOBS = ("--seconds", 0.7, "--steps", 3, "--seed", 2, "--cfg-scale", 3.0, "--shift", 4.0,
         "--negative", "speech")


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return str(make_tiny_sfx_v2(tmp_path_factory.mktemp("cli_sfx_v2"))["gguf"])


def api(model, **kw):
    from moss_tts.sampling import DiffusionOptions

    with load_tts(model, threads=1) as tts:
        return tts.synthesize(sound="rain on a tin roof", seconds=0.7, steps=3, seed=2,
                              negative="speech",
                              options=DiffusionOptions(cfg_scale=3.0, shift=4.0), **kw)[0]


def test_a_sound_from_the_cli_equals_the_api(model, tmp_path):
    out = tmp_path / "rain.wav"
    r = subprocess.run([sys.executable, "-m", "moss_tts", "tts", "--model", model, "--sound",
                        "rain on a tin roof", *map(str, KNOBS), "--threads", "1",
                        "--sample-format", "f32", "-o", str(out)],
                       capture_output=True, env=dict(os.environ), text=True)
    assert r.returncode == 0, r.stderr
    audio, sr = sf.read(out, dtype="float32", always_2d=True)
    assert sr == 60 and "0.70 s at 60 Hz, mono" in r.stderr
    np.testing.assert_array_equal(audio, api(model))


def test_the_short_latent_flag(model, tmp_path):
    out = tmp_path / "short.wav"
    assert main(["tts", "--model", model, "--sound", "rain on a tin roof", *map(str, KNOBS),
                 "--short-latent", "--threads", "1", "--sample-format", "f32",
                 "-o", str(out)]) == 0
    np.testing.assert_array_equal(sf.read(out, dtype="float32", always_2d=True)[0],
                                  api(model, short_latent=True))


@pytest.mark.parametrize("extra, match", [
    (("--codec", "codec.gguf"), "--codec: MOSS-SoundEffect-v2.0 decodes with its own VAE"),
    (("--greedy",), "--greedy is not a MOSS-SoundEffect-v2.0 option"),
    (("--temperature", "0.5"), "--temperature is not a MOSS-SoundEffect-v2.0 option"),
    (("--seconds", "31"), "--seconds must be at most 30 for MOSS-SoundEffect-v2.0"),
    (("--steps", "1001"), "--steps must be"),
])
def test_a_flag_it_cannot_take_is_one_line(model, tmp_path, capsys, extra, match):
    assert main(["tts", "--model", model, "--sound", "rain", *extra, "-o",
                 str(tmp_path / "x.wav")]) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1 and match in err, err
    assert not (tmp_path / "x.wav").exists()


def test_a_bad_guidance_scale_is_argparses_one_line(model, capsys):
    with pytest.raises(SystemExit) as e:
        main(["tts", "--model", model, "--sound", "rain", "--cfg-scale", "-2", "-o", "x.wav"])
    assert e.value.code == 2
    assert "argument --cfg-scale: must lie in [0, 100], got -2.0" in capsys.readouterr().err


def test_serve_refuses_a_codec_for_it_in_one_line(model, capsys):
    assert main(["serve", "--model", model, "--codec", "codec.gguf", "--port", "0"]) == 1
    err = capsys.readouterr().err
    assert err == ("error: --codec: MOSS-SoundEffect-v2.0 decodes with its own VAE; leave out "
                   f"--codec for --model {model}\n")
