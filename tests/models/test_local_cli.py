"""MossTTSLocal through the user-facing routes: `python -m moss_tts tts` picks the family from
the GGUF (same audio as the Python API for the same seed, Delay's prompt fields accepted,
Nano/Delay-only flags refused in one line), `serve` answers with it, and `convert local`."""

import io
import os
import subprocess
import sys
from types import SimpleNamespace

import numpy as np
import pytest
import soundfile as sf

from fixtures.make_delay import SAMPLE_RATE
from fixtures.make_local import make_tiny_local_checkpoint
from moss_tts.cli.serve import load_models
from moss_tts.models.local_tts import LocalTTS
from moss_tts.sampling import LocalSamplingOptions
from moss_tts.server import create_app
from tests.server.helpers import Served, call, settings

TEXT = "Hello there."


@pytest.fixture(scope="module")
def files(tmp_path_factory, v1_codec_gguf):
    d = tmp_path_factory.mktemp("local_cli")
    ckpt = make_tiny_local_checkpoint(d / "hf", seed=1, speech=True)
    r = cli("convert", "local", "--model", ckpt, "--out", d / "local.gguf", "--strict")
    assert r.returncode == 0, r.stderr
    return SimpleNamespace(dir=d, model=d / "local.gguf", codec=v1_codec_gguf)


def cli(*args):
    return subprocess.run([sys.executable, "-m", "moss_tts", *map(str, args)],
                          capture_output=True, env=dict(os.environ))


def test_tts_command_equals_the_api(files, tmp_path):
    out = tmp_path / "l.wav"
    r = cli("tts", "--model", files.model, "--codec", files.codec, "--text", TEXT, "--seed", 7,
            "--max-frames", 8, "--language", "English", "--threads", 1, "--sample-format", "f32",
            "-o", out)
    assert r.returncode == 0, r.stderr
    audio, sr = sf.read(out, dtype="float32", always_2d=True)
    with LocalTTS.load(files.model, codec=files.codec, threads=1) as tts:
        want, _ = tts.synthesize(TEXT, options=LocalSamplingOptions(), seed=7, max_frames=8,
                                 language="English")
    assert sr == SAMPLE_RATE and audio.shape[1] == 1 and len(audio) > 0
    # the CLI chunks by the clock-driven ladder, the API call too: equal to f32 kernel order
    np.testing.assert_allclose(audio, want, atol=1e-5)


def test_n_vq_flag_reaches_the_model(files, tmp_path):
    out = tmp_path / "n.wav"
    r = cli("tts", "--model", files.model, "--codec", files.codec, "--text", TEXT, "--seed", 7,
            "--max-frames", 6, "--n-vq", 2, "--threads", 1, "--sample-format", "f32", "-o", out)
    assert r.returncode == 0, r.stderr
    audio, _ = sf.read(out, dtype="float32", always_2d=True)
    with LocalTTS.load(files.model, codec=files.codec, threads=1) as tts:
        want, _ = tts.synthesize(TEXT, seed=7, max_frames=6, n_vq_for_inference=2)
        full, _ = tts.synthesize(TEXT, seed=7, max_frames=6)
    np.testing.assert_allclose(audio, want, atol=1e-5)
    assert full.shape != want.shape or not np.allclose(full, want, atol=1e-5)
    r = cli("tts", "--model", files.model, "--codec", files.codec, "--text", TEXT, "--n-vq", 9,
            "-o", tmp_path / "bad.wav")
    # issue 22 #10: the error names the flag, not the API parameter n_vq_for_inference
    assert r.returncode == 1 and r.stderr.decode() == \
        "error: --n-vq must be a whole number in 1..4, got 9\n"


@pytest.mark.parametrize("flag", [["--max-new-rows", "5"],
                                  ["--voice-clone-max-text-tokens", "20"]])
def test_another_familys_flag_is_refused_in_one_line(files, flag, tmp_path):
    r = cli("tts", "--model", files.model, "--codec", files.codec, "--text", TEXT, *flag,
            "-o", tmp_path / "x.wav")
    err = r.stderr.decode().strip()
    assert r.returncode != 0 and "\n" not in err
    assert "is not a MOSS-TTS-Local-Transformer option" in err
    assert not (tmp_path / "x.wav").exists()


def test_serve_answers_with_the_local_model(files):
    models = load_models(SimpleNamespace(model=[str(files.model)], codec=[str(files.codec)],
                                         backend="cpu", threads=1))
    assert list(models) == ["moss-tts-local"]
    s = Served(create_app(models, settings(files.dir / "voices")))
    try:
        status, _, body = call(s.url, "/v1/audio/speech", {
            "model": "moss-tts-local", "input": TEXT, "seed": 7, "max_new_frames": 6,
            "response_format": "wav"})
        assert status == 200, body
        audio, sr = sf.read(io.BytesIO(body), dtype="float32", always_2d=True)
        assert sr == SAMPLE_RATE and 0 < len(audio) <= 6 * 64
    finally:
        s.stop()
        for tts in models.values():
            tts.close()
